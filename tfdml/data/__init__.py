"""tfdml.data: the P x K batch sampler, image augmentation and the `DatasetSplit` contract.

* `pk_batches(source, P, K, ...)`: a lazy, seeded ``tf.data`` pipeline of P x K batches.
* `PKSampler`: the index sampler behind it (epochs, small classes, determinism).
* `eval_batches(source, batch_size, ...)`: every example once, in order (test splits).
* `tfdml.data.augment`: resize / crop / flip / pad-crop / bounding-box crop and the
  normalization of Keras Applications backbones, as ``tf.data`` map functions.
* `DatasetSplit`: what the data set readers return.
"""

from tfdml._tensorflow import tf  # noqa: F401  (a clear ImportError without it)
from tfdml.data import augment
from tfdml.data.sampler import PKSampler, eval_batches, pk_batches
from tfdml.data.source import DatasetSplit

__all__ = ["DatasetSplit", "PKSampler", "augment", "eval_batches", "pk_batches"]
