"""Cross-batch memory (Wang et al. 2020): mine against the embeddings of past batches."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int
from tfdml._embeddings import compute_dtype
from tfdml._labels import is_multi_label
from tfdml._shims import dtype_name, is_traced
from tfdml.losses.base import resolve_loss
from tfdml.losses.state import LossState
from tfdml.losses.terms import AnchorTerms
from tfdml.losses.wrapper import LossWrapper

__all__ = ["CrossBatchMemory", "MemoryBank"]


class MemoryBank(LossState):
    """A FIFO bank of ``memory_size`` past embeddings and their labels.

    Variables (non-trainable, float32 / int32): ``embeddings [M, D]``,
    ``labels [M]`` (``[M, L]`` multi-hot label sets with ``num_labels``), ``position`` (the next row to write), ``filled`` (rows
    written so far, at most ``M``) and ``steps`` (training calls so far).
    Under a ``tf.distribute`` strategy every replica writes the same global
    batch, and the first replica's write is kept.
    """

    def __init__(self, memory_size, num_labels=None, children=(), **kwargs):
        super().__init__(children=children, needs_embedding_dim=True, **kwargs)
        self.memory_size = memory_size
        self.num_labels = num_labels

    def make_variables(self, embedding_dim):
        def variable(name, shape, dtype):
            return self.add_weight(shape=shape, initializer="zeros", dtype=dtype,
                                   trainable=False, name=name,
                                   aggregation="only_first_replica")

        self.embeddings = variable("embeddings", (self.memory_size, embedding_dim), "float32")
        shape = (self.memory_size,) if self.num_labels is None else (self.memory_size,
                                                                      self.num_labels)
        self.labels = variable("labels", shape, "int32")
        self.position = variable("position", (), "int32")
        self.filled = variable("filled", (), "int32")
        self.steps = variable("steps", (), "int32")

    def enqueue(self, embeddings, labels):
        """Writes a batch at ``position`` (wrapping around), oldest rows first out."""
        size = self.memory_size
        batch = ops.shape(labels)[0]
        rows = (ops.cast(self.position, "int32") + ops.arange(batch, dtype="int32")) % size
        self.embeddings.assign(ops.scatter_update(
            self.embeddings, rows[:, None], ops.cast(ops.stop_gradient(embeddings), "float32")))
        self.labels.assign(ops.scatter_update(self.labels, rows[:, None],
                                               ops.cast(labels, "int32")))
        batch = ops.cast(batch, "int32")
        self.position.assign((self.position + batch) % size)
        self.filled.assign(ops.minimum(self.filled + batch, size))
        self.steps.assign(self.steps + 1)


@keras.saving.register_keras_serializable(package="tfdml")
class CrossBatchMemory(LossWrapper):
    """Cross-batch memory (XBM): a tfdml loss that mines against past batches too.

    A FIFO bank keeps the embeddings and labels of the last ``memory_size``
    training samples. Once it is full and ``warmup_steps`` training steps
    have passed, each batch is scored against the reference set ``[batch;
    bank]`` (the wrapped loss's ``ref_embeddings``), so its anchors find
    their positives and negatives among ``B + M`` samples instead of ``B``;
    before that, against the batch alone. Then the batch is written into the
    bank (during ``fit``, not ``evaluate``). The bank's embeddings are
    constants in the gradient (they came from earlier weights), the batch's
    own are not: with an empty bank this is the wrapped loss itself.

    Wang et al. use the bank after the embeddings have stabilised (their
    warm-up), since embeddings from older weights drift; the bank is then
    the slow part of a moving target.

    The bank is the loss's state: train with
    :class:`tfdml.models.MetricModel`, which owns it, updates it under every
    backend (JAX's stateless training too), and saves it. Shapes are fixed
    (``[B + M, D]`` references), so the step compiles (XLA, ``jax.jit``).
    Under ``tf.distribute`` the loss sees the global batch (the tfdml
    cross-replica gather), so the bank holds global batches; under
    ``keras.distribution`` (JAX) the loss always sees the global batch.

    **Differences from pytorch-metric-learning's ``CrossBatchMemory``:**
    ``memory_size`` counts past samples only (pytorch-metric-learning's
    memory includes the current batch); the bank is used once it is full
    (pytorch-metric-learning uses the part filled so far); and the
    anchors' own embeddings in the reference set keep their gradient.

    Any tfdml loss that takes a reference set works: triplet, contrastive,
    multi-similarity, margin, SupCon, NT-Xent, circle. The proxy and
    classification losses compare with their class vectors and take no
    reference set.

    Args:
        loss: the wrapped tfdml loss (or its config). Its reduction is
            ignored.
        memory_size: ``M``, the past samples kept. At least the batch size.
            Defaults to `1024`.
        warmup_steps: training steps before the bank is used (the bank is
            filled meanwhile). Defaults to `0`.
        embedding_dim: ``D``. Defaults to `None` (from the model).
        num_labels: ``L``, for multi-hot label sets ``[B, L]`` as ``y_true``: the bank
            keeps each sample's set. `None`: class ids. Defaults to `None`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"xbm_" + loss.name`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> loss = tfdml.losses.CrossBatchMemory(
    ...     tfdml.losses.ContrastiveLoss(), memory_size=8192, warmup_steps=1000)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")

    Reference:
        Wang, Zhang, Huang, Scott, "Cross-batch memory for embedding
        learning", CVPR 2020.
    """

    #: It makes the reference set itself, from the batch and the bank.
    takes_reference_set = False

    def __init__(self, loss, memory_size: int = 1024, warmup_steps: int = 0,
                 embedding_dim=None, num_labels=None, *, reduction="sum_over_batch_size",
                 name=None, dtype=None):
        loss = resolve_loss(loss)
        if not loss.takes_reference_set:
            raise ValueError(
                f"CrossBatchMemory cannot wrap {type(loss).__name__}: it needs a loss that "
                "takes a reference set (`ref_embeddings`)."
            )
        super().__init__(
            loss=loss, memory_size=int(check_int("memory_size", memory_size)),
            warmup_steps=int(check_int("warmup_steps", warmup_steps, minimum=0)),
            embedding_dim=None if embedding_dim is None else int(embedding_dim),
            num_labels=(None if num_labels is None
                        else check_int("num_labels", num_labels, minimum=2)),
            normalize=loss.normalize, average=loss.average, reduction=reduction,
            name=name or f"xbm_{loss.name}", dtype=dtype)

    def make_state(self):
        # The wrapped loss's state holds its miners' seeds.
        return MemoryBank(self.memory_size, self.num_labels, name=f"{self.name}_state",
                          children=[loss.state for loss in self.wrapped_losses])

    def build_state(self, embedding_dim=None):
        return super().build_state(self.embedding_dim if embedding_dim is None else embedding_dim)

    @property
    def bank(self) -> MemoryBank:
        """The :class:`MemoryBank` (built on first use)."""
        return self.state

    def _check_bank_labels(self, labels):
        multi = is_multi_label(labels)
        if multi == (self.num_labels is not None) and (
                not multi or labels.shape[-1] in (None, self.num_labels)):
            return
        raise ValueError(
            "CrossBatchMemory keeps class ids ([B]) by default, and multi-hot label sets "
            "([B, L]) with `num_labels=L`. Received: y_true.shape="
            f"{tuple(labels.shape)}, num_labels={self.num_labels!r}")

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """The wrapped loss's terms against the batch and the bank (once the bank is in use:
        full and past ``warmup_steps``), else against the batch; ``training`` enqueues the
        batch."""
        if ref_embeddings is not None or ref_labels is not None:
            raise ValueError("CrossBatchMemory provides the reference set itself; "
                             "`ref_embeddings` cannot be given.")
        bank = self.state
        if not bank.built:
            self.build_state(embeddings.shape[-1])
        batch = embeddings.shape[0]
        if batch is not None and batch > self.memory_size:
            raise ValueError(
                f"`memory_size` ({self.memory_size}) must be at least the batch size ({batch}).")
        labels = dml.cast_labels(labels, "y_true")
        self._check_bank_labels(labels)
        x = ops.convert_to_tensor(embeddings)
        dtype = compute_dtype(x.dtype)
        past = ops.stop_gradient(ops.cast(bank.embeddings, dtype))
        reference = ops.concatenate([ops.cast(x, dtype), past], axis=0)
        bank_labels = ops.cast(bank.labels, dtype_name(labels))
        ref_labels = ops.concatenate([labels, bank_labels], axis=0)
        use = ops.logical_and(bank.filled >= self.memory_size, bank.steps >= self.warmup_steps)
        if not is_traced(use):  # eagerly: only the terms in use
            terms = (self.loss.compute_terms(labels, x, reference, ref_labels, 0)
                     if bool(ops.convert_to_numpy(use)) else self.loss.compute_terms(labels, x))
        else:
            # Traced, both: a cond would keep both branches' intermediates for the gradient,
            # whose shapes differ (batch, batch + bank), which XLA refuses.
            with_memory = self.loss.compute_terms(labels, x, reference, ref_labels, 0)
            alone = self.loss.compute_terms(labels, x)
            terms = AnchorTerms(*(ops.where(use, a, b)
                                  for a, b in zip(with_memory, alone, strict=True)))
        if training:
            bank.enqueue(x, labels)
        return terms
