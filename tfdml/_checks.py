"""Argument checks shared by every module: a ValueError that names the argument."""

from __future__ import annotations

import numbers

__all__ = ["check_choice", "check_int"]


def check_int(name, value, minimum=1):
    """``value`` as an ``int`` if it is an integer (Python or NumPy, not a bool) of at least
    ``minimum``; else a ValueError naming ``name``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")
    return int(value)


def check_choice(name, value, choices):
    """``value`` if it is one of ``choices``; else a ValueError naming ``name`` and listing
    them (sorted when ``choices`` has no order of its own, e.g. a set or a dict)."""
    if value not in choices:
        shown = sorted(choices) if isinstance(choices, (set, frozenset, dict)) else choices
        raise ValueError(f"`{name}` must be one of {shown}. Received: {name}={value!r}")
    return value
