"""examples/digits_losses.py: every loss trains through MetricModel and gives a finite table."""

import importlib.util
import math
import pathlib

import pytest

pytestmark = pytest.mark.slow  # runs an example script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "digits_losses.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("digits_losses", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_losses_table_has_finite_recall_per_loss(capsys):
    module = _load_script()
    results = module.main(["--epochs", "1", "--steps-per-epoch", "3"])
    out = capsys.readouterr().out
    assert list(results) == ["raw pixels", "before training", *module.LOSSES]
    for name, row in results.items():
        for column in ("R@1", "R@2", "R@4", "R@8", "MAP@R"):
            assert math.isfinite(row[column]) and 0.0 <= row[column] <= 1.0, (name, row)
        assert row["R@1"] <= row["R@2"] <= row["R@4"] <= row["R@8"], (name, row)
        if name not in ("raw pixels", "before training"):
            assert math.isfinite(row["final_loss"]), (name, row)
    table = out[out.index("| loss |"):]
    assert "| raw pixels | 99.4 |" in table  # cosine on the pixels: no training involved
    for name in module.LOSSES:
        line = next(line for line in table.splitlines() if line.startswith(
            f"| {module.LABELS[name]} |"))
        recall_at_1 = float(line.split("|")[2])
        assert math.isfinite(recall_at_1), line


def test_refuses_sizes_below_one(capsys):
    import pytest

    for flag in ("--epochs", "--steps-per-epoch", "--embedding-dim", "--learning-rate"):
        with pytest.raises(SystemExit) as info:
            _load_script().main([flag, "0"])
        assert info.value.code == 2 and flag in capsys.readouterr().err
