"""examples/digits_demo.py: held-out Recall@1 rises after training, next to the raw pixels."""

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.slow  # runs an example script

DEMO = pathlib.Path(__file__).resolve().parents[2] / "examples" / "digits_demo.py"


def _load_demo():
    spec = importlib.util.spec_from_file_location("digits_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_recall_rises_on_held_out_digits(capsys):
    raw, before, after = _load_demo().main([])
    out = capsys.readouterr().out
    assert set(raw) == set(before) == set(after) == {1, 2, 4, 8}
    assert after[1] > before[1], (before, after)
    assert "Recall@K on the held-out digits 6-9" in out
    # The raw pixels are printed with the two runs, and on these digits they retrieve better
    # than the trained embedding, which the script then says plainly.
    assert "raw pixels       R@1" in out
    assert raw[1] > after[1], (raw, after)
    assert "not that training helps" in out


def test_demo_refuses_sizes_below_one(capsys):
    import pytest

    for flag in ("--epochs", "--steps-per-epoch", "--classes-per-batch", "--samples-per-class"):
        with pytest.raises(SystemExit) as info:
            _load_demo().main([flag, "0"])
        assert info.value.code == 2 and flag in capsys.readouterr().err
