"""tfdml._checks: the argument checks every module shares."""

import numpy as np
import pytest

from tfdml._checks import check_choice, check_int


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
