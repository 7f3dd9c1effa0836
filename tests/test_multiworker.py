"""Two MultiWorkerMirroredStrategy workers on localhost end with the same weights."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # subprocesses or several processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_two_workers_on_localhost_agree_with_each_other_and_with_one_device(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "multiworker_digits.py"), "--workers", "2",
         "--epochs", "1", "--steps-per-epoch", "3", "--timeout", "240",
         "--output-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=400)
    report = json.loads((tmp_path / "report.json").read_text())
    logs = "".join((tmp_path / f"worker{i}.log").read_text()[-1500:] for i in range(2))
    assert done.returncode == 0 and report["same_weights"], logs
    assert report["exit_codes"] == [0, 0, 0]
    assert report["variables"] > 0 and report["max_difference_between_workers"] <= 1e-6
    # The workers' summed steps are single-device training on the same global batches.
    assert report["max_difference_to_one_device"] <= 1e-5
    assert report["recall@1"][0] == report["recall@1"][1]
    # The baselines on the same test images: raw pixels and the untrained network.
    assert 0.0 <= report["untrained_recall@1"] <= 1.0
    assert report["raw_pixels_recall@1"] > 0.99


def test_refuses_counts_below_one(capsys):
    import importlib.util

    import pytest

    script = ROOT / "examples" / "multiworker_digits.py"
    spec = importlib.util.spec_from_file_location("multiworker_digits", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for flag in ("--workers", "--epochs", "--steps-per-epoch", "--timeout"):
        with pytest.raises(SystemExit) as info:
            module.main([flag, "0"])
        assert info.value.code == 2 and flag in capsys.readouterr().err
