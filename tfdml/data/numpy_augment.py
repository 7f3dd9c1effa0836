"""Image augmentation in NumPy, for `tfdml.data.PKDataset`: no TensorFlow needed.

The transforms of `tfdml.data.augment` (its ``tf.data`` map functions), on NumPy `[H, W, C]`
images, for the Keras `PyDataset` that feeds `model.fit` under every backend. Both modules
are made from the same steps (:mod:`tfdml.data._augment_steps`, over the NumPy backend
:mod:`tfdml.data._numpy_backend` here): they take the same arguments and give the same
images up to float32 rounding (the resize is the half-pixel bilinear interpolation of
``tf.image.resize``); randomness comes from a ``numpy.random.Generator`` instead of a
stateless seed, so the random crops and flips differ from the ``tf.data`` pipeline's.

Each transform is `fn(image, rng=None) -> float32 image`; `tfdml.data.PKDataset` passes
every image its own generator, derived from the sampler's seed, so the same seed gives
the same batches.
"""

from tfdml.data import _augment_steps, _numpy_backend

__all__ = list(_augment_steps.PUBLIC)
globals().update(_augment_steps.bind(_numpy_backend, __name__, _augment_steps))
