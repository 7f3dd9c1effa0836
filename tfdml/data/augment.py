"""Image augmentation for metric learning, as ``tf.data`` map functions.

The papers tfdml reproduces train on images resized to 256 and randomly cropped to 224
(or 227) with random horizontal flips, and evaluate on a resize and a center crop. The
extreme-triplet paper instead resizes to 256 x 256, pads 10 pixels on each side and crops
256 x 256 back at random. All three are here, plus the normalization of a Keras
Applications backbone and the bounding-box crop of CUB-200-2011 and Cars196.

The same steps as `tfdml.data.numpy_augment` (:mod:`tfdml.data._augment_steps`), over the
TensorFlow backend (:mod:`tfdml.data._tf_backend`). Every function is graph-compatible
(usable in ``tf.data.Dataset.map`` and ``tf.function``). Randomness comes from stateless
random ops: the same ``seed`` (a shape ``[2]`` integer tensor) gives the same output.
``tfdml.data.pk_batches`` passes each element its own seed, derived from the pipeline seed.
"""

from tfdml.data import _augment_steps, _tf_backend

__all__ = list(_augment_steps.PUBLIC)
globals().update(_augment_steps.bind(_tf_backend, __name__, _augment_steps))
