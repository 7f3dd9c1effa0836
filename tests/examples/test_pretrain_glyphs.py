"""examples/self_supervised/pretrain_glyphs.py runs end to end with --smoke, both ways of
making the views (Keras layers in the step, its stroke-width layer included, and NumPy views
through TwoViewDataset), and writes its results whole: finite Recall@1 and MAP@R in [0, 1]
for every embedding."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs an example script

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "self_supervised" / "pretrain_glyphs.py"


def _check_metrics(numbers):
    assert set(numbers) == {"recall@1", "map@r"}, numbers
    for value in numbers.values():
        assert math.isfinite(value) and 0.0 <= value <= 1.0, numbers


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_pretrain_glyphs_smoke(tmp_path, backend):
    output = tmp_path / "results.json"
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--verbose", "0",
         "--algorithms", "simclr", "simsiam", "--views", "glyph+stroke", "simclr",
         "--output", str(output)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| raw pixels |" in proc.stdout and "| SimCLR | glyph+stroke |" in proc.stdout

    results = json.loads(output.read_text())
    assert results["smoke"] is True and results["backend"] == backend
    assert results["epochs"] == 1
    assert not list(tmp_path.glob("*.tmp*"))
    _check_metrics(results["raw_pixels"])
    runs = results["runs"]
    assert [(r["algorithm"], r["views"]) for r in runs] == [
        ("simclr", "glyph+stroke"), ("simsiam", "glyph+stroke"), ("simclr", "simclr"),
        ("simsiam", "simclr")]
    for run in runs:
        assert run["seed"] == 0
        _check_metrics(run["untrained"])
        _check_metrics(run["pretrained"])
        assert math.isfinite(run["final_loss"]) and 0 < run["final_output_std"] < 1, run
    # The untrained network of one seed is one network, whatever trains it afterwards.
    assert all(r["untrained"] == runs[0]["untrained"] for r in runs)
    assert set(results["summary"]) == {"simclr/glyph+stroke", "simsiam/glyph+stroke",
                                       "simclr/simclr", "simsiam/simclr"}
    for entry in results["summary"].values():
        assert entry["seeds"] == [0]
        for key in ("untrained", "pretrained"):
            for mean, std in entry[key].values():
                assert 0.0 <= mean <= 1.0 and std == 0.0
