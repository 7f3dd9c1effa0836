"""examples/digits_baselines.py: the raw pixels and the untrained network of a digits run."""

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.slow  # runs an example script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "digits_baselines.py"
FLAGS = ["--dataset", "digits", "--backbone", "tiny", "--weights", "none", "--image-size", "8",
         "--resize-size", "8", "--transform", "none", "--embedding-dim", "16"]


def _load_script():
    spec = importlib.util.spec_from_file_location("digits_baselines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(table, name):
    return next(line for line in table.splitlines() if line.startswith(f"| {name} |"))


def test_prints_the_baselines_of_each_seed_and_their_mean(capsys):
    module = _load_script()
    rows = module.main(["--seeds", "0", "1", "--", *FLAGS])
    out = capsys.readouterr().out
    assert list(rows) == ["raw pixels", "untrained (seed 0)", "untrained (seed 1)"]
    assert "| baseline | R@1 | R@2 | R@4 | R@8 | MAP@R | NMI | F1 |" in out
    assert _row(out, "raw pixels").startswith("| raw pixels | 99.44 |")  # cosine on the pixels
    mean = _row(out, "untrained (mean ± std over seeds 0, 1)")
    assert mean.count("±") == 1 + 7 and "sample std" in out  # the label and 7 columns
    # The raw pixels do not depend on the seeds; a seed's network is the same call after call.
    again = module.main(["--seeds", "1", "--decimals", "1", "--", *FLAGS])
    assert again["raw pixels"] == rows["raw pixels"]
    assert again["untrained (seed 1)"] == rows["untrained (seed 1)"]
    assert "untrained (mean" not in capsys.readouterr().out  # one seed: no mean


@pytest.mark.parametrize(("argv", "message"), [
    (["--seeds", "0", "--", *FLAGS, "--margin", "0.2"], "--margin 0.2"),
    (["--seeds", "0", "--", *FLAGS, "--seed", "3"], "--seeds"),
    (["--seeds", "-1", "--", *FLAGS], "--seeds"),
    (["--seeds", "0", "0", "--", *FLAGS], "--seeds"),
])
def test_refuses_flags_it_cannot_honour(argv, message, capsys):
    module = _load_script()
    with pytest.raises(SystemExit):
        module.main(argv)
    assert message in capsys.readouterr().err
