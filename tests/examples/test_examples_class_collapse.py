"""The class-collapse example (even/odd digits, random vs easy positives) runs end to end."""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # runs an example script

SCRIPT = (pathlib.Path(__file__).resolve().parents[2] / "examples" / "class_collapse"
          / "digits_even_odd.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("digits_even_odd", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def module():
    return _load_script()


def test_splits_are_disjoint_and_stratified(module):
    (x_fit, y_fit), (x_held, y_held), (x_new, y_new) = module.load_splits(0.3, seed=0)
    assert set(np.unique(y_fit)) == set(np.unique(y_held)) == set(range(6))
    assert set(np.unique(y_new)) == {6, 7, 8, 9}
    assert len(y_fit) + len(y_held) == 1083
    assert x_fit.shape[1:] == x_held.shape[1:] == x_new.shape[1:] == (8, 8, 1)
    # Stratified: every digit is held out in (about) the same proportion.
    share = np.bincount(y_held, minlength=6) / np.bincount(np.concatenate([y_fit, y_held]))
    assert np.all(np.abs(share - 0.3) < 0.02), share
    # No training image is also a held-out image.
    fit_rows = {row.tobytes() for row in x_fit.reshape(len(x_fit), -1)}
    assert not any(row.tobytes() in fit_rows for row in x_held.reshape(len(x_held), -1))


def test_model_is_the_papers_small_cnn_with_2d_output(module):
    model = module.build_model()
    assert model.output_shape == (None, 2)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["Conv2D", "ReLU", "BatchNormalization", "Conv2D", "ReLU",
                     "BatchNormalization", "MaxPooling2D", "Flatten", "Dense", "Dense"]
    assert [layer.filters for layer in model.layers if hasattr(layer, "filters")] == [32, 64]
    assert [layer.units for layer in model.layers if hasattr(layer, "units")] == [128, 2]


def test_quick_run_returns_the_table_and_writes_the_figures(module, tmp_path, capsys):
    result = module.main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out

    assert set(result["runs"]) == set(result["summary"]) == {"Triplet", "EPS + Triplet"}
    keys = {"R@1", "R@5", "R@10", "parity R@1"}
    for method, runs in result["runs"].items():
        assert len(runs) == 1  # --quick: one seed
        for split in ("train", "test"):
            values = runs[0][split]
            assert set(values) == keys
            assert all(0.0 <= v <= 100.0 for v in values.values()), (method, split, values)
            # Recall@K can only grow with K.
            assert values["R@1"] <= values["R@5"] <= values["R@10"]
            mean, std = result["summary"][method][split]["R@1"]
            assert mean == pytest.approx(values["R@1"]) and std == 0.0

    assert set(result["eps_wins"]) == {"train", "test"}
    assert all(0 <= n <= 1 for n in result["eps_wins"].values())

    for name in ("test_digits.png", "train_digits.png"):
        path = tmp_path / name
        assert str(path) in result["figures"]
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert "Train digits 0-5" in out and "Test digits 6-9" in out
    assert "EPS + Triplet" in out and "Even/odd" in out


def test_rejects_a_batch_without_positives(module):
    # EPS needs several samples per class; K = 1 leaves no positive at all.
    with pytest.raises(SystemExit):
        module.main(["--samples-per-class", "1", "--no-plots"])


def test_missing_matplotlib_is_named_before_training(module, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match="matplotlib"):
        module.main(["--quick"])
