"""Export an embedding model as a TF SavedModel that takes raw uint8 images."""

from __future__ import annotations

import numbers

import keras

from tfdml import ops as dml
from tfdml._files import atomic_path
from tfdml._tensorflow import tf
from tfdml.models import get_preprocess, unwrap

__all__ = ["export_embedding_model"]


def _resolve_preprocess(model, preprocess):
    if callable(preprocess):
        return preprocess
    if preprocess is None:
        return get_preprocess("none")
    if preprocess == "auto":
        mode = getattr(model, "preprocess", None)
        if not isinstance(mode, str):
            raise ValueError(
                "`preprocess` must be given for this model: it has no `preprocess` attribute "
                "(models loaded from a .keras file lose it). Pass the backbone name (e.g. "
                "'resnet50'), a mode ('caffe', 'tf', 'torch', 'none') or a function. "
                f"Received: preprocess={preprocess!r}"
            )
        return get_preprocess(mode)
    try:
        return get_preprocess(preprocess)
    except ValueError:
        raise ValueError(
            "`preprocess` must be 'auto', a backbone name, a mode ('caffe', 'tf', 'torch', "
            f"'none'), None or a function. Received: preprocess={preprocess!r}"
        ) from None


def _check_image_size(image_size):
    if image_size is None:
        return None
    ok = isinstance(image_size, list | tuple) and len(image_size) == 2 and all(
        d is None
        or (isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1)
        for d in image_size
    )
    if not ok:
        raise ValueError(
            "`image_size` must be None or (height, width) with positive integers (or None for "
            f"any size). Received: image_size={image_size!r}"
        )
    return tuple(image_size)


class _EmbeddingModule(tf.Module):
    def __init__(self, model, preprocess, in_hw, model_hw, normalize, resize_method):
        super().__init__(name="embedding_module")
        self.model = model
        self._preprocess = preprocess
        self._model_hw = model_hw
        self._in_hw = in_hw
        self._normalize = normalize
        self._resize_method = resize_method
        spec = tf.TensorSpec([None, in_hw[0], in_hw[1], 3], tf.uint8, name="images")
        self.serve = tf.function(self._serve, input_signature=[spec])

    def _serve(self, images):
        # The signature's static size is not enforced when it is called: check it, so that
        # images of another size fail instead of being embedded at a size the model was not
        # built for.
        checks = [
            tf.debugging.assert_equal(
                tf.shape(images)[axis], tf.constant(size, tf.int32),
                message=f"images must be {self._in_hw[0] or 'any'} x {self._in_hw[1] or 'any'} "
                        "pixels (height x width): the size this SavedModel accepts "
                        "(export_embedding_model's image_size; None: the model's input size). "
                        "Export with image_size=(None, None) to accept any size and resize")
            for axis, size in ((1, self._in_hw[0]), (2, self._in_hw[1])) if size is not None
        ]
        with tf.control_dependencies(checks):
            images = tf.identity(images)
        x = tf.cast(images, tf.float32)
        need_resize = self._model_hw[0] is not None and (
            self._in_hw[0] != self._model_hw[0] or self._in_hw[1] != self._model_hw[1]
        )
        if need_resize:
            x = tf.image.resize(x, self._model_hw, method=self._resize_method)
        x = tf.cast(self._preprocess(x), tf.float32)
        embeddings = tf.cast(self.model(x, training=False), tf.float32)
        if self._normalize:  # exact for any finite vector (see tfdml.ops.l2_normalize)
            embeddings = dml.l2_normalize(embeddings)
        return {"embeddings": embeddings}


def export_embedding_model(
    model: keras.Model,
    path,
    preprocess="auto",
    image_size=None,
    normalize: bool = True,
    resize_method: str = "bilinear",
):
    """Writes a TF SavedModel that maps raw uint8 RGB images to L2-normalized embeddings.

    The ``serving_default`` signature takes ``images``: ``uint8 [N, H, W, 3]``
    for any batch size ``N`` and returns ``{"embeddings": float32 [N, D]}``.
    Inside: cast to float32, resize to the model's input size when the
    accepted image size differs from it, the backbone's preprocessing, the
    model (inference mode), and L2 normalization (a no-op up to rounding for a
    model that already ends with :class:`tfdml.layers.L2Normalization`).
    Load it with ``tf.saved_model.load(path)``; serving it needs TensorFlow
    only, not tfdml.

    Args:
        model: a Keras embedding model taking ``[N, H, W, 3]`` float images,
            e.g. from :func:`tfdml.models.build_embedding_model`. A
            :class:`tfdml.models.MetricModel` exports its embedding model (the
            loss's state is not part of the export).
        path: directory to write the SavedModel to. It is written whole or
            not at all: into a temporary directory beside ``path``, renamed
            over it once complete, so that an error, a full disk or a kill
            part-way leaves the previous export (or nothing) there.
        preprocess: ``"auto"`` (the ``model.preprocess`` mode that
            :func:`~tfdml.models.build_embedding_model` sets; a model loaded
            from a ``.keras`` file does not have it, so name it), a backbone
            name (``"resnet50"``), a mode (``"caffe"``, ``"tf"``, ``"torch"``,
            ``"none"``), `None` (no preprocessing), or a TensorFlow-traceable
            function of float32 0..255 images. Defaults to `"auto"`.
        image_size: ``(height, width)`` of the images the signature accepts;
            they are resized to the model's input size if it differs. Use
            ``(None, None)`` to accept any size (every image is resized).
            Defaults to `None`: the model's input size only, no resizing. The
            served function checks the size: images of another height or width
            raise ``tf.errors.InvalidArgumentError`` (whose message names the
            accepted size) rather than being embedded at a size the model was
            not built for (the signature's declared shape alone is not enforced
            when it is called). A model whose input size is unknown
            (``(None, None, 3)``) takes any size, unresized.
        normalize: L2-normalize the output. Defaults to `True`.
        resize_method: a ``tf.image.resize`` method. Defaults to `"bilinear"`.

    Returns:
        The ``tf.Module`` that was saved (its ``serve`` function is the
        signature).

    Examples:

    >>> tfdml.export.export_embedding_model(model, "export/embedder", preprocess="resnet50")
    >>> embedder = tf.saved_model.load("export/embedder")
    >>> out = embedder.signatures["serving_default"](images=uint8_images)
    >>> out["embeddings"].shape
    TensorShape([8, 512])
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model. Received: model={model!r}")
    model = unwrap(model)
    shape = tuple(model.input_shape) if not isinstance(model.input_shape, list) else None
    if shape is None or len(shape) != 4 or shape[-1] != 3:
        raise ValueError(
            "`model` must take one input of shape [N, H, W, 3]. "
            f"Received: model.input_shape={model.input_shape!r}"
        )
    fn = _resolve_preprocess(model, preprocess)
    image_size = _check_image_size(image_size)
    if not isinstance(normalize, bool):
        raise ValueError(f"`normalize` must be True or False. Received: normalize={normalize!r}")
    methods = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian",
               "mitchellcubic")
    if resize_method not in methods:
        raise ValueError(
            f"`resize_method` must be one of {methods}. Received: resize_method={resize_method!r}"
        )
    model_hw = (shape[1], shape[2])
    in_hw = model_hw if image_size is None else image_size
    if (model_hw[0] is None or model_hw[1] is None) and image_size is not None:
        raise ValueError(
            "`image_size` must be None for a model with an unknown input size "
            f"{model.input_shape}. Received: image_size={image_size!r}"
        )
    module = _EmbeddingModule(model, fn, in_hw, model_hw, normalize, resize_method)
    if "://" in str(path):  # a remote file system: written by TensorFlow directly
        tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
        return module
    with atomic_path(path, directory=True) as tmp:
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve})
    return module
