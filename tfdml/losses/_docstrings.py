"""Docstring text the losses share, filled into their docstrings by :func:`tfdml._docs.fill_doc`.

A loss class's docstring ends its ``Args:`` with the line ``{SHARED_ARGS}``, filled with
:func:`shared_args` of its defaults; a functional form's lists its reference set with
``{REFERENCE_ARGS}`` (:data:`REFERENCE_ARGS`).
"""

from __future__ import annotations

__all__ = ["CLASS_LOSS_ARGS", "CLASS_VECTOR_ARGS", "REFERENCE_ARGS", "SHARED", "STATE_DOC", "shared_args"]

#: The shared arguments of the pair and triplet losses, in the order of their signatures.
SHARED = ("normalize", "average", "reduction", "name", "dtype", "block_size")

_TEXT = {
    "normalize": "normalize: L2-normalize the embeddings first. Defaults to `{normalize}`.",
    "average": """average: what the loss averages over: ``"anchors"``, ``"batch"``,
    ``"terms"``, ``"nonzero"`` or, for a pair loss whose terms split,
    ``"halves"``/``"halves_terms"`` (:mod:`tfdml.losses.terms`).
    Defaults to `"{average}"`.""",
    "reduction": """reduction: see :mod:`tfdml.losses.terms`. Defaults to
    `"sum_over_batch_size"`.""",
    "name": 'name: name of the loss. Defaults to `"{name}"`.',
    "dtype": "dtype: dtype of the returned value. Defaults to `None` (floatx).",
    "block_size": """block_size: compute the loss over blocks of this many anchors, each
    against the whole batch, recomputing each block in the backward
    pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
    values and gradients (docs/losses.md, "Large batches"). Defaults
    to `None` (the whole batch at once).""",
}


def shared_args(name, average="anchors", normalize=True, arguments=SHARED):
    """The ``Args`` lines of a loss's shared arguments, with its defaults.

    Args:
        name: the loss's default ``name``.
        average: its default ``average``.
        normalize: its default ``normalize``.
        arguments: the shared arguments it takes, in the order of its signature.

    Returns:
        The lines, flush left (:func:`tfdml._docs.fill_doc` indents them).
    """
    values = {"name": name, "average": average, "normalize": normalize}
    return "\n".join(_TEXT[key].format(**values) for key in arguments)


#: The reference set of a functional form (``ref_embeddings``, ``ref_labels``, ``ref_offset``).
REFERENCE_ARGS = """ref_embeddings: ``[R, D]`` embeddings to mine positives and negatives
    from instead of the batch. Defaults to `None` (the batch).
ref_labels: ``[R]`` class ids of ``ref_embeddings``.
ref_offset: anchor ``i`` is row ``i + ref_offset`` of the reference
    set (excluded from its positives); `None` when the anchors are not
    in it. Ignored without ``ref_embeddings``."""

#: The shared arguments of a loss with learned class vectors (every sample one term).
CLASS_LOSS_ARGS = """reduction: see :mod:`tfdml.losses.terms`. Defaults to
    `"sum_over_batch_size"`.
average: see :mod:`tfdml.losses.terms` (every sample is one term).
    Defaults to `"anchors"`, the mean over the batch.
dtype: dtype of the returned value. Defaults to `None` (floatx)."""

#: The labels of a class-vector loss's functional form (its ``Args``, before the embeddings).
CLASS_LABELS = "y_true: ``[B]`` integer class ids in ``[0, C)``."

#: What the functional form of a per-sample class-vector loss returns.
CLASS_MEAN = "The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs)."

#: The arguments every loss with learned class vectors takes besides its own.
CLASS_VECTOR_ARGS = """num_classes: ``C``; class ids must be in ``[0, C)``.
embedding_dim: ``D``. Defaults to `None`: taken from the model by
    :class:`tfdml.models.MetricModel` (or from the first batch when
    called eagerly).
initializer: a Keras initializer for the vectors. Defaults to `None`:
    normal with standard deviation ``1 / sqrt(D)``.
""" + CLASS_LOSS_ARGS

#: How a class-vector loss keeps and trains its vectors.
STATE_DOC = """The class vectors are a variable of the loss's state (``loss.class_vectors``,
``[C, D]``; ``[C, k, D]`` with centres), created with the embedding size.
Train with :class:`tfdml.models.MetricModel`, which owns the state: its
``fit`` trains the vectors with the network and its ``save`` keeps them.
They are normalized in the loss, so their initial norm sets how fast an
adaptive optimizer such as Adam turns them (about ``lr / norm`` radians
per step): the default initializer gives norm about 1; a smaller
``stddev`` trains them faster."""
