"""UniformHistogramMiner: pytorch-metric-learning 2.9's bins, drawn without replacement.

pml draws ``pos_per_bin`` (``neg_per_bin``) pairs per non-empty bin with replacement; a
tfdml pair mask cannot repeat a pair, so tfdml draws ``min(per_bin, size)`` distinct pairs
per bin. Checked here: the bins (edges recorded from pml, pml's rule for the bins), the
bins pml and tfdml fill, the count per bin, the uniformity of the draw, seeds, compiled =
eager, every loss taking the miner, config and bad arguments.
"""

from __future__ import annotations

import inspect

import keras
import numpy as np
import pytest
import references as ref
from backends import BACKEND, compiled, to_numpy, traced, value_and_grad
from harness import assert_config_roundtrip
from pml_data import BATCHES, DATA

import tfdml
from tfdml.miners import Pairs, UniformHistogramMiner
from tfdml.miners.histogram import histogram_bins, sample_per_bin

pytestmark = pytest.mark.multibackend

#: As tests/fixtures/make_pml_fixtures.py's UNIFORM_HISTOGRAM.
SETTINGS = {"uniform_histogram": (100, 10, 10), "uniform_histogram_5": (5, 3, 4)}


def _pml_bins(values, edges):
    """pml's ``filter_by_bin``: bin ``i`` holds ``edges[i] <= v < edges[i + 1]``, the last
    bin closed; -1 for a value in none. The smallest and largest values (pml's own first and
    last edges, from its distances) may lie a rounding error outside: they are moved in."""
    assert values.min() > edges[0] - 1e-14 and values.max() < edges[-1] + 1e-14
    values = np.clip(values, edges[0], edges[-1])
    out = np.full(len(values), -1)
    last = len(edges) - 2
    for i in range(last + 1):
        high = values <= edges[i + 1] if i == last else values < edges[i + 1]
        out[(edges[i] <= values) & high & (out < 0)] = i
    return out


def _mine(miner, labels, x):
    return miner.mine(None, labels, embeddings=x)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_bins_and_filled_bins_agree_with_pml(name, batch):
    num_bins, pos_per_bin, neg_per_bin = SETTINGS[name]
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    dist = ref.pairwise_distance(ref.l2_normalize(x))
    masks = ref.label_masks(labels)
    mined = _mine(UniformHistogramMiner(num_bins, pos_per_bin, neg_per_bin, seed=0), labels, x)
    assert isinstance(mined, Pairs)
    for role, mask, selected, per_bin, parts in (
            ("pos", masks[0], mined.positive, pos_per_bin, ("a1", "p")),
            ("neg", masks[1], mined.negative, neg_per_bin, ("a2", "n"))):
        mask = np.asarray(mask, bool)
        pml_edges = DATA[f"miner/{name}/{batch}/{role}_edges"]
        bins, edges = (to_numpy(t) for t in histogram_bins(dist, mask, num_bins))
        np.testing.assert_allclose(edges, pml_edges, rtol=1e-12, atol=1e-15)
        # Every eligible pair is in the bin pml's rule gives it (with pml's edges).
        expected = _pml_bins(dist[mask], pml_edges)
        assert np.all(expected >= 0)
        np.testing.assert_array_equal(bins[mask], expected)
        assert np.all(bins[~mask] == num_bins)
        # pml's pairs: eligible, and the bins it fills are the non-empty ones.
        a, b = (DATA[f"miner/{name}/{batch}/{k}"] for k in parts)
        assert np.all(mask[a, b])
        sizes = np.bincount(expected, minlength=num_bins)
        pml_filled = set(_pml_bins(dist[a, b], pml_edges).tolist())
        assert pml_filled == set(np.flatnonzero(sizes).tolist())
        assert len(a) == per_bin * len(pml_filled)  # with replacement: per_bin per bin
        # tfdml's: min(per_bin, size) distinct eligible pairs per bin, the same bins filled.
        selected = to_numpy(selected)
        assert not np.any(selected & ~mask)
        drawn = np.bincount(bins[selected], minlength=num_bins)
        np.testing.assert_array_equal(drawn, np.minimum(sizes, per_bin))


def test_the_draw_is_uniform_within_a_bin():
    """Bins of 10, 2 and 7 entries (and 5 outside), 3 drawn per bin, 600 draws (seed 0).

    Each entry of the bin of 10 is drawn with probability 3/10: its count is
    Binomial(600, 0.3), mean 180, sd 11.2. Every count within 5 sd of the mean (56) fails
    by chance with probability about 6e-7 per entry (the seed fixes the outcome); drawing
    the first three, or any fixed subset, gives counts 600 and 0. The 21 pairs of the
    bin of 7 are each drawn together with probability (3/7)(2/6) = 1/7 (3 of the 21
    pairs each time: a uniform subset): mean 85.7, sd 8.6, the same 5 sd bound (43).
    """
    bins = np.array([0] * 10 + [1] * 2 + [2] * 7 + [3] * 5, np.int32).reshape(4, 6)
    generator = keras.random.SeedGenerator(0)
    draw = compiled(lambda b: sample_per_bin(b, 3, 3, generator)) if BACKEND == "tensorflow" \
        else (lambda b: sample_per_bin(b, 3, 3, generator))
    counts = np.zeros(24)
    together = np.zeros((7, 7))
    trials = 600
    tensor = keras.ops.convert_to_tensor(bins)
    for _ in range(trials):
        kept = to_numpy(draw(tensor)).reshape(-1)
        np.testing.assert_array_equal(np.bincount(bins.reshape(-1)[kept], minlength=4),
                                      [3, 2, 3, 0])
        counts += kept
        seven = kept[12:19].astype(float)
        together += np.outer(seven, seven)
    np.testing.assert_array_equal(counts[10:12], trials)  # a small bin: all of it
    assert np.abs(counts[:10] - 0.3 * trials).max() < 5 * np.sqrt(trials * 0.21)
    pairs = together[np.triu_indices(7, 1)]
    assert np.abs(pairs - trials / 7).max() < 5 * np.sqrt(trials / 7 * 6 / 7)


def _sequence(miner, labels, x, calls=3):
    return [tuple(to_numpy(m) for m in _mine(miner, labels, x)) for _ in range(calls)]


def test_seeded_draws_are_reproducible_and_depend_on_the_seed():
    labels, x = DATA["uneven/labels"], DATA["uneven/embeddings"].astype(np.float32)
    first = _sequence(UniformHistogramMiner(5, 2, 2, seed=7), labels, x)
    again = _sequence(UniformHistogramMiner(5, 2, 2, seed=7), labels, x)
    other = _sequence(UniformHistogramMiner(5, 2, 2, seed=8), labels, x)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(first, other, strict=True))
    assert not np.array_equal(first[0][1], first[1][1])  # each call draws anew


@pytest.mark.parametrize("xla", [False, True])
def test_compiled_equals_eager_for_the_same_seed_state(xla):
    """The same draws from the same seed state, compiled and eagerly; except that
    TensorFlow's stateless random kernels under XLA are another generator than its CPU
    kernels: there the seed state advances alike and the draws are valid ones."""
    labels, x = DATA["uneven/labels"], DATA["uneven/embeddings"].astype(np.float32)
    eager = UniformHistogramMiner(5, 2, 3, seed=11)
    jitted = UniformHistogramMiner(5, 2, 3, seed=11)
    state = jitted.seed_generator.state
    same_draws = BACKEND != "tensorflow" or not xla
    if BACKEND == "jax":  # the seed state goes in and comes out, as in Keras' JAX trainer
        def stateless(seed, labels, x):
            with keras.StatelessScope(state_mapping=[(state, seed)]) as scope:
                out = _mine(jitted, labels, x)
            return out, scope.get_current_value(state)

        step = compiled(stateless)

        def call(labels, x):
            out, seed = step(state.value, labels, x)
            state.assign(seed)
            return out
    else:
        call = (compiled if xla else traced)(lambda labels, x: _mine(jitted, labels, x))
    for _ in range(3):
        want = _mine(eager, labels, x)
        got = call(labels, x)
        np.testing.assert_array_equal(to_numpy(state), to_numpy(eager.seed_generator.state))
        for a, b in zip(got, want, strict=True):
            if same_draws:
                np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
            else:
                assert to_numpy(a).sum() == to_numpy(b).sum()


def _losses_taking_a_miner():
    found = []
    for name in tfdml.losses.__all__:
        cls = getattr(tfdml.losses, name)
        if (inspect.isclass(cls) and issubclass(cls, tfdml.losses.MetricLoss)
                and "miner" in inspect.signature(cls.__init__).parameters):
            found.append(name)
    assert "ContrastiveLoss" in found and "TripletMarginLoss" in found
    return found


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", _losses_taking_a_miner())
def test_every_loss_with_a_miner_takes_it(name):
    labels, x = DATA["pk/labels"], DATA["pk/embeddings"].astype(np.float32)
    miner = UniformHistogramMiner(10, 4, 4, seed=1)
    loss = getattr(tfdml.losses, name)(miner=miner)
    assert any(g is miner.seed_generator for g in loss.state.seed_generators)
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert clone.miner.get_config() == miner.get_config()


def test_degenerate_batches():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 4)).astype(np.float32)
    miner = UniformHistogramMiner(4, 2, 2, seed=0)
    none = _mine(miner, np.arange(6), x)  # no positive pair
    assert not np.any(to_numpy(none.positive))
    negatives = np.asarray(ref.label_masks(np.arange(6))[1], bool)
    bins = to_numpy(histogram_bins(ref.pairwise_distance(ref.l2_normalize(x)), negatives, 4)[0])
    sizes = np.bincount(bins[negatives], minlength=4)
    assert to_numpy(none.negative).sum() == np.minimum(sizes, 2).sum() > 0
    same = np.repeat(x[:1], 6, axis=0)  # every distance equal: one bin (pml's last)
    labels = np.array([0, 0, 0, 1, 1, 1])
    bins, _ = histogram_bins(np.zeros((6, 6)), ref.label_masks(labels)[0], 4)
    assert set(to_numpy(bins)[np.asarray(ref.label_masks(labels)[0], bool)].tolist()) == {3}
    mined = _mine(miner, labels, same)
    assert to_numpy(mined.positive).sum() == 2 and to_numpy(mined.negative).sum() == 2


def test_config_and_bad_arguments():
    miner = assert_config_roundtrip(UniformHistogramMiner(20, 3, 5, distance="cosine", seed=4))
    assert (miner.num_bins, miner.pos_per_bin, miner.neg_per_bin, miner.seed) == (20, 3, 5, 4)
    for kwargs, name in [({"num_bins": 0}, "num_bins"), ({"num_bins": 2.5}, "num_bins"),
                         ({"pos_per_bin": 0}, "pos_per_bin"), ({"neg_per_bin": -1}, "neg_per_bin"),
                         ({"seed": 1.5}, "seed"), ({"distance": "l1"}, "distance")]:
        with pytest.raises(ValueError, match=name):
            UniformHistogramMiner(**kwargs)
