"""Two augmented views of each image, for self-supervised learning (SimCLR, Barlow Twins).

NumPy only (no TensorFlow), for every Keras backend; `tfdml.data.views` has the same
augmentations as ``tf.data`` map functions. Both are made from the same steps
(:mod:`tfdml.data._view_steps`), here over the NumPy backend.

* The ops, on `[H, W, C]` float images in [0, 1], random ones with a
  ``numpy.random.Generator``: `random_resized_crop` (`random_crop_box`), `color_jitter`
  (`adjust_brightness`, `adjust_contrast`, `adjust_saturation`, `adjust_hue`),
  `to_grayscale`, `gaussian_blur`, `solarize`.
* `simclr_augmenter` and `barlow_augmenter`: one view, `fn(image, rng=None)`, from an image
  in [0, 255] (any dtype; uint16 is read as 16 bits) to float32 pixels in [0, 255], then
  `preprocess` (as `tfdml.data.numpy_augment.train_transform`).
* `TwoViews`, `simclr_views`, `barlow_views`: both views, `views(image, rng)`; the two
  views draw from `rng` in turn.

`tfdml.data.TwoViewDataset` (:mod:`tfdml.data.two_view_dataset`) makes batches of
`((view1, view2),)` with them, as a `keras.utils.PyDataset`, for `model.fit` under every
backend.
"""

from tfdml.data import _augment_steps, _numpy_backend, _view_steps

__all__ = ["TwoViews", *_view_steps.PUBLIC]
globals().update(_augment_steps.bind(_numpy_backend, __name__, _view_steps))
TwoViews = _view_steps.two_views_class(_numpy_backend)
