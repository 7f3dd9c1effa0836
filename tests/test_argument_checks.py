"""tfdml._argument_checks: the argument checks every module shares."""

import numpy as np
import pytest

from tfdml._argument_checks import (
    at_indices,
    check_choice,
    check_int,
    check_number,
    check_positive,
    is_number,
)


def test_check_int_accepts_python_and_numpy_integers_at_the_minimum():
    assert check_int("k", 1) == 1 and type(check_int("k", np.int64(3))) is int
    assert check_int("k", 0, minimum=0) == 0


@pytest.mark.parametrize("value", [0, -2, True, 1.0, 2.5, "3", None, np.float32(2)])
def test_check_int_names_the_argument(value):
    with pytest.raises(ValueError, match="`k` must be an integer >= 1") as info:
        check_int("k", value)
    assert str(info.value).endswith(f"Received: k={value!r}")


def test_check_int_with_allow_none_passes_none_and_says_so():
    assert check_int("block_size", None, allow_none=True) is None
    assert check_int("block_size", np.int32(4), allow_none=True) == 4
    with pytest.raises(ValueError, match=r"`block_size` must be an integer >= 1 or None\. "
                                         r"Received: block_size=0"):
        check_int("block_size", 0, allow_none=True)
    with pytest.raises(ValueError, match="must be an integer >= 1. Received: k=None"):
        check_int("k", None)


@pytest.mark.parametrize("value,expected", [
    (1, True), (0.5, True), (np.float32(2.0), True), (np.int64(3), True),
    (True, False), (np.bool_(True), False), ("1", False), (None, False), (1j, False),
])
def test_is_number_accepts_real_numbers_but_not_bools(value, expected):
    assert is_number(value) is expected


def test_at_indices_shows_at_most_five():
    assert at_indices([3]) == "index 3"
    assert at_indices([1, 2]) == "indices 1, 2"
    assert at_indices(list(range(7))) == "indices 0, 1, 2, 3, 4, ..."


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
