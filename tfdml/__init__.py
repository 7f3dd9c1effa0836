"""tfdml: deep metric learning for Keras 3.

Losses and miners that drop into ``model.compile(loss=...)``, retrieval metrics,
and the methods of the extreme-triplet, FAPPY, LoOp and easy-positive papers.

The core (``tfdml.ops``, ``miners``, ``losses``, ``geometry``, ``layers``,
``search``, ``metrics``, ``analysis``, ``callbacks``, ``models``) is written in ``keras.ops``
and runs under every Keras backend (TensorFlow, JAX, PyTorch); importing it
imports TensorFlow only when TensorFlow is the backend (or for ``tf.data``
inputs). ``tfdml.data`` (``PKSampler``, the ``PKDataset`` P x K batches) and
``tfdml.datasets`` work without TensorFlow; ``tfdml.data.pk_batches`` /
``eval_batches`` / ``augment`` (``tf.data``), ``datasets.load(..., source="tfds")``,
``export`` and ``compat`` build on TensorFlow and need it installed.
Under another backend the subpackages are imported on first use.
"""

import importlib

from tfdml._install import TENSORFLOW_INSTALL

try:
    import keras
except ModuleNotFoundError as _err:  # Keras' default backend is TensorFlow
    if _err.name != "tensorflow" and not (_err.name or "").startswith("tensorflow."):
        raise
    raise ImportError(
        "Keras' backend is TensorFlow (the default, or KERAS_BACKEND=tensorflow) and "
        f"TensorFlow is not installed. {TENSORFLOW_INSTALL} Or use the JAX or PyTorch backend for the "
        "core: KERAS_BACKEND=jax or KERAS_BACKEND=torch."
    ) from _err

from tfdml import (
    analysis,
    callbacks,
    geometry,
    layers,
    losses,
    metrics,
    miners,
    models,
    ops,  # noqa: ICN001 (the subpackage itself: tfdml.ops)
    search,
)
from tfdml._version import __version__

__all__ = [
    "analysis",
    "callbacks",
    "compat",
    "data",
    "datasets",
    "export",
    "geometry",
    "layers",
    "losses",
    "metrics",
    "miners",
    "models",
    "ops",
    "search",
    "__version__",
]

#: Subpackages that need TensorFlow whatever the Keras backend.
TENSORFLOW_MODULES = ("compat", "export")

_SUBMODULES = frozenset(__all__) - {"__version__"}


def __getattr__(name):
    if name not in _SUBMODULES:
        raise AttributeError(f"module 'tfdml' has no attribute {name!r}")
    module = importlib.import_module(f"tfdml.{name}")
    globals()[name] = module
    return module


def __dir__():
    return sorted(set(globals()) | _SUBMODULES)


if keras.backend.backend() == "tensorflow":
    from tfdml import compat, data, datasets, export  # noqa: E402,F401
