"""tfdml.data.PKSampler (tfdml/data/pk.py): the P x K indices, NumPy only."""

import logging

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfdml.data import PKSampler


def _labels(num_classes=13, per_class=6, seed=0):
    labels = np.repeat(np.arange(num_classes) * 7 + 3, per_class)  # non-contiguous ids
    return np.random.default_rng(seed).permutation(labels)


def _check_batch(idx, labels, p, k):
    assert idx.shape == (p * k,)
    groups = labels[idx].reshape(p, k)
    assert np.all(groups == groups[:, :1]), "the K examples of a class are consecutive"
    assert len(np.unique(groups[:, 0])) == p, "no class twice in a batch"


def test_sampler_invariants_over_many_batches():
    labels = _labels()
    sampler = PKSampler(labels, 4, 3, seed=1)
    gen = sampler.iter_batches()
    for _ in range(300):
        idx, seed = next(gen)
        _check_batch(idx, labels, 4, 3)
        assert len(np.unique(idx)) == 12  # classes of 6 give K distinct examples
        assert seed.shape == (2,)


@given(sizes=st.lists(st.integers(1, 9), min_size=2, max_size=12),
       p=st.integers(1, 5), k=st.integers(2, 5), small=st.sampled_from(["replace", "skip"]),
       drop=st.booleans(), seed=st.integers(0, 2**32))
def test_sampler_invariants_random_class_sizes(sizes, p, k, small, drop, seed):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    usable = [c for c, n in enumerate(sizes) if n >= 2 and (small == "replace" or n >= k)]
    if len(usable) < p:
        with pytest.raises(ValueError, match="classes_per_batch"):
            PKSampler(labels, p, k, small_classes=small, drop_remainder=drop, seed=seed)
        return
    sampler = PKSampler(labels, p, k, small_classes=small, drop_remainder=drop, seed=seed)
    np.testing.assert_array_equal(sampler.class_ids, usable)
    batches = sampler.epoch_batches(0)
    expected_steps = len(usable) // p if drop else -(-len(usable) // p)
    assert batches.shape == (expected_steps, p * k)
    for idx in batches:
        _check_batch(idx, labels, p, k)
        for group in idx.reshape(p, k):  # as many distinct images as the class allows
            assert len(np.unique(group)) == min(k, sizes[labels[group[0]]])
    if not drop:
        np.testing.assert_array_equal(np.unique(labels[batches]), usable)


def test_epoch_visits_every_class():
    labels = _labels(num_classes=13)
    sampler = PKSampler(labels, 4, 2, seed=0)
    assert sampler.steps_per_epoch == 4  # ceil(13 / 4)
    for epoch in range(5):
        batches = sampler.epoch_batches(epoch)
        seen = np.unique(labels[batches])
        np.testing.assert_array_equal(seen, np.unique(labels))
        for idx in batches:
            _check_batch(idx, labels, 4, 2)
    dropping = PKSampler(labels, 4, 2, seed=0, drop_remainder=True)
    assert dropping.steps_per_epoch == 3
    batches = dropping.epoch_batches(0)
    firsts = labels[batches][:, ::2].ravel()
    assert len(np.unique(firsts)) == 12  # 12 distinct classes, none repeated in the epoch
    fixed = PKSampler(labels, 4, 2, seed=0, steps_per_epoch=10)
    assert fixed.epoch_batches(0).shape == (10, 8)


def test_same_seed_same_batches_other_seed_or_epoch_differs():
    labels = _labels()
    a = PKSampler(labels, 4, 3, seed=7).epoch_batches(0)
    b = PKSampler(labels, 4, 3, seed=7).epoch_batches(0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, PKSampler(labels, 4, 3, seed=8).epoch_batches(0))
    assert not np.array_equal(a, PKSampler(labels, 4, 3, seed=7).epoch_batches(1))


def test_small_classes_replace_and_skip(caplog):
    labels = np.array([0] * 6 + [1] * 6 + [2] * 2 + [3] * 6)
    sampler = PKSampler(labels, 2, 4, seed=0)
    assert sampler.num_classes == 4
    gen = sampler.iter_batches()
    small_seen = 0
    for _ in range(100):
        idx, _ = next(gen)
        _check_batch(idx, labels, 2, 4)
        small = idx[labels[idx] == 2]
        if small.size:
            small_seen += 1
            assert set(small) == {12, 13}  # both images of the class, plus duplicates
    assert small_seen > 10
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        skipping = PKSampler(labels, 2, 4, small_classes="skip", seed=0)
    assert 2 not in skipping.class_ids and skipping.num_classes == 3
    assert "skipped 1 class(es) with fewer than samples_per_class=4" in caplog.text
    gen = skipping.iter_batches()
    assert not any(np.any(labels[next(gen)[0]] == 2) for _ in range(50))


def test_singleton_classes_skipped_with_count_in_log(caplog):
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 3, 4, 5, 5])
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        sampler = PKSampler(labels, 2, 2, seed=0)
    assert "skipped 3 class(es) with fewer than 2 example(s)" in caplog.text
    np.testing.assert_array_equal(sampler.class_ids, [0, 1, 5])
    np.testing.assert_array_equal(sampler.skipped_classes, [2, 3, 4])
    assert PKSampler(labels, 2, 2, min_class_size=1, seed=0).num_classes == 6


@pytest.mark.parametrize("kwargs,match", [
    ({"classes_per_batch": 0}, "classes_per_batch=0"),
    ({"samples_per_class": 2.5}, "samples_per_class=2.5"),
    ({"classes_per_batch": 14}, "classes_per_batch=14"),
    ({"small_classes": "drop"}, "small_classes='drop'"),
    ({"seed": -1}, "seed=-1"),
    ({"steps_per_epoch": 0}, "steps_per_epoch=0"),
    ({"labels": np.zeros((4, 2), int)}, "labels"),
])
def test_sampler_validation(kwargs, match):
    args = {"labels": _labels(), "classes_per_batch": 4, "samples_per_class": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        PKSampler(**args)
