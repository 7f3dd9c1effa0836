"""The class-collapse training scripts (train.py, tables.py, positives.py, trimmed.py) run
end to end with ``--smoke`` (synthetic data, a tiny CNN, a few steps)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from experiments import saved_arrays

pytestmark = pytest.mark.slow  # runs an example script

FOLDER = pathlib.Path(__file__).resolve().parents[2] / "examples" / "class_collapse"
# One epoch of two steps per run keeps the four subprocesses (seven runs) near a minute.
SMOKE = ["--smoke", "--no-export", "--verbose", "0", "--epochs", "1"]


def _run(script, args, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(FOLDER / script), *SMOKE, *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _check_results(folder, method):
    results = json.loads((folder / "results.json").read_text())
    assert results["name"] == method
    assert results["smoke"] is True
    metrics = results["metrics"]
    for key in ("val_recall@1", "val_map@r", "val_nmi", "val_nmi_plus"):
        assert math.isfinite(metrics[key]) and 0 <= metrics[key] <= 1, (key, metrics[key])
    return results


def test_margin_loss_eps_learns_a_beta_per_class(tmp_path):
    out = tmp_path / "margin"
    _run("train.py", ["--loss", "margin", "--eps", "--trim", "0.25", "--beta-lr", "0.01",
                      "--output-dir", str(out)], tmp_path)
    results = _check_results(out, "EPS + Dist-Margin + trimmed 0.25")
    config = results["config"]
    assert config["loss"] == "margin" and config["eps"] is True and config["trim"] == 0.25
    # The smoke data trains on classes 0-5: one beta per class, read from the data.
    assert config["num_classes"] == 6
    beta = np.asarray(results["beta"]["values"])
    assert beta.shape == (6,)
    assert np.all(np.isfinite(beta)) and np.max(np.abs(beta - 1.2)) > 1e-4, beta
    # The learned beta is part of the saved weights (stored as beta / beta_lr_multiplier).
    multiplier = 0.01 / config["learning_rate"]
    saved = [v for k, v in saved_arrays(out / "best.weights.h5").items() if "beta" in k]
    assert len(saved) == 1, "no beta in the saved weights"
    np.testing.assert_allclose(saved[0].reshape(-1) * multiplier, beta, rtol=1e-5)


def test_tables_sweep_runs_each_loss_with_and_without_eps(tmp_path):
    out = tmp_path / "tables"
    _run("tables.py", ["--losses", "ms", "--output-dir", str(out)], tmp_path)
    for run, method in [("ms-base", "MS"), ("ms-eps", "EPS + MS")]:
        results = _check_results(out / f"{run}-s0", method)
        assert results["config"]["eps"] is run.endswith("eps")
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in summary] == ["ms-base", "ms-eps"]
    assert all(math.isfinite(r["val_recall@1"]) for r in summary)
    assert (out / "summary.md").exists() and (out / "sweep.md").exists()


@pytest.mark.parametrize("script, args, runs", [
    ("positives.py", ["--ks", "4", "--batch-size", "8"],
     {"K4-s0": "EPS + Dist-Margin", "K4-base-s0": "Dist-Margin"}),
    ("trimmed.py", ["--losses", "triplet", "--trims", "0.25"],
     {"triplet-trim0.25-s0": "Trip. + SH + trimmed 0.25", "triplet-eps-s0": "EPS + Trip. + SH"}),
])
def test_figure_sweeps(tmp_path, script, args, runs):
    out = tmp_path / "sweep"
    _run(script, [*args, "--output-dir", str(out)], tmp_path)
    for run, method in runs.items():
        _check_results(out / run, method)
    figure = {"positives.py": "positives.png", "trimmed.py": "trimmed.png"}[script]
    assert (out / figure).stat().st_size > 1000
    if script == "positives.py":
        config = json.loads((out / "K4-s0" / "results.json").read_text())["config"]
        assert (config["classes_per_batch"], config["samples_per_class"]) == (2, 4)


def _train_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("class_collapse_train", FOLDER / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_and_loss_flags_are_honoured():
    train = _train_module()
    check = lambda argv: train.check_args(train.make_parser(), argv)  # noqa: E731
    args = check([])
    assert (args.classes_per_batch, args.samples_per_class) == (20, 8)
    args = check(["-P", "4", "-K", "2"])
    assert (args.classes_per_batch, args.samples_per_class) == (4, 2)
    args = check(["--batch-size", "64", "-K", "16"])
    assert (args.classes_per_batch, args.samples_per_class) == (4, 16)
    args = check(["--no-eps", "--baseline-positive", "hard", "--loss", "ms", "--ms-beta", "40"])
    assert (args.baseline_positive, args.ms_beta) == ("hard", 40.0)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["-P", "5", "--batch-size", "160"], "--batch-size 160"),  # K = 8: 40 images
        (["--batch-size", "100"], "--batch-size 100"),
        (["--baseline-positive", "hard"], "--baseline-positive"),  # ignored with --eps
        (["--loss", "triplet", "--beta", "1.0"], "--beta"),
        (["--loss", "ms", "--margin", "0.1"], "--margin"),
        (["--loss", "margin", "--ms-alpha", "3"], "--ms-alpha"),
        (["--shared-beta", "--num-classes", "10"], "--num-classes"),
        (["--trim", "1.5"], "--trim"),
    ],
)
def test_flags_that_conflict_or_would_be_ignored_are_refused(argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        _train_module().main(argv)
    assert info.value.code == 2
    assert named in capsys.readouterr().err
