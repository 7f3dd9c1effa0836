"""The LoOp example scripts (examples/loop/) run end to end with --smoke."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs an example script

REPO = pathlib.Path(__file__).resolve().parents[2]
LOOP = REPO / "examples" / "loop"


def _run(script, *flags, cwd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MPLBACKEND": "Agg",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(LOOP / script), "--smoke", "--verbose", "0",
                           *flags], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _results(folder):
    path = pathlib.Path(folder) / "results.json"
    assert path.exists(), f"no {path}"
    results = json.loads(path.read_text())
    assert results["smoke"] is True
    metrics = results["metrics"]
    for key in ("val_recall@1", "val_nmi", "val_f1", "val_map@r"):
        assert math.isfinite(metrics[key]) and 0.0 <= metrics[key] <= 1.0, (key, metrics)
    return results


def test_train_smoke_exports(tmp_path):
    out = tmp_path / "run"
    _run("train.py", "--loss", "hphn", "--output-dir", str(out), cwd=tmp_path)
    results = _results(out)
    assert results["name"] == "LoOp (HPHNtri)"
    assert results["batch_size"] == 16 and results["config"]["samples_per_class"] == 4
    assert results["normalize"] is True and results["loop"] is True
    assert (out / "saved_model" / "saved_model.pb").exists()
    assert (out / "figures" / "metrics.png").exists()


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("loop_train", LOOP / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(train, argv):
    args = train.make_parser().parse_args(argv)
    args.epsilon = 0.1 if args.epsilon is None else args.epsilon
    args.sampling = args.sampling or "rand-disjoint"
    return args


@pytest.mark.parametrize(
    "argv, loss, name",
    [
        ([], "LoOpLoss", "LoOp (Triplet)"),
        (["--loss", "lifted", "--no-loop"], "LiftedStructureLoss", "LS"),
        (["--loss", "ms", "--no-loop"], "MultiSimilarityLoss", "MS"),
        (["--no-loop", "--sampling", "semihard"], "TripletMarginLoss", "Triplet (Semi-hard)"),
        (["--no-loop", "--sampling", "distance-weighted", "--no-normalize"],
         "TripletMarginLoss", "Triplet (Dis-weighted), no l2"),
    ],
)
def test_losses_and_names(train, argv, loss, name):
    args = _args(train, argv)
    made = train.make_loss(args)
    assert type(made).__name__ == loss and train.method_name(args) == name
    assert made.normalize == args.normalize


def test_batch_shape(train):
    assert train.batch_shape(_args(train, ["--dataset", "cub200"])) == (8, 4)
    assert train.batch_shape(_args(train, ["--dataset", "sop"])) == (32, 4)
    assert train.batch_shape(_args(train, ["--batch-size", "64", "-P", "4"])) == (4, 16)
    with pytest.raises(SystemExit):
        train.batch_shape(_args(train, ["-P", "4", "-K", "3"]))  # LoOp needs even K
    with pytest.raises(SystemExit):
        train.main(["--sampling", "semihard"])  # samplers are for the plain triplet loss
    with pytest.raises(SystemExit):
        train.main(["--loss", "ms", "--no-loop", "--epsilon", "-0.02"])


def _written_runs():
    """What the repository's runs/ folder holds (the sweeps' default folder)."""
    return sorted(p.name for p in (REPO / "runs").glob("*")) if (REPO / "runs").is_dir() else []


def test_sweep_tables_smoke(tmp_path):
    # --output-dir is the sweep's folder: nothing goes to runs/ (the default, relative to
    # the working directory) of the working directory or of the repository.
    sweep, cwd = tmp_path / "tables", tmp_path / "cwd"
    cwd.mkdir()
    before = _written_runs()
    _run("sweep_tables.py", "--runs", "triplet", "loop-triplet", "--output-dir", str(sweep),
         "--no-export", "--epochs", "1", cwd=cwd)
    assert not (cwd / "runs").exists() and list(cwd.iterdir()) == []
    assert _written_runs() == before
    assert sorted(p.name for p in sweep.iterdir()) == [
        "loop-triplet-s0", "sweep.json", "sweep.md", "table.md", "triplet-s0"]
    assert _results(sweep / "triplet-s0")["name"] == "Triplet (Rand-disjoint)"
    assert _results(sweep / "loop-triplet-s0")["name"] == "LoOp (Triplet)"
    rows = json.loads((sweep / "sweep.json").read_text())
    assert [r["run"] for r in rows] == ["triplet-s0", "loop-triplet-s0"]
    table = (sweep / "table.md").read_text()
    assert "paper R@1" in table and "50.3" in table  # CUB, LoOp (Triplet)


def test_sweep_figure3_smoke(tmp_path):
    sweep, cwd = tmp_path / "fig3", tmp_path / "cwd"
    cwd.mkdir()
    # Also the unnormalized model (Figure 4's setting) end to end; --sweep-dir is an alias
    # of --output-dir. One (negative) value: a sweep of several runs is test_sweep_tables_smoke.
    _run("sweep_figure3.py", "--figure", "epsilon", "--values", "-0.02",
         "--sweep-dir", str(sweep), "--no-export", "--no-normalize", "--epochs", "1",
         cwd=cwd)
    assert list(cwd.iterdir()) == []
    results = _results(sweep / "epsilon-0.02")
    assert results["name"] == "LoOp (MS), no l2" and results["normalize"] is False
    assert results["batch_size"] == 8  # the panel's batch of 8, K = 4
    assert results["config"]["epsilon"] == -0.02
    assert (sweep / "sweep.png").exists()
    rows = json.loads((sweep / "sweep.json").read_text())
    assert [r["run"] for r in rows] == ["epsilon-0.02"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["-P", "4", "-K", "4", "--batch-size", "32"], "--batch-size 32"),
        (["--loss", "triplet", "--alpha", "3"], "--alpha"),
        (["--loss", "hphn", "--lambda", "0.4"], "--lambda"),
        (["--loss", "lifted", "--epsilon", "0.1"], "--epsilon"),
        (["--loss", "ms", "--margin", "0.3"], "--margin"),
        (["--batch-size", "0"], "--batch-size"),
    ],
)
def test_flags_that_conflict_or_would_be_ignored_are_refused(train, argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    assert named in capsys.readouterr().err


def test_given_flags_are_honoured(train):
    args = train.check_args(train.make_parser(), ["--loss", "ms", "--lambda", "0.4", "-P", "4",
                                                  "-K", "6"])
    assert (args.lam, args.classes_per_batch, args.samples_per_class) == (0.4, 4, 6)
    args = train.check_args(train.make_parser(), ["--margin", "0.3", "--batch-size", "64"])
    assert (args.margin, args.classes_per_batch, args.samples_per_class) == (0.3, 16, 4)
