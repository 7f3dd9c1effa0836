"""benchmarks/glyph_losses.py and glyph_losses_pml.py: the smoke run, the export that the
PyTorch side trains from (weights, batches, images), the Keras -> PyTorch weight port and
the NumPy retrieval metrics of the PyTorch side against tfdml's."""

import importlib.util
import json
import pathlib

import keras
import numpy as np
import pytest

import tfdml

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load("glyph_losses")


@pytest.fixture(scope="module")
def pml_side():
    return _load("glyph_losses_pml")


def test_pml_side_imports_neither_tfdml_nor_keras():
    source = (BENCHMARKS / "glyph_losses_pml.py").read_text()
    for module in ("tfdml", "keras", "tensorflow"):
        assert f"import {module}" not in source and f"from {module}" not in source


def test_both_sides_have_the_same_hyperparameters(bench, pml_side):
    assert bench.PARAMS == pml_side.PARAMS
    assert list(bench.LOSSES) == list(bench.PARAMS) == list(bench.PML_WRITTEN)


@pytest.mark.parametrize("ties", [False, True])
def test_numpy_metrics_equal_tfdml_metrics(pml_side, ties):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(40), rng.integers(2, 9, size=40))
    centers = rng.normal(size=(40, 16))
    x = (centers[labels] + rng.normal(scale=1.2, size=(len(labels), 16))).astype(np.float32)
    if ties:  # repeated rows: ties broken to the lower index by both
        x = np.round(x[rng.integers(0, len(x) // 3, size=len(x))], 0)
        labels = labels[rng.permutation(len(labels))]
    got = pml_side.retrieval(x, labels, chunk_size=37)
    want = {"recall@1": float(tfdml.metrics.recall_at_k(x, labels, ks=(1,))[1]),
            "map@r": float(tfdml.metrics.map_at_r(x, labels))}
    assert got["recall@1"] == pytest.approx(want["recall@1"], abs=1e-6)
    assert got["map@r"] == pytest.approx(want["map@r"], abs=1e-6)
    assert 0.0 < got["map@r"] < 1.0


def test_keras_weights_port_to_pytorch(bench, pml_side):
    torch = pytest.importorskip("torch")
    keras.utils.set_random_seed(3)
    model = bench.recipe.build_cnn(28, 64)
    images = np.random.default_rng(1).random((32, 28, 28, 1), dtype=np.float32)
    # Non-trivial batch-norm statistics, so that the running mean and variance matter.
    model(images, training=True)
    port = pml_side.build_cnn(64, 28)
    pml_side.load_keras_weights(port, model.get_weights())
    inputs = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    port.eval()
    with torch.no_grad():
        ours = port(inputs).numpy()
    theirs = keras.ops.convert_to_numpy(model(images, training=False))
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)
    port.train()  # batch statistics: the first training step's forward pass
    with torch.no_grad():
        ours = port(inputs).numpy()
    theirs = keras.ops.convert_to_numpy(model(images, training=True))
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)


def test_markdown_keeps_the_text_around_the_table(bench, tmp_path):
    run = {"trained": {"recall@1": 0.8, "map@r": 0.3}, "untrained": {"recall@1": 0.4,
                                                                      "map@r": 0.1},
           "seconds": 80.0, "seed": 0}
    ours = {"recipe": dict(bench.recipe.RECIPE), "machine": "m", "command": ["python", "x"],
            "date": "d", "baselines": {"raw_pixels": {"recall@1": 0.5, "map@r": 0.1},
                                       "untrained": {"0": run["untrained"]}},
            "runs": {"supcon": {"0": run, "1": {**run, "seed": 1}}}}
    pml = {"machine": "t", "command": ["python", "y"], "date": "d",
           "baselines": {"raw_pixels": {"recall@1": 0.5, "map@r": 0.1}},
           "runs": {"supcon": {"0": {**run, "first_loss": 4.0, "first_loss_tfdml": 4.0,
                                     "first_grad_difference": 1e-6}}}}
    path = tmp_path / "table.md"
    path.write_text(f"# Title\n\nbefore\n\n{bench.MARK_BEGIN}\nold\n{bench.MARK_END}\n\nafter\n")
    ours["runs"]["arcface"] = {"0": run}
    own = {"runs": {"arcface": {"0": {**run, "trained": {"recall@1": 0.7, "map@r": 0.2}}}}}
    bench.write_markdown(str(path), ours, pml, own)
    text = path.read_text()
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in text
    row = next(line for line in text.splitlines() if line.startswith("| SupCon |"))
    assert "0.800 ± 0.000" in row and "2 / 1" in row and "4 / 4; gradient 1e-06" in row
    own_row = next(line for line in text.splitlines()
                   if line.startswith("| ArcFace | normal, std 1 |"))
    assert "0.700 ± 0.000 | n/a | 0.800 ± 0.000" in own_row


def test_refuses_bad_arguments(bench, capsys):
    for argv in (["--steps", "150"], ["--steps", "0"], ["--seeds", "-1"], ["--export-only"]):
        with pytest.raises(SystemExit) as info:
            bench.main(argv)
        assert info.value.code == 2, argv
    capsys.readouterr()


def test_export_round_trip(bench, tmp_path):
    """The export reloads into a fresh Keras CNN with the same predictions, and holds the
    batches `fit` gets from `PKDataset`, the images as tfdml loads them, the class vectors
    and each loss's first-batch value and gradient."""
    npz = tmp_path / "g.npz"
    fingerprints = bench.main(["--smoke", "--export", str(npz), "--export-only"])
    data = np.load(npz)
    meta = json.loads(str(data["meta"]))
    assert meta["losses"] == list(bench.SMOKE_LOSSES) and meta["seeds"] == [0]
    assert meta["fingerprints"] == {"0": fingerprints[0]}
    assert meta["params"] == {name: bench.PARAMS[name] for name in bench.SMOKE_LOSSES}
    train, test = bench.recipe.load_data(**bench.SMOKE_DATA)
    np.testing.assert_array_equal(data["train_images"].astype(np.float32) / 255.0,
                                  train.images[..., 0])
    np.testing.assert_array_equal(data["test_images"].astype(np.float32) / 255.0,
                                  test.images[..., 0])
    np.testing.assert_array_equal(data["train_labels"], train.labels)
    np.testing.assert_array_equal(data["test_labels"], test.labels)

    weights = [data[f"seed0/cnn/{i}"] for i in range(len(meta["weight_names"]))]
    keras.utils.set_random_seed(123)  # other weights first, then the exported ones
    fresh = bench.recipe.build_cnn(28, 64)
    assert bench.fingerprint(fresh.get_weights()) != fingerprints[0]["cnn"]
    fresh.set_weights(weights)
    assert bench.fingerprint(fresh.get_weights()) == fingerprints[0]["cnn"]
    np.testing.assert_array_equal(bench.recipe.embed(fresh, test), data["seed0/untrained"])

    vectors = data["seed0/vectors/arcface"]
    assert vectors.shape == (int(train.labels.max()) + 1, 64)
    assert fingerprints[0]["arcface"] == bench.fingerprint([vectors])
    assert "seed0/vectors/contrastive" not in data

    batches = data["seed0/batches"]
    assert batches.shape == (bench.SMOKE_STEPS, 64)
    dataset = tfdml.data.PKDataset(train, 16, 4, seed=0)
    for step in (0, 1, bench.SMOKE_STEPS - 1):
        images, labels = dataset[step]
        np.testing.assert_array_equal(labels, train.labels[batches[step]])
        np.testing.assert_array_equal(images, train.images[batches[step]])

    # The first-batch value: the loss on the training-mode forward pass of batch 0.
    fresh.set_weights(weights)
    embeddings = fresh(train.images[batches[0]], training=True)
    loss = bench.build_loss("contrastive", int(train.labels.max()) + 1, 64)
    value = float(keras.ops.convert_to_numpy(loss(train.labels[batches[0]], embeddings)))
    assert meta["first_loss"]["0"]["contrastive"] == pytest.approx(value, rel=1e-6)
    if keras.backend.backend() == "tensorflow":
        assert data["seed0/first_grad/contrastive"].shape == (64, 64)


@pytest.mark.slow
def test_smoke_run(bench, tmp_path):
    """The smoke run trains each loss, checks that each run starts from the exported
    weights (it raises otherwise), and writes the results and the table."""
    npz, out, md = tmp_path / "g.npz", tmp_path / "r.json", tmp_path / "r.md"
    results = bench.main(["--smoke", "--export", str(npz), "--output", str(out),
                          "--markdown", str(md), "--pml-results", str(tmp_path / "none")])
    assert set(results["runs"]) == set(bench.SMOKE_LOSSES)
    saved = json.loads(out.read_text())
    meta = json.loads(str(np.load(npz)["meta"]))
    for name in bench.SMOKE_LOSSES:
        run = saved["runs"][name]["0"]
        assert 0.0 < run["trained"]["recall@1"] <= 1.0 and np.isfinite(run["final_loss"])
        assert run["fingerprints"]["cnn"] == meta["fingerprints"]["0"]["cnn"]
    assert saved["runs"]["arcface"]["0"]["fingerprints"]["vectors"] == \
        meta["fingerprints"]["0"]["arcface"]
    text = md.read_text()
    assert "| Contrastive |" in text and "| ArcFace |" in text and "| raw pixels |" in text
