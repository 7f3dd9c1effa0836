"""A killed example run resumes from its last finished epoch and ends like an uninterrupted one."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfdml.experiments import saved_arrays

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "extreme_triplet" / "train.py"
EPOCHS = 3


def _command(out):
    return [sys.executable, str(SCRIPT), "--smoke", "--deterministic", "--epochs", str(EPOCHS),
            "--steps-per-epoch", "40", "--no-export", "--verbose", "2", "--output-dir", str(out)]


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _state(out):
    try:
        return json.loads((out / "backup" / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_killed_run_resumes_without_losing_or_repeating_an_epoch(tmp_path):
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight), env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_command(killed), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        state = _state(killed)
        if state is not None and state["epoch"] >= 1:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    saved = _state(killed)
    assert saved is not None and 1 <= saved["epoch"] < EPOCHS, (
        f"the kill did not land between epochs 1 and {EPOCHS}: {saved and saved['epoch']}")
    assert not (killed / "results.json").exists()

    resumed = subprocess.run(_command(killed), env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"after epoch {saved['epoch']} of {EPOCHS}" in resumed.stdout
    # Keras' progress lines: only the epochs after the saved one ran again.
    ran = [int(line.split()[1].split("/")[0]) for line in resumed.stdout.splitlines()
           if line.startswith("Epoch ") and "/" in line.split()[1]]
    assert ran == list(range(saved["epoch"] + 1, EPOCHS + 1))

    results = json.loads((killed / "results.json").read_text())
    assert results["epochs_run"] == list(range(1, EPOCHS + 1))
    rows = (killed / "history.csv").read_text().splitlines()
    assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(1, EPOCHS + 1))
    # Same batches, same steps: the weights of the uninterrupted run.
    want = saved_arrays(straight / "backup" / f"ckpt-{EPOCHS}" / "model.weights.h5")
    got = saved_arrays(killed / "backup" / f"ckpt-{EPOCHS}" / "model.weights.h5")
    assert want.keys() == got.keys() and want
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    straight_results = json.loads((straight / "results.json").read_text())
    for key, value in straight_results["metrics"].items():
        assert results["metrics"][key] == pytest.approx(value, abs=1e-6), key
