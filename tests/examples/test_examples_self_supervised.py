"""examples/self_supervised/pretrain_digits.py runs end to end with --smoke under every
Keras backend, and writes its results whole."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs an example script

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "self_supervised" / "pretrain_digits.py"


@pytest.mark.parametrize("backend, algorithm, views", [
    ("tensorflow", "simclr", "numpy"),
    ("jax", "simsiam", "layer"),
    ("torch", "barlow", "layer"),
])
def test_pretrain_digits_smoke(tmp_path, backend, algorithm, views):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--verbose", "0", "--algorithms", algorithm,
         "--views", views, "--output-dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["smoke"] is True and results["backend"] == backend
    (run,) = results["runs"]
    assert run["algorithm"] == algorithm
    for key in ("knn_untrained", "knn_pretrained"):
        assert 0.1 < run[key] <= 1.0, run  # ten classes: chance is 0.1
    assert math.isfinite(run["final_loss"]) and 0 < run["final_output_std"] < 1, run
    assert not list(tmp_path.glob("*.tmp"))
