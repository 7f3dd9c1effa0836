"""Gradient caching under PyTorch: the chunks embedded without autograd, then again with it."""

from __future__ import annotations

import keras
from keras import ops

from tfdml.models.fit_checks import check_chunk_output
from tfdml.models.gradient_cache.common import GradientCacheBase, first_input, rows

__all__ = ["TorchGradientCache"]


class TorchGradientCache(GradientCacheBase):
    """:class:`tfdml.models.MetricModel`'s chunked training step under PyTorch."""

    def chunked_train_step(self, data):
        """One step with the batch's rows embedded in chunks (``MetricModel(chunk_size=)``)."""
        import torch

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = first_input(x).shape[0]
        size = self.chunk_size
        if batch <= size or not self.trainable_weights:
            return super().train_step(data)
        embedder = self.embedder
        starts = range(0, batch, size)
        chunks = [rows(x, lambda t, s=s: t[s:s + size]) for s in starts]
        state = embedder.non_trainable_variables

        # 1. Embed the chunks without autograd.
        with torch.no_grad():
            snapshot = [ops.copy(v) for v in state]
            parts = []
            for inputs in chunks:
                parts.append(embedder(inputs, training=True))
                check_chunk_output(parts[-1], first_input(inputs).shape[0], self.chunk_size)
                self._check_no_call_losses(embedder.losses, embedder)
            embeddings = torch.cat(parts, dim=0)

        # 2. The loss; its backward fills the gradients of the loss's variables (and of
        # regularized weights) and of the embeddings.
        self.zero_grad()
        embeddings = embeddings.detach().requires_grad_(True)
        loss = self.compute_loss(x=x, y=y, y_pred=embeddings, sample_weight=sample_weight,
                                 training=True)
        tracker = self._loss_tracker_metric()
        if tracker is not None:
            tracker.update_state(loss, sample_weight=batch)
        if self.optimizer is not None:
            loss = self.optimizer.scale_loss(loss)
        if loss.requires_grad:
            loss.backward()
        grad = embeddings.grad
        embeddings = embeddings.detach()
        if grad is None:
            grad = torch.zeros_like(embeddings)

        # 3. Again from the same state, chunk by chunk; backward adds to the gradients.
        with torch.no_grad():
            for v, value in zip(state, snapshot, strict=True):
                v.assign(value)
        for inputs, start in zip(chunks, starts, strict=True):
            out = embedder(inputs, training=True)
            if out.requires_grad:
                torch.sum(out.float() * grad[start:start + size].float()).backward()

        # 4. One update.
        variables = self.trainable_weights[:]
        gradients = [v.value.grad for v in variables]
        with torch.no_grad():
            self.optimizer.apply(gradients, variables)
        return self.compute_metrics(x, y, embeddings, sample_weight=sample_weight)
