"""tfdml: deep metric learning for Keras 3.

Losses and miners that drop into ``model.compile(loss=...)``, retrieval metrics,
and the methods of the extreme-triplet, FAPPY, LoOp and easy-positive papers.

The core (``tfdml.ops``, ``miners``, ``losses``, ``geometry``, ``layers``,
``metrics``, ``analysis``, ``callbacks``, ``models``) is written in ``keras.ops``
and runs under every Keras backend (TensorFlow, JAX, PyTorch); importing it
imports TensorFlow only when TensorFlow is the backend (or for ``tf.data``
inputs). ``tfdml.data``, ``datasets``, ``export``, ``compat`` and
``experiments`` build on TensorFlow (``tf.data`` feeds ``model.fit`` on every
backend) and need it installed; under another backend they are imported on
first use.
"""

import importlib

import keras

from tfdml import analysis, callbacks, geometry, layers, losses, metrics, miners, models, ops
from tfdml._version import __version__

__all__ = [
    "analysis",
    "callbacks",
    "compat",
    "data",
    "datasets",
    "experiments",
    "export",
    "geometry",
    "layers",
    "losses",
    "metrics",
    "miners",
    "models",
    "ops",
    "__version__",
]

#: Subpackages that need TensorFlow whatever the Keras backend.
TENSORFLOW_MODULES = ("compat", "data", "datasets", "experiments", "export")

_SUBMODULES = frozenset(__all__) - {"__version__"}


def __getattr__(name):
    if name not in _SUBMODULES:
        raise AttributeError(f"module 'tfdml' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"tfdml.{name}")
    except ModuleNotFoundError as err:
        if err.name != "tensorflow" and not (err.name or "").startswith("tensorflow."):
            raise
        raise ImportError(
            f"tfdml.{name} needs TensorFlow >= 2.16 (the core losses, miners and metrics do "
            "not). Install it with `pip install tfdml[tensorflow]` (or `pip install "
            "tensorflow`), or `pip install tfdml[cpu]` (or `pip install tensorflow-cpu`) for "
            "the CPU-only wheel."
        ) from err
    globals()[name] = module
    return module


def __dir__():
    return sorted(set(globals()) | _SUBMODULES)


if keras.backend.backend() == "tensorflow":
    from tfdml import compat, data, datasets, export  # noqa: E402,F401
