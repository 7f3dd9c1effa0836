"""The extreme-triplet example scripts run end to end on generated data (``--smoke``)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "extreme_triplet"


def _run(script, *flags):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(FOLDER / script), "--smoke", "--verbose", "0",
                           *flags], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_train_smoke_writes_results_figures_and_a_savedmodel(tmp_path):
    _run("train.py", "--scatter", "--order", "1", "--mining", "EPSHN", "--output-dir",
         str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["name"] == "1st order EPSHN" and results["smoke"]
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
    _run("movement.py", "--mining", "EPEN", "--output-dir", str(tmp_path))
    results = json.loads((tmp_path / "movement.json").read_text())
    assert results["name"] == "1st order EPEN" and results["triplets"] > 0
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
