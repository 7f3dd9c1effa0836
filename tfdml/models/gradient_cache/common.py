"""What the per-backend gradient-cache steps share: the chunks of a batch and the checks."""

from __future__ import annotations

import keras

__all__ = ["GradientCacheBase", "first_input", "rows"]


def first_input(x):
    """The first array of the (possibly nested) inputs: its rows are the batch."""
    return next(t for t in keras.tree.flatten(x) if t is not None)


def rows(x, fn):
    """``fn`` applied to every array of the (possibly nested) inputs."""
    return keras.tree.map_structure(lambda t: None if t is None else fn(t), x)


class GradientCacheBase:
    """The training step of a :class:`tfdml.models.MetricModel` with ``chunk_size``
    (gradient caching), for a backend without its own: the stock step."""

    def chunked_train_step(self, *args):
        """The stock training step (no chunks on this backend)."""
        return super().train_step(*args)

    def _loss_tracker_metric(self):
        """The ``Mean`` named ``loss`` of ``self.metrics`` (the compiled loss tracker), or None."""
        for metric in self.metrics:
            if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
                return metric
        return None

    def _check_no_call_losses(self, losses, layer):
        """Refuses losses added during the embedder's call (activity regularizers, ``add_loss``).

        With chunks, ``compute_loss`` would see those of the last chunk only, as constants.
        ``losses`` (``layer.losses`` after a call) holds them and one regularization loss per
        regularized trainable weight, which ``compute_loss`` differentiates itself.
        """
        regularized = sum(1 for v in layer.trainable_weights if v.regularizer is not None)
        if len(losses) > regularized:
            raise ValueError(
                f"MetricModel {self.name!r} with `chunk_size` cannot train an embedder that "
                "adds losses during its call (activity regularizers, `add_loss`); weight "
                "regularizers are fine. Remove them or train without chunks. "
                f"Received: chunk_size={self.chunk_size!r}")

    def _embedder_state_mask(self):
        """For each of ``self.non_trainable_variables``: whether the embedder owns it."""
        owned = {id(v) for v in self.embedder.non_trainable_variables}
        return [id(v) in owned for v in self.non_trainable_variables]
