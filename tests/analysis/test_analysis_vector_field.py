"""tfdml.analysis.vector_field: closed-form similarity change vs. an autodiff step, plots.

The comparisons with an autodiff step of the real losses run under every Keras backend
(``multibackend``); the rest is NumPy and matplotlib.
"""

import importlib.util
import pathlib

import numpy as np
import pytest
from backends import BACKEND, enable_float64, to_numpy, value_and_grad, value_and_grad_function
from keras import ops

import tfdml
from tfdml.analysis.vector_field import (
    SimilarityChange,
    plot_problem_regions,
    plot_vector_field,
    problem_masks,
    similarity_change,
)

EXAMPLE = (pathlib.Path(__file__).resolve().parents[2]
           / "examples" / "extreme_triplet" / "vector_field.py")


# -- the reference: one autodiff step of the real tfdml losses on three explicit vectors --------


_ROTATION = np.linalg.qr(np.random.default_rng(0).normal(size=(4, 4)))[0]


def _triplet_vectors(s_ap, s_an, gamma):
    """Unit f_a, f_p, f_n in R^4 with the given similarities; gamma = cosine of the parts
    orthogonal to f_a. A fixed random rotation keeps the basis from mattering."""
    sin_ap, sin_an = np.sqrt(1 - s_ap**2), np.sqrt(1 - s_an**2)
    a = np.array([1.0, 0, 0, 0])
    p = np.array([s_ap, sin_ap, 0, 0])
    n = np.array([s_an, sin_an * gamma, sin_an * np.sqrt(1 - gamma**2), 0])
    x = np.stack([a, p, n]) @ _ROTATION.T
    np.testing.assert_allclose(x @ x.T, [[1, s_ap, s_an],
                                         [s_ap, 1, s_ap * s_an + gamma * sin_ap * sin_an],
                                         [s_an, s_ap * s_an + gamma * sin_ap * sin_an, 1]],
                               atol=1e-14)
    return x


def _loss(name, temperature=1.0, margin=100.0):
    # Labels [0, 0, 1]: with EPHN mining, anchor 0 has exactly the triplet (a, p, n);
    # reduction="none" gives its loss alone (row 0), without the triplet of anchor 1.
    miner = tfdml.miners.TripletMiner("easy", "hard")
    if name == "margin":
        return tfdml.losses.TripletMarginLoss(margin=margin, distance="squared_l2", miner=miner,
                                              normalize=False, reduction="none")
    order = 1 if name == "nca" else 2
    return tfdml.losses.TripletNCALoss(order=order, temperature=temperature, miner=miner,
                                       normalize=False, reduction="none")


def _traced_gradient(loss, **kwargs):
    """``gradient(x, labels)``: the gradient of anchor 0's loss, as :func:`_simulated_change`
    takes it, traced once (TensorFlow graph, ``jax.jit``; PyTorch: eager) for many calls."""
    loss_fn = _loss(loss, **kwargs)
    step = value_and_grad_function(lambda v, y: loss_fn(y, v)[0],
                                   jit_compile=BACKEND == "jax")

    def gradient(x, labels):
        with enable_float64():
            return to_numpy(step(ops.convert_to_tensor(x), ops.convert_to_tensor(labels)))[1]

    return gradient


def _simulated_change(s_ap, s_an, gamma, loss, lr, gradient=None, **kwargs):
    """(dS_ap, dS_an) of one gradient step on anchor 0's loss, the vectors renormalized;
    ``gradient``: a :func:`_traced_gradient` of the same loss (default: eager)."""
    x = _triplet_vectors(s_ap, s_an, gamma)
    labels = np.array([0, 0, 1], np.int32)
    if gradient is None:
        loss_fn = _loss(loss, **kwargs)
        with enable_float64():  # float64 vectors under JAX too
            _, grad = value_and_grad(lambda v, y: loss_fn(y, v)[0], x, labels)
    else:
        grad = gradient(x, labels)
    new = x - lr * grad
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    return new[0] @ new[1] - s_ap, new[0] @ new[2] - s_an


GRID = np.array([-0.9, -0.4, 0.0, 0.5, 0.9, 0.99])


@pytest.mark.multibackend
@pytest.mark.parametrize("loss", ["nca", "nca2", "margin"])
def test_closed_form_matches_an_autodiff_step_over_a_grid(loss):
    # Other backends than TensorFlow (eager JAX is slow here) take a coarser grid.
    full = BACKEND == "tensorflow"
    gammas, grid = ((-0.6, 0.2, 0.8), GRID) if full else ((-0.6, 0.8), GRID[1::2])
    worst, count, moved = 0.0, 0, 0
    gradient = _traced_gradient(loss)  # one trace for the grid's many steps
    for gamma in gammas:
        for s_ap in grid:
            for s_an in grid:
                expected = _simulated_change(s_ap, s_an, gamma, loss, lr=0.1, gradient=gradient)
                got = similarity_change(s_ap, s_an, gamma, p=0.0, loss=loss, lr=0.1)
                worst = max(worst, abs(got.ds_ap - expected[0]), abs(got.ds_an - expected[1]))
                count += 1
                moved += abs(expected[0]) + abs(expected[1]) > 1e-4
    assert count == len(gammas) * len(grid) ** 2
    # The check compares real movements, not zeros.
    assert moved >= 0.9 * count, moved
    assert worst < 1e-12


@pytest.mark.multibackend
@pytest.mark.parametrize(
    "loss, lr, kwargs",
    [("nca", 0.7, {"temperature": 0.1}), ("nca2", 0.05, {"temperature": 0.5}), ("margin", 0.3, {})],
)
def test_closed_form_is_exact_for_large_steps_and_temperatures(loss, lr, kwargs):
    for s_ap, s_an, gamma in [(0.3, 0.8, 0.5), (0.95, 0.9, -0.2), (-0.5, 0.1, 0.9)]:
        expected = _simulated_change(s_ap, s_an, gamma, loss, lr=lr, **kwargs)
        got = similarity_change(s_ap, s_an, gamma, loss=loss, lr=lr, **kwargs)
        np.testing.assert_allclose([got.ds_ap, got.ds_an], expected, rtol=0, atol=1e-12)


@pytest.mark.multibackend
def test_margin_hinge_inactive_gives_no_change():
    # 2 (S_an - S_ap) + 0.2 <= 0 for (0.9, 0.5): the loss is 0 and so is its gradient.
    expected = _simulated_change(0.9, 0.5, 0.5, "margin", lr=0.1, margin=0.2)
    np.testing.assert_allclose(expected, 0.0, atol=1e-15)
    got = similarity_change([0.9, 0.5], [0.5, 0.9], 0.5, loss="margin", lr=0.1, margin=0.2)
    assert got.ds_ap[0] == 0.0 and got.ds_an[0] == 0.0
    active = _simulated_change(0.5, 0.9, 0.5, "margin", lr=0.1, margin=0.2)
    np.testing.assert_allclose([got.ds_ap[1], got.ds_an[1]], active, atol=1e-12)


def test_nca_matches_the_papers_printed_equations():
    # Eqs. 7, 8 (corrected), 9, 10, 19-22 with beta = lr e^{S_an} / (e^{S_ap} + e^{S_an}).
    s_ap, s_an, gamma, lr = 0.7, 0.6, 0.5, 0.2
    beta = lr * np.exp(s_an) / (np.exp(s_ap) + np.exp(s_an))
    sa, sn = np.sqrt(1 - s_ap**2), np.sqrt(1 - s_an**2)
    s_pn = s_ap * s_an + gamma * sa * sn
    new_ap = (1 + beta**2) * s_ap + 2 * beta - beta * s_pn - beta**2 * s_an
    new_an = (1 + beta**2) * s_an - 2 * beta + beta * s_pn - beta**2 * s_ap
    norm_p = np.sqrt((1 + beta * s_ap) ** 2 + beta**2 * (1 - s_ap**2))
    norm_n = np.sqrt((1 - beta * s_an) ** 2 + beta**2 * (1 - s_an**2))
    norm_a = np.sqrt((1 + beta * s_ap - beta * s_an) ** 2 + (beta * sa - gamma * beta * sn) ** 2
                     + (beta * np.sqrt(1 - gamma**2) * sn) ** 2)
    got = similarity_change(s_ap, s_an, gamma, loss="nca", lr=lr)
    np.testing.assert_allclose(got.ds_ap, new_ap / (norm_a * norm_p) - s_ap, atol=1e-14)
    np.testing.assert_allclose(got.ds_an, new_an / (norm_a * norm_n) - s_an, atol=1e-14)


def test_entanglement_totals():
    s_ap = np.array([0.8, 0.5, -0.5, -0.4])
    s_an = np.array([0.2, 0.5, 0.5, -0.9])
    plain = similarity_change(s_ap, s_an, 0.3, p=0.0, loss="nca2")
    tot = similarity_change(s_ap, s_an, 0.3, p=0.6, loss="nca2")
    np.testing.assert_array_equal(tot.ds_ap, plain.ds_ap)
    np.testing.assert_array_equal(tot.ds_an, plain.ds_an)
    np.testing.assert_array_equal(plain.ds_ap_total, plain.ds_ap)
    q = np.array([0.4, 0.5, 0.0, 0.6])  # sqrt(S_ap S_an), 0 where the product is negative
    np.testing.assert_allclose(tot.ds_ap_total, plain.ds_ap + 0.6 * q * plain.ds_an, atol=1e-15)
    np.testing.assert_allclose(tot.ds_an_total, plain.ds_an + 0.6 * q * plain.ds_ap, atol=1e-15)
    assert tot.ds_ap_total[0] != plain.ds_ap[0]


def test_vectorized_shapes_and_broadcasting():
    s_ap, s_an = np.meshgrid(np.linspace(0, 1, 7), np.linspace(-1, 1, 5))
    out = similarity_change(s_ap, s_an, 0.5, p=0.4)
    assert isinstance(out, SimilarityChange)
    assert all(a.shape == (5, 7) and a.dtype == np.float64 for a in out)
    gammas = np.array([0.2, 0.5, 0.8])[:, None, None]
    stacked = similarity_change(s_ap, s_an, gammas, p=np.array([0.4, 0.8])[:, None, None, None])
    assert stacked.ds_an_total.shape == (2, 3, 5, 7)
    np.testing.assert_allclose(stacked.ds_an_total[0, 1], out.ds_an_total, atol=1e-15)
    single = similarity_change(s_ap[2, 3], s_an[2, 3], 0.5, p=0.4)
    assert np.ndim(single.ds_ap) == 0
    np.testing.assert_allclose(single.ds_ap, out.ds_ap[2, 3], atol=1e-15)


def test_small_step_signs_match_the_papers_problem_regions():
    # Fig. 2: right edge (easy positives) ds_ap < 0; top edge (hard negatives) ds_an > 0.
    right = similarity_change(0.99, 0.3, 0.5, loss="nca", lr=1e-3)
    top = similarity_change(0.3, 0.99, 0.5, loss="nca", lr=1e-3)
    middle = similarity_change(0.3, 0.3, 0.5, loss="nca", lr=1e-3)
    assert right.ds_ap < 0 and top.ds_an > 0
    assert middle.ds_ap > 0 and middle.ds_an < 0


@pytest.mark.parametrize("point", [(0.9, 0.99), (0.9, 0.95), (0.8, 0.95), (0.95, 0.97)])
def test_near_one_one_above_the_diagonal_first_order_collapses_second_order_does_not(point):
    nca = similarity_change(*point, gamma=0.5, p=0.8, loss="nca")
    nca2 = similarity_change(*point, gamma=0.5, p=0.8, loss="nca2")
    assert nca.ds_ap_total > 0 and nca.ds_an_total > 0  # up-right: towards (1, 1)
    assert nca2.ds_an_total < 0  # the negative is pushed away


def test_near_one_one_below_the_diagonal_both_orders_move_down_left():
    # The paper's collapse is a hard-negative effect (S_an > S_ap); at (0.95, 0.9) the
    # 1st-order field points down-left, like the 2nd-order one.
    for loss in ("nca", "nca2"):
        out = similarity_change(0.95, 0.9, 0.5, p=0.8, loss=loss)
        assert out.ds_ap_total < 0 and out.ds_an_total < 0


def test_second_order_has_far_less_collapse_near_one_one():
    s_ap, s_an = np.meshgrid(np.linspace(0.8, 0.999, 40), np.linspace(0.8, 0.999, 40))
    frac = {}
    for loss in ("nca", "nca2"):
        out = similarity_change(s_ap, s_an, 0.5, p=0.8, loss=loss)
        frac[loss] = np.mean((out.ds_ap_total > 0) & (out.ds_an_total > 0))
    assert frac["nca"] > 0.25 and frac["nca2"] < 0.1, frac


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -1.01}, "gamma"),
        ({"loss": "softmax"}, "loss"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -0.1}, "lr"),
        ({"s_ap": 1.2}, "s_ap"),
        ({"s_an": [0.1, -1.5]}, "s_an"),
        ({"s_ap": np.nan}, "s_ap"),
        ({"p": -0.1}, "p"),
        ({"temperature": 0}, "temperature"),
        ({"margin": -1.0}, "margin"),
        ({"s_ap": np.zeros(3), "s_an": np.zeros(4)}, "broadcast"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    args = {"s_ap": 0.5, "s_an": 0.5, "gamma": 0.5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        similarity_change(**args)


def test_plot_vector_field_draws_one_arrow_per_grid_point():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = plot_vector_field(0.5, 0.8, "nca", grid=9)
    quivers = [c for c in ax.collections if isinstance(c, matplotlib.quiver.Quiver)]
    assert len(quivers) == 1 and quivers[0].N == 81
    # Unit arrows: the direction of (ds_ap_total, ds_an_total).
    np.testing.assert_allclose(np.hypot(quivers[0].U, quivers[0].V), 1.0)
    assert ax.get_xlim() == (0.0, 1.0)
    fig, axes = plt.subplots(1, 2)
    out = plot_vector_field(0.2, 0.4, "margin", ax=axes[1], grid=5, region="full", style="stream")
    assert out is axes[1] and len(out.collections) > 0 and out.get_ylim() == (-1.0, 1.0)
    with pytest.raises(ValueError, match="region"):
        plot_vector_field(0.5, 0.8, region="upper")
    with pytest.raises(ValueError, match="grid"):
        plot_vector_field(0.5, 0.8, grid=1)
    plt.close("all")


def test_plot_problem_regions_draws_the_masks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plot_problem_regions(0.5, 0.8, "nca", grid=31)
    assert len(fig.axes) == 4
    _, _, masks = problem_masks(0.5, 0.8, "nca", grid=31)
    keys = ("ds_ap", "ds_an", "ds_ap_total", "ds_an_total")
    for ax, key in zip(fig.axes, keys, strict=True):
        meshes = [c for c in ax.collections if isinstance(c, matplotlib.collections.QuadMesh)]
        assert len(meshes) == 1
        drawn = np.asarray(meshes[0].get_array()).reshape(31, 31)
        np.testing.assert_array_equal(drawn, masks[key].astype(float))
        assert masks[key].sum() < 31 * 31
        if key != "ds_an":  # at gamma 0.5 that one is a strip thinner than the grid step
            assert masks[key].sum() > 20  # a real region
    _, axes = plt.subplots(1, 2)
    fig2 = plot_problem_regions(0.2, 0.4, "nca2", axes=axes, quantities=("ds_ap", "ds_an_total"))
    assert fig2 is axes[0].figure
    with pytest.raises(ValueError, match="axes"):
        plot_problem_regions(0.2, 0.4, axes=axes)
    with pytest.raises(ValueError, match="quantities"):
        plot_problem_regions(0.2, 0.4, quantities=("ds_pn",))
    plt.close("all")


@pytest.mark.slow  # runs an example script
def test_example_script_writes_the_figures(tmp_path):
    spec = importlib.util.spec_from_file_location("vector_field_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.main(["--out-dir", str(tmp_path), "--grid", "41", "--arrows", "9"])
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == sorted(pathlib.Path(p).name for p in written)
    assert len(names) >= 4
    assert all((tmp_path / n).stat().st_size > 10_000 for n in names)


def test_no_triplet_moves_up_left_on_the_positive_quadrant():
    # Sec. 6.1 of the paper: "there is no top-left movement, which is not possible in our model".
    s_ap, s_an = np.meshgrid(np.linspace(0, 1, 101), np.linspace(0, 1, 101))
    for loss in ("nca", "nca2", "margin"):
        for gamma in (0.2, 0.8):
            for p in (0.0, 0.8):
                out = similarity_change(s_ap, s_an, gamma, p=p, loss=loss)
                assert not np.any((out.ds_ap_total < 0) & (out.ds_an_total > 0)), (loss, gamma, p)
                assert np.any(out.ds_ap_total < 0) and np.any(out.ds_an_total < 0)
