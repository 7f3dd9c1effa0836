"""tfdml: deep metric learning for Keras 3 and TensorFlow.

Losses and miners that drop into ``model.compile(loss=...)``, retrieval metrics,
and the methods of the extreme-triplet, FAPPY, LoOp and easy-positive papers.
"""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised only without TensorFlow
    raise ImportError(
        "tfdml needs TensorFlow >= 2.16. Install it with `pip install tfdml[tensorflow]` "
        "(or `pip install tensorflow`), or `pip install tfdml[cpu]` "
        "(or `pip install tensorflow-cpu`) for the CPU-only wheel."
    ) from err

from tfdml import (
    analysis,
    callbacks,
    compat,
    data,
    datasets,
    export,
    geometry,
    layers,
    losses,
    metrics,
    miners,
    models,
    ops,
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
    "__version__",
]
