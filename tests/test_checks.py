"""tfdml._checks: the argument checks every module shares."""

import numpy as np
import pytest

from tfdml._checks import check_choice, check_int, check_number, check_positive


def test_check_int_accepts_python_and_numpy_integers_at_the_minimum():
    assert check_int("k", 1) == 1 and type(check_int("k", np.int64(3))) is int
    assert check_int("k", 0, minimum=0) == 0


@pytest.mark.parametrize("value", [0, -2, True, 1.0, 2.5, "3", None, np.float32(2)])
def test_check_int_names_the_argument(value):
    with pytest.raises(ValueError, match="`k` must be an integer >= 1") as info:
        check_int("k", value)
    assert str(info.value).endswith(f"Received: k={value!r}")


def test_check_choice_lists_the_choices_sorted_only_when_unordered():
    assert check_choice("mode", "b", ("b", "a")) == "b"
    with pytest.raises(ValueError, match=r"`mode` must be one of \('b', 'a'\)\. Received: mode='c'"):
        check_choice("mode", "c", ("b", "a"))
    with pytest.raises(ValueError, match=r"one of \['a', 'b'\]"):
        check_choice("mode", "c", {"b", "a"})


def test_check_number_returns_a_float_within_the_bounds():
    assert check_number("m", 0) == 0.0 and type(check_number("m", np.int32(2))) is float
    assert check_number("t", 2.0, low=0, high=2, low_open=True) == 2.0
    assert check_number("b", -7.5) == -7.5 and check_number("m", float("inf"), low=0) == float("inf")


@pytest.mark.parametrize("value, kwargs, message", [
    (0.0, {"low": 0, "low_open": True}, "`x` must be a number > 0"),
    (-1, {"low": 0}, "`x` must be a number >= 0"),
    (2.5, {"low": 0, "high": 2, "low_open": True}, r"`x` must be a number in \(0, 2\]"),
    (1.0, {"low": 0, "high": 1, "high_open": True}, r"`x` must be a number in \[0, 1\)"),
    (float("nan"), {}, "`x` must be a number"),
    (True, {}, "`x` must be a number"),
    ("1", {"low": 0}, "`x` must be a number >= 0"),
    (float("inf"), {"low": 0, "finite": True}, "`x` must be a finite number >= 0"),
])
def test_check_number_names_the_argument_and_the_bounds(value, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        check_number("x", value, **kwargs)
    assert str(info.value).endswith(f"Received: x={value!r}")


def test_check_positive_is_finite_and_strict_unless_zero_is_allowed():
    assert check_positive("s", 3) == 3.0 and check_positive("m", 0, allow_zero=True) == 0.0
    for value in (0, float("inf"), float("nan"), -1e-9):
        with pytest.raises(ValueError, match="`s` must be a finite number > 0"):
            check_positive("s", value)
