"""Compatibility layers for code written against other metric-learning libraries.

``from tfdml.compat import tfa`` replaces ``import tensorflow_addons as tfa`` for the
metric-learning losses (see :mod:`tfdml.compat.tfa`).
"""

from tfdml._tensorflow import tf  # noqa: F401  (a clear ImportError without it)
from tfdml.compat import tfa

__all__ = ["tfa"]
