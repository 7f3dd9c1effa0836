"""The FAPPY example scripts (examples/fappy/) run end to end with --smoke."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs an example script

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples" / "fappy"


def _start(script, *flags):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MPLBACKEND": "Agg",
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.Popen([sys.executable, str(SCRIPTS / script), *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc):
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


def _results(folder):
    path = folder / "results.json"
    assert path.exists()
    results = json.loads(path.read_text())
    assert results["smoke"] is True
    assert results["metrics"]
    assert all(math.isfinite(v) for v in results["metrics"].values()), results["metrics"]
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three smoke runs at once (each is mostly TensorFlow start-up)."""
    tmp = tmp_path_factory.mktemp("fappy")
    dirs = {"train": tmp / "train", "table1": tmp / "table1", "table2": tmp / "table2"}
    procs = [
        _start("train.py", "--smoke", "--epochs", "1", "--loss", "fappy", "--min-bin-width",
               "0.001", "--output-dir", str(dirs["train"])),
        _start("table2.py", "--smoke", "--epochs", "1", "--only", "fappy-0.01", "--no-export",
               "--output-dir", str(dirs["table2"])),
        _start("table1.py", "--smoke", "--epochs", "1", "--no-export", "--only", "histogram",
               "--output-dir", str(dirs["table1"])),
    ]
    return dirs, [_finish(p) for p in procs]


def test_train_smoke_writes_finite_recall_and_a_saved_model(runs):
    dirs, _ = runs
    results = _results(dirs["train"])
    assert results["name"] == "FAPPY 0.001"
    assert results["loss"] == "fappy" and results["min_bin_width"] == 0.001
    assert "val_recall@1" in results["metrics"]
    assert (dirs["train"] / "results.md").exists()
    assert (dirs["train"] / "saved_model").is_dir()
    assert (dirs["train"] / "figures" / "metrics.png").exists()


def test_vehicleid_smoke_has_match_rates_and_the_small_cmc(runs):
    dirs, _ = runs
    run_dir = dirs["table2"] / "fappy-0.01"
    results = _results(run_dir)
    assert results["dataset"] == "vehicleid"
    metrics = results["metrics"]
    for size in ("small", "medium", "large"):
        for k in (1, 5):
            assert 0 <= metrics[f"val_{size}_top{k}"] <= 1
    curve = results["cmc_small"]
    assert len(curve) >= 5 and all(math.isfinite(v) for v in curve)
    assert all(b >= a - 1e-12 for a, b in zip(curve[:-1], curve[1:], strict=True))
    # Same gallery draws as the match rate: the CMC at ranks 1 and 5 is the top-1/top-5 rate.
    assert curve[0] == pytest.approx(metrics["val_small_top1"], abs=1e-9)
    assert curve[4] == pytest.approx(metrics["val_small_top5"], abs=1e-9)
    assert "figures/cmc_small.png" in results["figures"]
    assert (run_dir / "figures" / "cmc_small.png").exists()
    assert "CMC of the small test set" in (run_dir / "results.md").read_text()
    assert (dirs["table2"] / "cmc_small.png").exists()
    rows = json.loads((dirs["table2"] / "sweep.json").read_text())
    assert [r["run"] for r in rows] == ["fappy-0.01"]


def test_table1_smoke_tabulates_the_selected_losses(runs):
    dirs, _ = runs
    rows = json.loads((dirs["table1"] / "sweep.json").read_text())
    assert [r["run"] for r in rows] == ["histogram"]
    assert [r["method"] for r in rows] == ["Histogram"]
    for row in rows:
        assert math.isfinite(row["val_recall@1"])
        _results(dirs["table1"] / row["run"])
    assert "val_recall@1" in (dirs["table1"] / "sweep.md").read_text()


def _load_train():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fappy_train", SCRIPTS / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paper_defaults_and_the_cmc_matches_the_match_rate():
    import numpy as np

    import tfdml

    train = _load_train()
    args = train.resolve_defaults(train.make_parser().parse_args(["--dataset", "vehicleid"]))
    assert (args.backbone, args.embedding_dim, args.learning_rate) == ("vgg16", 1024, 5e-4)
    assert args.batch_size == 150 and args.classes_per_batch * args.samples_per_class == 150
    args = train.resolve_defaults(train.make_parser().parse_args([]))
    assert (args.dataset, args.backbone, args.embedding_dim, args.batch_size) == (
        "cub200", "inception_v3", 512, 128)
    assert (args.optimizer, args.momentum, args.weight_decay) == ("sgd", 0.9, 2e-4)
    assert isinstance(train.make_loss(args), tfdml.losses.FAPPYLoss)

    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(12), rng.integers(1, 6, size=12))
    emb = rng.normal(size=(len(labels), 8)).astype(np.float32) + labels[:, None] * 0.2
    curve = train.vehicleid_cmc(emb, labels, top_k=8, seed=3)
    rates = tfdml.metrics.vehicleid_match_rate(emb, labels, ks=(1, 5), seed=3)
    assert curve[0] == pytest.approx(rates[1]) and curve[4] == pytest.approx(rates[5])


def test_batch_flags_are_honoured():
    train = _load_train()
    args = train.check_args(["-P", "4", "-K", "2"])
    assert (args.classes_per_batch, args.samples_per_class, args.batch_size) == (4, 2, 8)
    args = train.check_args(["--batch-size", "64"])  # CUB: K = 8
    assert (args.classes_per_batch, args.samples_per_class, args.batch_size) == (8, 8, 64)
    args = train.check_args(["-P", "5", "--batch-size", "40"])
    assert (args.classes_per_batch, args.samples_per_class) == (5, 8)
    args = train.check_args(["--dataset", "vehicleid", "--loss", "triplet", "--margin", "0.3",
                             "--cmc-top-k", "10"])
    assert (args.margin, args.cmc_top_k, args.batch_size) == (0.3, 10, 150)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["-P", "4", "-K", "2", "--batch-size", "128"], "--batch-size 128"),
        (["-P", "4", "--batch-size", "128"], "--batch-size 128"),  # K = 8: 32 images
        (["--batch-size", "100"], "--batch-size 100"),
        (["--margin", "0.3"], "--margin"),  # FAPPY has no margin
        (["--loss", "triplet", "--min-bin-width", "0.001"], "--min-bin-width"),
        (["--loss", "fappy", "--bin-width", "0.02"], "--bin-width"),
        (["--loss", "lifted", "--positive-margin", "0.1"], "--positive-margin"),
        (["--cmc-top-k", "10"], "--cmc-top-k"),  # VehicleID only
    ],
)
def test_flags_that_conflict_or_would_be_ignored_are_refused(argv, named, capsys):
    train = _load_train()
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    assert named in capsys.readouterr().err
