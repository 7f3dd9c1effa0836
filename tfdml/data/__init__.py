"""tfdml.data: P x K batches for every backend, image augmentation, the `DatasetSplit` contract.

* `PKSampler`: the index sampler (epochs, small classes, determinism); NumPy only.
* `PKDataset(source, P, K, ...)`: P x K batches as a `keras.utils.PyDataset`, for
  `model.fit` under every backend, without TensorFlow (augmentation in NumPy:
  `tfdml.data.numpy_augment`).
* `EvalDataset(source, batch_size, ...)`: every example once, in order (test splits), as a
  `PyDataset`.
* `pk_batches(source, P, K, ...)`: the same batches as a lazy, seeded ``tf.data`` pipeline.
* `eval_batches(source, batch_size, ...)`: every example once, in order (test splits).
* `tfdml.data.augment`: resize / crop / flip / pad-crop / bounding-box crop and the
  normalization of Keras Applications backbones, as ``tf.data`` map functions: the
  transforms of `numpy_augment`, the same steps over TensorFlow.
* `TwoViewDataset(images, views, batch_size, ...)`: batches of two augmented views of each
  image for self-supervised learning (SimCLR, Barlow Twins), as a `PyDataset`; the views
  come from `tfdml.data.numpy_views` (NumPy) or, as ``tf.data`` map functions with
  `two_view_batches`, from `tfdml.data.views`.
* `DatasetSplit`: what the data set readers return.
* `check_steps(data, steps)` and `fit_shuffle(data)`: the `steps_per_epoch` an endless
  dataset needs in `model.fit` (a ValueError without it, instead of an epoch that never
  ends) and the `shuffle=False` that keeps Keras from warning about an endless `PyDataset`.

`pk_batches`, `eval_batches`, `augment` and `views` need TensorFlow; they are imported on
first use and raise an ImportError that says what to install without it.
"""

import importlib

from tfdml._endless import check_steps, fit_shuffle
from tfdml.data import numpy_augment, numpy_views
from tfdml.data.pk import PKSampler
from tfdml.data.py_dataset import EvalDataset, PKDataset
from tfdml.data.source import DatasetSplit
from tfdml.data.two_view_dataset import TwoViewDataset

__all__ = ["DatasetSplit", "EvalDataset", "PKDataset", "PKSampler", "TwoViewDataset", "augment",
           "check_steps", "eval_batches", "fit_shuffle", "numpy_augment", "numpy_views",
           "pk_batches", "views"]

_TENSORFLOW = {"augment": "tfdml.data.augment", "pk_batches": "tfdml.data.sampler",
               "eval_batches": "tfdml.data.sampler", "views": "tfdml.data.views"}
_MODULES = ("augment", "views")


def __getattr__(name):
    if name not in _TENSORFLOW:
        raise AttributeError(f"module 'tfdml.data' has no attribute {name!r}")
    from tfdml._tensorflow import tf  # noqa: F401  (the ImportError that says what to install)

    module = importlib.import_module(_TENSORFLOW[name])
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_TENSORFLOW))
