"""Argument checks shared by every module: a ValueError that names the argument.

Every check returns the value it accepts (as a plain ``int`` or ``float`` where it says
so) and raises a ValueError that names the argument and repeats what it received;
:func:`at_indices` says where in an array the bad entries are.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["at_indices", "check_choice", "check_int", "check_number", "check_positive", "is_number"]


def is_number(x) -> bool:
    """A real Python or NumPy number, not a bool: what the number checks accept."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def at_indices(bad):
    """``"index 3"`` or ``"indices 3, 9, 17, ..."`` (at most five shown)."""
    if len(bad) == 1:
        return f"index {bad[0]}"
    return "indices " + ", ".join(str(i) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")


def check_int(name, value, minimum=1, allow_none=False):
    """``value`` as an ``int`` if it is an integer (Python or NumPy, not a bool) of at least
    ``minimum`` (``None`` too, with ``allow_none``); else a ValueError naming ``name``."""
    if value is None and allow_none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        none = " or None" if allow_none else ""
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}{none}. Received: {name}={value!r}")
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
    ok = is_number(value) and value == value
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
