"""What :class:`tfdml.models.MetricModel` checks when it trains: the labels given to
``fit``, and what the embedder returns (the endless datasets: :mod:`tfdml._endless`)."""

from __future__ import annotations

import numbers
import warnings

import keras
import numpy as np

from tfdml._labels import check_label_array
from tfdml.losses.class_vectors import ClassVectorLoss
from tfdml.losses.ownership import losses_within
from tfdml.losses.xbm import CrossBatchMemory

__all__ = [
    "check_chunk_output",
    "check_labels",
    "check_one_output",
    "output_dim",
    "warn_batches_without_positives",
]


def output_dim(model):
    """The embedding size of a built model, or None."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError):
        return None
    if isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple)):
        return None  # several outputs
    return None if not shape else shape[-1]


def check_one_output(y_pred):
    """The embedder's output must be one ``[B, D]`` tensor, what every tfdml loss takes."""
    if isinstance(y_pred, (list, tuple, dict)):
        raise ValueError(
            "MetricModel's embedder must return one tensor of embeddings [B, D], which its "
            f"loss takes as y_pred; it returns {len(y_pred)} outputs. Several views of a "
            "sample go in one tensor, stacked along the batch axis (docs/losses.md, \"Two "
            "views\"). Received: an embedder output of type "
            f"{type(y_pred).__name__} with {len(y_pred)} entries")


def check_chunk_output(out, rows, chunk_size):
    """A chunk of ``rows`` input rows must give ``rows`` embedding rows: the chunks' outputs
    are put together in input order, so an embedder that makes several rows of a sample
    (two views stacked) would mix the views of different chunks."""
    check_one_output(out)
    got = out.shape[0]
    if got is not None and rows is not None and got != rows:
        raise ValueError(
            f"MetricModel with `chunk_size` needs an embedder that gives one embedding row "
            f"per input row; it gives {got} rows for a chunk of {rows} (several views of a "
            "sample stacked in its output?). Its chunks' outputs would be put together in "
            "the wrong order, and the loss would pair the views of different samples. Train "
            f"it without chunks, or embed each view as its own input row. Received: "
            f"chunk_size={chunk_size!r}")


def warn_batches_without_positives(model, y, batch_size, shuffle):
    """Labels given as arrays: warns (once per fit) when the batches ``fit`` will cut from
    them have no two samples of a class, where a mining loss has nothing to learn.

    A compiled step cannot warn from the loss (its values are not known while it is
    traced), so the batches are looked at here, from the labels alone: exactly with
    ``shuffle=False``, and for ``shuffle=True`` over one shuffle drawn here with a fixed
    seed of its own (the model's random state is not touched).
    """
    inner = losses_within(model.metric_loss)
    if (y is None or keras.ops.is_tensor(y) or not isinstance(y, (np.ndarray, list, tuple))
            or any(isinstance(loss, (ClassVectorLoss, CrossBatchMemory)) for loss in inner)):
        return
    ids = np.asarray(y)
    if ids.ndim == 0 or ids.size == 0 or ids.dtype.kind not in "iub":
        return
    ids = ids.reshape(len(ids), -1)[:, 0]
    size = 32 if batch_size is None else batch_size
    if not isinstance(size, numbers.Integral) or size < 1:
        return  # Keras refuses it
    order = (np.random.default_rng(0).permutation(len(ids))
             if shuffle is True else np.arange(len(ids)))
    batches = [ids[order[i:i + size]] for i in range(0, len(ids), size)]
    lacking = sum(len(np.unique(b)) == len(b) for b in batches)
    if lacking and (shuffle is not True or 2 * lacking >= len(batches)):
        warnings.warn(
            f"MetricModel {model.name!r}: {lacking} of the {len(batches)} batches of "
            f"{size} that fit cuts from `y`{' (one shuffle)' if shuffle is True else ''} "
            f"have no two samples of a class, so the loss {model.metric_loss.name!r} is 0 "
            "on them and nothing is learned. Use batches with several samples of each "
            "class, e.g. tfdml.data.PKDataset or tfdml.data.pk_batches.",
            stacklevel=3,
        )


def check_labels(loss, y, name):
    """Labels given as arrays: :func:`tfdml._labels.check_label_array` (Keras turns string
    labels into a dtype error of its own, and under JAX without 64-bit mode holds int64 ids
    in 32 bits, merging distinct ids), and the class ids against the
    class count of every loss with class vectors (a traced step would give NaN)."""
    check_label_array(y, name)
    if y is None or keras.ops.is_tensor(y) or not isinstance(y, (np.ndarray, list, tuple)):
        return
    counts = [n for n in (getattr(inner, "num_classes", None)
                          for inner in losses_within(loss))
              if isinstance(n, numbers.Integral)]
    ids = np.asarray(y)
    if counts and ids.size and (ids.min() < 0 or ids.max() >= min(counts)):
        raise ValueError(
            f"`{name}` holds class ids from {ids.min()} to {ids.max()}, and the loss "
            f"{loss.name!r} has class vectors for [0, {min(counts)}) "
            f"(num_classes={min(counts)}): give it num_classes > {ids.max()}, or map the "
            f"labels to 0..num_classes-1. Received: {name} with ids up to {ids.max()}")
