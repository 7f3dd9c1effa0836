"""tfdml.analysis.scatter: triplet scatter points, the plot, and movement statistics.

The tests of the computations (``multibackend``) run under every Keras backend; those of
float64 results enable float64 under JAX (``jax_enable_x64``).
"""

from __future__ import annotations

import itertools

import keras
import matplotlib
import numpy as np
import pytest
from backends import BACKEND

import tfdml
from tfdml.analysis.scatter import (
    DIRECTIONS,
    MovementStatistics,
    ScatterFiles,
    TripletScatterResult,
    movement_statistics,
    plot_scatter_grid,
    plot_triplet_scatter,
    rescore_triplets,
    save_figure,
    save_scatter,
    scatter_values,
    triplet_movement,
    triplet_scatter,
)

matplotlib.use("Agg")

MB = pytest.mark.multibackend


def _data(n=37, d=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = rng.integers(0, 4, size=n)
    y[-1] = 99  # a class with a single sample: no positive
    return x, y


def _brute_force(x, y, positive, negative):
    """One triplet per anchor by explicit loops over the whole set (self excluded)."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x.T
    out = []
    for a in range(len(y)):
        pos = [j for j in range(len(y)) if y[j] == y[a] and j != a]
        neg = [j for j in range(len(y)) if y[j] != y[a]]
        if not pos or not neg:
            continue
        pick = max if positive == "easy" else min
        p = pick(pos, key=lambda j: (s[a, j], -j) if positive == "easy" else (s[a, j], j))
        if negative == "semihard":
            neg = [j for j in neg if s[a, j] <= s[a, p]]
            if not neg:
                continue
        if negative in ("hard", "semihard"):
            q = max(neg, key=lambda j: (s[a, j], -j))
        else:
            q = min(neg, key=lambda j: (s[a, j], j))
        out.append((a, p, q, s[a, p], s[a, q]))
    return out


@pytest.mark.parametrize(
    ("positive", "negative"),
    [pytest.param(*pair, marks=MB) if pair in {("easy", "hard"), ("hard", "semihard")} else pair
     for pair in itertools.product(("easy", "hard"), ("hard", "semihard", "easy"))])
def test_matches_brute_force_chunked_and_unchunked(positive, negative, float64):
    x, y = _data()
    want = _brute_force(x, y, positive, negative)
    full = triplet_scatter(x, y, positive, negative, chunk_size=1000)
    chunked = triplet_scatter(x, y, positive, negative, chunk_size=6)
    for result in (full, chunked):
        assert isinstance(result, TripletScatterResult)
        np.testing.assert_array_equal(result.anchors, [t[0] for t in want])
        np.testing.assert_array_equal(result.positives, [t[1] for t in want])
        np.testing.assert_array_equal(result.negatives, [t[2] for t in want])
        np.testing.assert_allclose(result.s_ap, [t[3] for t in want], rtol=0, atol=1e-12)
        np.testing.assert_allclose(result.s_an, [t[4] for t in want], rtol=0, atol=1e-12)
        assert result.used.shape == (len(y),) and not result.used[-1]  # the singleton
        np.testing.assert_array_equal(np.flatnonzero(result.used), result.anchors)
    for a, b in zip(full, chunked, strict=True):
        if BACKEND == "torch" and a.dtype.kind == "f":
            # PyTorch's matmul rounds differently for other row counts: last-bit differences.
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-15)
        else:
            np.testing.assert_array_equal(a, b)
    if (positive, negative) == ("hard", "semihard"):
        assert len(full.anchors) < len(y) - 1  # some anchors have no semi-hard negative


@MB
def test_float32_input_and_correct_property():
    x, y = _data(n=50, d=8, seed=1)
    got = triplet_scatter(x.astype("float32"), y, chunk_size=16)
    want = _brute_force(x, y, "easy", "hard")
    assert got.s_ap.dtype == np.float32
    np.testing.assert_allclose(got.s_ap, [t[3] for t in want], atol=1e-5)
    np.testing.assert_allclose(got.s_an, [t[4] for t in want], atol=1e-5)
    np.testing.assert_array_equal(got.correct, got.s_ap > got.s_an)
    assert 0 < got.correct.sum() < len(got.correct)


@MB
@pytest.mark.parametrize(("positive", "negative"), [("random", "hard"), ("easy", "random"),
                                                    ("random", "random")])
def test_random_strategies_pick_valid_triplets(positive, negative, float64):
    x, y = _data(n=40, seed=2)
    got = triplet_scatter(x, y, positive, negative, chunk_size=9, seed=3)
    again = triplet_scatter(x, y, positive, negative, chunk_size=9, seed=3)
    np.testing.assert_array_equal(got.positives, again.positives)
    np.testing.assert_array_equal(got.negatives, again.negatives)
    assert np.all(y[got.positives] == y[got.anchors]) and np.all(got.positives != got.anchors)
    assert np.all(y[got.negatives] != y[got.anchors])
    assert len(got.anchors) == len(y) - 1
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(got.s_ap, np.sum(xn[got.anchors] * xn[got.positives], 1))
    np.testing.assert_allclose(got.s_an, np.sum(xn[got.anchors] * xn[got.negatives], 1))


@MB
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"positive": "all"}, "positive='all'"),
        ({"negative": "all"}, "negative='all'"),
        ({"positive": "semihard"}, "positive='semihard'"),
        ({"negative": "closest"}, "negative='closest'"),
        ({"chunk_size": 0}, "chunk_size=0"),
        ({"embeddings": np.zeros((4, 2, 2))}, "embeddings.shape"),
        ({"embeddings": np.zeros((4, 2), int)}, "floating"),
        ({"labels": np.zeros(3)}, "same batch size"),
        ({"labels": np.zeros((4, 2, 1))}, "labels.shape"),
        ({"labels": np.zeros((4, 2))}, "`labels` has samples with an empty label set"),
        ({"embeddings": np.zeros((0, 2)), "labels": np.zeros(0)}, "empty"),
    ],
)
def test_triplet_scatter_rejects_bad_input(kwargs, match):
    args = {"embeddings": np.ones((4, 2)), "labels": np.array([0, 0, 1, 1])}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        triplet_scatter(**args)


@MB
def test_rescore_follows_fixed_triplets(float64):
    x, y = _data(seed=4)
    points = triplet_scatter(x, y)
    same = rescore_triplets(x, points)
    np.testing.assert_allclose(same.s_ap, points.s_ap, atol=1e-12)
    np.testing.assert_allclose(same.s_an, points.s_an, atol=1e-12)
    moved = x + np.random.default_rng(5).normal(scale=0.5, size=x.shape)
    new = rescore_triplets(moved, points)
    mn = moved / np.linalg.norm(moved, axis=1, keepdims=True)
    np.testing.assert_array_equal(new.anchors, points.anchors)
    np.testing.assert_allclose(new.s_ap, np.sum(mn[points.anchors] * mn[points.positives], 1))
    np.testing.assert_allclose(new.s_an, np.sum(mn[points.anchors] * mn[points.negatives], 1))
    with pytest.raises(ValueError, match="one row per sample"):
        rescore_triplets(moved[:-1], points)
    with pytest.raises(ValueError, match="TripletScatterResult"):
        rescore_triplets(moved, (points.s_ap, points.s_an))


# -- plot ---------------------------------------------------------------------------------------


def _offsets(ax):
    return [c.get_offsets() for c in ax.collections]


def test_plot_colours_correct_and_wrong_triplets():
    import matplotlib.pyplot as plt

    s_ap = np.array([0.9, 0.5, 0.2, 0.3, -0.5])
    s_an = np.array([0.1, 0.7, 0.2, -0.1, -0.9])  # correct, wrong, tie (wrong), correct, correct
    ax = plot_triplet_scatter(s_ap, s_an, title="t", margin=0)
    correct, wrong = _offsets(ax)
    np.testing.assert_allclose(correct, [[0.9, 0.1], [0.3, -0.1], [-0.5, -0.9]])
    np.testing.assert_allclose(wrong, [[0.5, 0.7], [0.2, 0.2]])
    colors = [matplotlib.colors.to_hex(c.get_facecolor()[0], keep_alpha=False)
              for c in ax.collections]
    assert colors == [matplotlib.colors.to_hex("tab:blue"), matplotlib.colors.to_hex("tab:red")]
    assert ax.get_xlim() == (-1.0, 1.0) and ax.get_ylim() == (-1.0, 1.0)
    assert ax.get_title() == "t" and "S_{ap}" in ax.get_xlabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["correct 60.0%", "wrong 40.0%"]
    diagonal = ax.lines[0].get_xydata()
    np.testing.assert_allclose(diagonal, [[-1, -1], [1, 1]])
    plt.close(ax.figure)


def test_plot_positive_region_existing_axes_and_result_input():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    points = triplet_scatter(*_data(seed=6))
    got = plot_triplet_scatter(points, ax=ax, region="positive", legend=False)
    assert got is ax
    assert ax.get_xlim() == ax.get_ylim() == pytest.approx((-0.02, 1.02))
    assert sum(len(o) for o in _offsets(ax)) == len(points.s_ap)
    assert ax.get_legend() is None


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0.1, 0.2], [0.1]), {}, "same length"),
        (([[0.1]], [0.1]), {}, "s_ap.shape"),
        (([0.1], [0.1]), {"region": "half"}, "region='half'"),
        (([0.1],), {}, "s_an"),
        (([0.1], [0.1]), {"margin": -0.1}, "margin=-0.1"),
    ],
)
def test_plot_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot_triplet_scatter(*args, **kwargs)


# -- movement -----------------------------------------------------------------------------------


@MB
def test_movement_statistics_on_hand_made_moves():
    before = (np.zeros(8), np.zeros(8))
    d_ap = np.array([0.1, -0.1, -0.1, 0.1, 0.1, 0.0, 0.2, 1e-3])
    d_an = np.array([0.1, 0.1, -0.1, -0.1, -0.2, 0.3, 0.0, 1e-3])
    got = movement_statistics(before, (d_ap, d_an))
    assert isinstance(got, MovementStatistics)
    assert got == MovementStatistics(up_right=2 / 8, up_left=1 / 8, down_left=1 / 8,
                                     down_right=2 / 8, still=2 / 8, count=8)
    with_tol = movement_statistics(before, (d_ap, d_an), tol=0.01)
    assert with_tol.up_right == 1 / 8 and with_tol.still == 3 / 8
    assert sum(with_tol[:5]) == pytest.approx(1.0)
    # Nothing moved.
    assert movement_statistics(before, before).still == 1.0
    empty = movement_statistics(([], []), ([], []))
    assert empty.count == 0 and all(np.isnan(empty[:5]))


@MB
def test_movement_statistics_of_results_need_the_same_triplets(float64):
    x, y = _data(seed=7)
    points = triplet_scatter(x, y)
    moved = x + 0.3 * np.random.default_rng(8).normal(size=x.shape)
    got = movement_statistics(points, rescore_triplets(moved, points))
    want = movement_statistics((points.s_ap, points.s_an),
                               tuple(rescore_triplets(moved, points)[:2]))
    assert got == want and got.count == len(points.anchors)
    with pytest.raises(ValueError, match="different triplets"):
        movement_statistics(points, triplet_scatter(moved, y))


@pytest.mark.parametrize(
    ("before", "after", "kwargs", "match"),
    [
        (([0.1], [0.1]), ([0.1, 0.2], [0.1, 0.2]), {}, "same number"),
        (([0.1], [0.1]), ([0.1], [0.1]), {"tol": -1}, "tol=-1"),
        ([0.1], ([0.1], [0.1]), {}, "before"),
        (([0.1], [[0.1]]), ([0.1], [0.1]), {}, r"before\[1\].shape"),
    ],
)
def test_movement_statistics_rejects_bad_input(before, after, kwargs, match):
    with pytest.raises(ValueError, match=match):
        movement_statistics(before, after, **kwargs)


def _tiny_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(3)])


def _batch():
    rng = np.random.default_rng(9)
    return rng.normal(size=(24, 6)).astype("float32"), np.repeat(np.arange(4), 6)


@MB
def test_triplet_movement_measures_fixed_triplets_around_one_step(float64):
    x, y = _batch()
    loss = tfdml.losses.TripletNCALoss()
    model = _tiny_model()
    before_emb = model.predict(x, verbose=0)
    stats, before, after = triplet_movement(model, x, y, loss, keras.optimizers.SGD(0.5),
                                            return_triplets=True)
    # The triplets are the EPHN triplets of the batch before the step (loss.miner's strategy).
    want = triplet_scatter(before_emb.astype("float64"), y)
    for k in ("anchors", "positives", "negatives"):
        np.testing.assert_array_equal(getattr(before, k), getattr(want, k))
    np.testing.assert_allclose(before.s_ap, want.s_ap, atol=1e-6)  # predict vs call
    # The step is Keras' own training step: same weights as train_on_batch on a twin model.
    twin = _tiny_model()
    twin.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
    twin.train_on_batch(x, y)
    for w, v in zip(model.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-6)
    # After: the same triplets measured on the new embeddings.
    np.testing.assert_allclose(after.s_ap, rescore_triplets(
        model.predict(x, verbose=0).astype("float64"), before).s_ap, atol=1e-6)
    assert stats == movement_statistics(before, after) and stats.count == len(before.anchors)
    assert stats.still == 0.0
    # Deterministic: a fresh identical model gives the same statistics.
    again = triplet_movement(_tiny_model(), x, y, loss, keras.optimizers.SGD(0.5))
    assert again == stats
    # A zero learning rate moves nothing.
    assert triplet_movement(_tiny_model(), x, y, loss, keras.optimizers.SGD(0.0)).still == 1.0


@MB
def test_triplet_movement_takes_the_strategy_of_the_loss_and_the_compiled_model(float64):
    x, y = _batch()
    miner = tfdml.miners.TripletMiner("hard", "hard", disjoint=True)
    loss = tfdml.losses.TripletNCALoss(miner=miner)
    model = _tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    before_emb = model.predict(x, verbose=0).astype("float64")
    _, before, _ = triplet_movement(model, x, y, return_triplets=True)
    used = np.concatenate([before.anchors, before.positives, before.negatives])
    assert len(np.unique(used)) == len(used)  # disjoint: each sample in one triplet at most
    scores = before_emb / np.linalg.norm(before_emb, axis=1, keepdims=True)
    scores = scores @ scores.T
    a, p = before.anchors[0], before.positives[0]
    assert a == 0 and scores[a, p] == min(scores[a, j] for j in range(1, 6))  # hard positive
    with pytest.raises(ValueError, match="negative='all'"):
        triplet_movement(model, x, y, negative="all")
    with pytest.raises(ValueError, match="loss"):
        triplet_movement(_tiny_model(), x, y)
    with pytest.raises(ValueError, match="optimizer"):
        triplet_movement(_tiny_model(), x, y, loss)


def test_plot_without_matplotlib_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # import raises ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot_triplet_scatter([0.5], [0.1])
    with pytest.raises(ImportError, match=r'pip install "\.\[plot\]"'):
        tfdml.callbacks.TripletScatter((np.zeros((4, 2)), np.zeros(4)), files=("grid",))
    tfdml.callbacks.TripletScatter((np.zeros((4, 2)), np.zeros(4)), files=("npz",))  # fine


@pytest.mark.slow  # runs an example script
def test_digits_scatter_example_writes_its_figures(tmp_path, capsys):
    import importlib.util
    import pathlib

    path = (pathlib.Path(__file__).resolve().parents[2] / "examples" / "extreme_triplet"
            / "digits_scatter.py")
    spec = importlib.util.spec_from_file_location("digits_scatter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = module.main(["--model", "linear", "--epochs", "1", "--record", "1",
                        "--steps-per-epoch", "2", "--output-dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "digits_scatter.png", "digits_scatter_order1.png", "digits_scatter_order2.png"]
    assert sorted(runs[1][0].scatters) == [0, 1]
    assert "TripletNCALoss(order=2)" in capsys.readouterr().out


# -- the parts of TripletScatter: computing, plotting, writing ----------------------------------


@MB
def test_scatter_values_are_the_correct_share_and_the_movement():
    x, y = _data(n=40)
    points = triplet_scatter(x, y)
    values = scatter_values(points, x)
    assert values == {"correct": pytest.approx(float(points.correct.mean()))}
    moved_x = x + 0.3 * np.random.default_rng(5).normal(size=x.shape)
    values = scatter_values(triplet_scatter(moved_x, y), moved_x, reference=points)
    stats = movement_statistics(points, rescore_triplets(moved_x, points))
    assert list(values) == ["correct"] + [f"move_{d}" for d in DIRECTIONS]
    assert [values[f"move_{d}"] for d in DIRECTIONS] == pytest.approx(list(stats[:5]))
    values = scatter_values(triplet_scatter(x[:3], [0, 1, 2]), x[:3])  # no positive
    assert np.isnan(values["correct"])


def test_plot_scatter_grid_draws_one_panel_per_epoch():
    x, y = _data(n=30)
    points = triplet_scatter(x, y)
    fig = plot_scatter_grid({0: points, 2: points, 5: points}, "easy", "hard", columns=2)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:3] == ["epoch 0", "epoch 2", "epoch 5"] and len(fig.axes) == 4
    assert not fig.axes[3].axison  # the unused slot of the 2 x 2 grid
    assert "easy positive, hard negative; 30 samples" in fig.get_suptitle()


def test_scatter_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    x, y = _data(n=30)
    points = triplet_scatter(x, y)
    files = ScatterFiles(tmp_path / "out", "run", ("npz", "png", "grid"), "easy", "hard")
    files.write(0, {0: points})
    files.write(3, {3: points, 0: points})
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["run.png", "run_epoch000.npz", "run_epoch000.png", "run_epoch003.npz",
                     "run_epoch003.png"]  # no temporary file left
    with np.load(files.path(3, "npz")) as saved:
        assert int(saved["epoch"]) == 3
        np.testing.assert_array_equal(saved["negatives"], points.negatives)
    before = (tmp_path / "out" / "run_epoch003.npz").read_bytes()

    def interrupted(file, **arrays):
        file.write(b"part of an archive")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(OSError, match="disk full"):
        files.write(3, {3: points._replace(s_ap=points.s_ap + 1)})
    assert (tmp_path / "out" / "run_epoch003.npz").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names
    monkeypatch.undo()
    save_scatter(tmp_path / "x.npz", points, 7)  # the writer's parts on their own
    save_figure(plot_scatter_grid({7: points}, "easy", "hard"), tmp_path / "x.png")
