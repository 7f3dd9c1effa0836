"""Gradient caching (``MetricModel(chunk_size=)``): one training step per backend, picked
once, when tfdml is imported, as Keras picks its trainer.

Each backend's module holds a mixin with ``chunked_train_step``, the step of
:class:`tfdml.models.MetricModel` with its network in chunks (Gao et al.,
"Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup",
2021); the model's docstring says what it computes.
"""

from __future__ import annotations

import keras

_BACKEND = keras.backend.backend()

if _BACKEND == "tensorflow":
    from tfdml.models.gradient_cache.tf_step import TensorFlowGradientCache as GradientCache
elif _BACKEND == "jax":
    from tfdml.models.gradient_cache.jax_step import JaxGradientCache as GradientCache
elif _BACKEND == "torch":
    from tfdml.models.gradient_cache.torch_step import TorchGradientCache as GradientCache
else:
    from tfdml.models.gradient_cache.common import GradientCacheBase as GradientCache

__all__ = ["GradientCache"]
