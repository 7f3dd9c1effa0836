"""examples/multi_label/digits_tags.py runs end to end with --smoke under every Keras backend
and writes its results whole."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs an example script

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "multi_label" / "digits_tags.py"


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])  # JAX: the loss and metric tests
def test_digits_tags_smoke(tmp_path, backend):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--output-dir",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["smoke"] is True and results["backend"] == backend
    (run,) = results["runs"]
    for name, scores in run["labels"].items():
        for key in ("map@10", "graded_map@10", "same_set_map@10", "recall@1"):
            assert 0.0 < scores[key] <= 1.0, (name, scores)
        if name != "untrained":
            assert math.isfinite(scores["final_loss"]), (name, scores)
    for name, scores in run["categories"].items():
        assert 0.1 < scores["recall@1"] <= 1.0, (name, scores)  # ten digits: chance 0.1
    assert not list(tmp_path.glob("*.tmp"))
