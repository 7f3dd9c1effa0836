"""Models saved whole or not at all, and loaded with errors that name the file."""

from __future__ import annotations

import functools

import keras

from tfdml._files import save_atomically
from tfdml.models.metric_model import MetricModel

__all__ = ["load_model", "save_model"]


def load_model(filepath, **kwargs):
    """``keras.saving.load_model``, with an error that names a truncated or corrupt file.

    Keras reports a ``.keras`` file that is not a complete zip archive (e.g.
    a save killed part-way) as "File not found"; this says what is wrong with
    which file. tfdml's layers, losses and :class:`MetricModel` are
    registered when tfdml is imported, so they load without
    ``custom_objects``.

    Args:
        filepath: the ``.keras`` file.
        **kwargs: for ``keras.saving.load_model`` (``compile``, ``safe_mode``...).

    Raises:
        tfdml._files.CorruptFileError: (a ``ValueError`` and an ``OSError``)
            for a truncated or corrupt file, naming it.
    """
    from tfdml._files import raise_if_incomplete

    try:
        return keras.saving.load_model(filepath, **kwargs)
    except Exception as error:
        raise_if_incomplete(filepath, error)
        raise


def save_model(model, filepath, overwrite=True, zipped=None, weights_only=False, **kwargs):
    """``model.save(filepath)`` (or ``save_weights``), written whole or not at all.

    Keras writes a ``.keras`` or ``.weights.h5`` file in place: a full disk
    or a kill part-way leaves a file that no longer loads, where the
    previous save was. This writes to a temporary file beside ``filepath``
    (a hidden ``.<name>.tmp-...``), flushes it to disk (``fsync``) and
    renames it over ``filepath``, so that a reader, or a later run, finds
    the old file or the new one, never a part of one. On an error (e.g.
    ``OSError`` for a full disk) the temporary file is removed, the old file
    is left as it was, and the error is raised. :class:`MetricModel`'s
    ``save`` and ``save_weights`` do the same.

    Args:
        model: any Keras model (or layer with ``save``/``save_weights``).
        filepath: the ``.keras`` (or ``.weights.h5`` with
            ``weights_only=True``) file; an unzipped save (``zipped=False``)
            is a directory, replaced whole the same way. A remote path
            (``gs://...``) is written by Keras directly.
        overwrite: replace an existing file. `False` asks, as Keras does,
            before writing over one. Defaults to `True`.
        zipped: for ``keras.Model.save``. Defaults to `None`.
        weights_only: ``model.save_weights`` instead of ``model.save``.
            Defaults to `False`.
        **kwargs: for ``model.save`` / ``model.save_weights``.

    Examples:

    >>> tfdml.models.save_model(model, "run.keras")
    >>> tfdml.models.save_model(model, "run.weights.h5", weights_only=True)
    """
    if isinstance(model, MetricModel):  # its own save and save_weights write atomically
        write = functools.partial(
            keras.Model.save_weights if weights_only else keras.Model.save, model)
    else:
        write = model.save_weights if weights_only else model.save
    save_atomically(write, filepath, overwrite=overwrite, zipped=zipped,
                    weights_only=weights_only, **kwargs)
