"""matplotlib, imported when a plotting function is called (it is an optional dependency)."""

from __future__ import annotations

import importlib

__all__ = ["import_figure", "import_pyplot"]

_MISSING = ("Plotting needs matplotlib: `pip install matplotlib` (or, in a clone of tfdml, "
            "`pip install \".[plot]\"`).")


def _module(name):
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ImportError(_MISSING) from err


def import_pyplot():
    """``matplotlib.pyplot``.

    Returns:
        The ``matplotlib.pyplot`` module.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    return _module("matplotlib.pyplot")


def import_figure():
    """``matplotlib.figure.Figure``, for figures made without pyplot (nothing shown or kept
    open).

    Returns:
        The ``Figure`` class.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    return _module("matplotlib.figure").Figure
