"""The base class of the losses that wrap tfdml losses: :class:`LossWrapper`."""

from __future__ import annotations

from tfdml.losses.base import MetricLoss

__all__ = ["LossWrapper"]


class LossWrapper(MetricLoss):
    """Base class of the losses that wrap tfdml losses (trimmed, cross-batch memory, two
    views, a sum of losses).

    A wrapper passes the loss it wraps to ``MetricLoss.__init__`` as its argument ``loss``
    (so that its config holds it, serialized); :attr:`wrapped_losses` is the one way to
    walk the losses it holds, for its state, its miners' seeds and its owner. Its terms
    are those of the wrapped loss, which it gets from the wrapped loss's
    ``compute_terms`` (with the wrapped loss's blocks and buffers) in its own
    ``compute_terms``. By default it holds no variables of its own: its state is the
    wrapped loss's.
    """

    #: Whether the terms split is the wrapped loss's: ``average="halves"`` is checked when
    #: the terms are reduced.
    split_terms = None

    @property
    def wrapped_losses(self) -> tuple:
        """The tfdml losses this loss wraps: its ``loss``."""
        return (self.loss,)

    @property
    def takes_reference_set(self) -> bool:
        """Whether the wrapped losses take a reference set."""
        return all(loss.takes_reference_set for loss in self.wrapped_losses)

    def make_state(self):
        """The wrapped loss's state (its variables and its miners' seeds), shared."""
        return self.loss.state

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                   ref_offset=None):
        """:meth:`compute_terms` (a wrapper's terms come from the wrapped loss's)."""
        return self.compute_terms(labels, embeddings, ref_embeddings, ref_labels, ref_offset)
