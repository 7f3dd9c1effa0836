"""Argument checks shared by every module: a ValueError that names the argument."""

from __future__ import annotations

import math
import numbers

__all__ = ["check_choice", "check_int", "check_number", "check_positive"]


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


def check_number(name, value, low=None, high=None, low_open=False, high_open=False,
                 finite=False):
    """``value`` as a ``float`` if it is a real number (not a bool, not NaN) within the bounds;
    else a ValueError naming ``name`` and the bounds.

    Args:
        name: the argument's name, for the message.
        value: the argument.
        low, high: the bounds, or None for none.
        low_open, high_open: exclude the bound itself (``> low``, ``< high``).
        finite: refuse +-Inf.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    if ok and finite:
        ok = not math.isinf(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        if low is not None and high is not None:
            bound = (f" in {'(' if low_open else '['}{low:g}, {high:g}"
                     f"{')' if high_open else ']'}")
        elif low is not None:
            bound = f" {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            bound = f" {'<' if high_open else '<='} {high:g}"
        else:
            bound = ""
        kind = "finite number" if finite else "number"
        raise ValueError(f"`{name}` must be a {kind}{bound}. Received: {name}={value!r}")
    return float(value)


def check_positive(name, value, allow_zero=False):
    """A finite float ``> 0`` (``>= 0`` with ``allow_zero``), else a ValueError naming it."""
    return check_number(name, value, low=0, low_open=not allow_zero, finite=True)
