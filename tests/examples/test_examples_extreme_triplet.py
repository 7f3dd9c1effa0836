"""The extreme-triplet example scripts run end to end on generated data (``--smoke``)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.slow  # runs an example script

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = ROOT / "examples" / "extreme_triplet"


def _run(script, *flags):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(FOLDER / script), "--smoke", "--verbose", "0",
                           *flags], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_train_smoke_writes_results_figures_and_a_savedmodel(tmp_path):
    _run("train.py", "--scatter", "--order", "1", "--mining", "EPSHN", "-P", "2", "-K", "3",
         "--output-dir", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["name"] == "1st order EPSHN" and results["smoke"]
    # -P and -K are honoured (they used to be replaced by --batch-size / --group-size).
    assert (results["config"]["classes_per_batch"], results["config"]["samples_per_class"]) == (
        2, 3)
    assert results["epochs_run"] == [1, 2, 3]
    assert all(math.isfinite(v) for v in results["metrics"].values())
    assert {"val_recall@1", "val_map@r", "val_nmi", "val_f1"} <= set(results["metrics"])
    assert "figures/scatter.png" in results["figures"]
    for name in ("results.md", "history.csv", "figures/metrics.png", "figures/scatter.png",
                 "best.weights.h5"):
        assert (tmp_path / name).exists(), name
    # The export serves raw uint8 images.
    served = tf.saved_model.load(str(tmp_path / "saved_model"))
    images = np.random.default_rng(0).integers(0, 255, (3, 28, 28, 3), dtype=np.uint8)
    emb = served.signatures["serving_default"](images=tf.constant(images))["embeddings"]
    np.testing.assert_allclose(np.linalg.norm(emb.numpy(), axis=1), 1.0, rtol=1e-5)


def test_movement_smoke(tmp_path):
    _run("movement.py", "--mining", "EPEN", "-P", "3", "-n", "2", "--output-dir", str(tmp_path))
    results = json.loads((tmp_path / "movement.json").read_text())
    assert results["name"] == "1st order EPEN" and results["triplets"] > 0
    assert (results["config"]["classes_per_batch"], results["config"]["samples_per_class"]) == (
        3, 2)
    shares = [results["total"][d] for d in ("up_right", "up_left", "down_left", "down_right",
                                            "still")]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-9)
    assert (tmp_path / "figures" / "movement.png").exists()


def test_figure4_smoke(tmp_path):
    _run("figure4.py", "--output-dir", str(tmp_path))
    rows = json.loads((tmp_path / "figure4.json").read_text())
    assert [(r["order"], r["mining"], r["n"]) for r in rows] == [
        (1, "EPHN", 2), (1, "EPHN", 4), (2, "EPHN", 2), (2, "EPHN", 4)]
    assert all(0 <= r["recall@1"] <= 1 for r in rows)
    assert (tmp_path / "figure4.png").exists()
    group = json.loads((tmp_path / "order2-EPHN" / "n4" / "results.json").read_text())
    assert group["config"]["samples_per_class"] == 4


# -- flags: the ones given are honoured, conflicting or ignored ones are refused ---------------


def _load(script):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"extreme_triplet_{script[:-3]}",
                                                  FOLDER / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolved(argv):
    train = _load("train.py")
    args = train.check_args(argv)
    return args.classes_per_batch, args.samples_per_class, args.learning_rate


def test_train_batch_flags_are_honoured():
    assert _resolved(["-P", "2", "-K", "3"])[:2] == (2, 3)
    assert _resolved(["-P", "2", "--group-size", "3"])[:2] == (2, 3)
    assert _resolved(["-P", "4", "-K", "3", "--batch-size", "12"])[:2] == (4, 3)
    assert _resolved(["-K", "4"])[:2] == (32, 4)  # the default batch of 128
    assert _resolved(["-n", "4", "--batch-size", "64"])[:2] == (16, 4)
    assert _resolved(["--dataset", "cars196"])[:2] == (8, 16)  # the paper's n
    assert _resolved([]) == (16, 8, 0.0025)  # CUB: the paper's n and learning rate
    assert _resolved(["--lr", "0.005"])[2] == 0.005  # a given rate is kept, even on CUB


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["-P", "2", "-K", "3", "--batch-size", "128"], "--batch-size 128"),
        (["-K", "3", "--group-size", "4"], "--group-size 4"),
        (["-K", "3"], "the default --batch-size 128"),
        (["--batch-size", "100", "-n", "8"], "--batch-size 100"),
        (["--loss", "margin", "--order", "1"], "--order"),
        (["--loss", "margin", "--temperature", "0.1"], "--temperature"),
        (["--margin", "0.3"], "--margin"),
        (["--group-size", "0"], "--group-size"),
    ],
)
def test_train_refuses_flags_that_conflict_or_would_be_ignored(argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        _load("train.py").main(argv)
    assert info.value.code == 2  # an argparse error, before any data or model
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["-P", "2", "-n", "3", "--batch-size", "128"], "--batch-size 128"),
        (["--optimizer", "adam"], "--optimizer"),
        (["--lr-milestones", "1"], "--lr-milestones"),
    ],
)
def test_movement_refuses_flags_that_conflict_or_would_be_ignored(argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        _load("movement.py").main(["--smoke", *argv])
    assert info.value.code == 2
    assert named in capsys.readouterr().err


def test_a_sweep_checks_every_run_before_the_first(tmp_path, capsys):
    import experiments

    ran = []
    runs = {"nca": [], "margin": ["--loss", "margin"]}  # --order is the NCA loss's only
    with pytest.raises(SystemExit):
        experiments.sweep(lambda argv: ran.append(argv), ["--order", "1"], runs, tmp_path,
                          check=_load("train.py").check_args)
    assert ran == [] and not list(tmp_path.iterdir())
    err = capsys.readouterr().err
    assert "run 'margin'" in err and "--order" in err
