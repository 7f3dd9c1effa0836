"""Multi-label P x K batches: [N, L] multi-hot labels, P labels per batch and K examples
carrying each, through PKSampler, pk_batches and PKDataset."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfdml
from tfdml.data import DatasetSplit, PKSampler


def _multi_hot(n=60, num_labels=6, density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    hot = rng.random((n, num_labels)) < density
    hot[~hot.any(axis=1), rng.integers(0, num_labels)] = True
    return hot.astype(np.int64)


def _check(idx, hot, p, k):
    """The drawn labels of a batch: the one label every example of a group carries."""
    assert idx.shape == (p * k,)
    groups = hot[idx].reshape(p, k, -1).astype(bool)
    shared = groups.all(axis=1)  # [P, L]: the labels all K examples of a group carry
    assert shared.any(axis=1).all(), "every example carries its group's label"
    return shared


@pytest.mark.parametrize("p,k", [(3, 4), (5, 2), (2, 6)])
def test_batches_hold_p_labels_and_k_examples_carrying_each(p, k):
    hot = _multi_hot()
    sampler = PKSampler(hot, p, k, seed=1)
    assert sampler.multi_label and sampler.num_classes == 6
    assert sampler.steps_per_epoch == -(-6 // p)
    gen = sampler.iter_batches(0)
    for _ in range(100):
        idx, _ = next(gen)
        shared = _check(idx, hot, p, k)
        # P distinct labels: one label per group, no label for two groups
        assert any(_assignments(shared)), shared


def _assignments(shared):
    """Every way to give each group (row) its own label (column) among those it shares."""
    p = shared.shape[0]

    def assign(row, taken):
        if row == p:
            yield taken
            return
        for c in np.flatnonzero(shared[row]):
            if c not in taken:
                yield from assign(row + 1, (*taken, int(c)))

    return assign(0, ())


def test_each_epoch_visits_every_label_and_no_example_twice_when_labels_are_large():
    # every label has 20 examples, no example with two labels drawn twice: no duplicates
    hot = np.zeros((80, 4), np.int64)
    hot[np.arange(80), np.arange(80) % 4] = 1
    hot[::7, 0] = 1  # some examples carry two labels
    sampler = PKSampler(hot, 4, 5, seed=0)
    for epoch in range(5):
        (idx,) = sampler.epoch_batches(epoch)
        assert len(np.unique(idx)) == 20
        shared = _check(idx, hot, 4, 5)
        assert any(_assignments(shared))


def test_labels_with_few_examples_repeat_and_tiny_labels_are_skipped(caplog):
    hot = np.zeros((12, 4), np.int64)
    hot[:6, 0] = 1
    hot[6:10, 1] = 1
    hot[10, 2] = 1  # label 2: one example; label 3: none
    hot[11, 1] = 1
    hot[[0, 1], 1] = 1  # examples 0 and 1 carry labels 0 and 1
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        sampler = PKSampler(hot, 2, 7, seed=0)
    assert "skipped 2 label(s) with fewer than 2 example(s)" in caplog.text
    np.testing.assert_array_equal(sampler.class_ids, [0, 1])
    np.testing.assert_array_equal(sampler.skipped_classes, [2, 3])
    gen = sampler.iter_batches(0)
    for _ in range(20):
        idx, _ = next(gen)
        groups = idx.reshape(2, 7)
        for group in groups:
            label = 0 if hot[group, 0].all() else 1
            # every example of the label (6 for label 0, topped up by a repeat; 7 for 1)
            assert set(group) == set(np.flatnonzero(hot[:, label]))
    with pytest.raises(ValueError, match="usable labels"):
        PKSampler(hot, 2, 7, small_classes="skip", seed=0)


def test_same_seed_same_batches_and_resume():
    hot = _multi_hot()
    a = PKSampler(hot, 3, 4, seed=7).epoch_batches(2)
    np.testing.assert_array_equal(a, PKSampler(hot, 3, 4, seed=7).epoch_batches(2))
    assert not np.array_equal(a, PKSampler(hot, 3, 4, seed=7).epoch_batches(3))
    gen = PKSampler(hot, 3, 4, seed=7).iter_batches(2)
    np.testing.assert_array_equal(np.stack([next(gen)[0] for _ in range(len(a))]), a)


def test_categories_are_given_per_label():
    hot = _multi_hot(n=120, num_labels=8, density=0.25)
    categories = ["top", "top", "shoe", "shoe", "bag", "bag", "hat", "hat"]
    sampler = PKSampler(hot, 4, 2, seed=0, categories=categories, categories_per_batch=2)
    assert sampler.class_categories.tolist() == categories
    for idx in np.concatenate([sampler.epoch_batches(e) for e in range(10)]):
        shared = _check(idx, hot, 4, 2)
        # the 4 distinct labels drawn come from 2 categories, 2 labels each
        assert any(sorted(np.unique([categories[c] for c in drawn], return_counts=True)[1])
                   == [2, 2] for drawn in _assignments(shared))
    with pytest.raises(ValueError, match=r"`categories`.*one category per distinct label.*"
                                         r"expected length 8, received length 7"):
        PKSampler(hot, 4, 2, categories=categories[:7])
    with pytest.raises(ValueError, match=r"`categories`.*expected 8 label ids.*misses 1"):
        PKSampler(hot, 4, 2, categories=dict(enumerate(categories[:7])))


def test_one_label_per_example_draws_as_class_ids_do():
    labels = np.repeat(np.arange(8), 4)
    hot = np.eye(8, dtype=np.int64)[labels]
    categories = [0, 0, 1, 1, 2, 2, 3, 3]
    kwargs = dict(seed=3, categories=categories, categories_per_batch=2)
    multi = PKSampler(hot, 4, 2, **kwargs)
    for idx in np.concatenate([multi.epoch_batches(e) for e in range(10)]):
        drawn = labels[idx].reshape(4, 2)
        assert np.all(drawn == drawn[:, :1]) and len(np.unique(drawn)) == 4
        assert len({categories[d] for d in drawn[:, 0]}) == 2
    assert PKSampler(labels, 4, 2, **kwargs).steps_per_epoch == multi.steps_per_epoch == 2


@pytest.mark.parametrize("bad,match", [
    ("two", r"`labels` must be multi-hot.*Received 2 at labels\[3, 1\]"),
    ("empty", r"`labels` has samples with an empty label set.*rows \[5\]"),
])
def test_bad_multi_hot_raises_naming_labels(bad, match):
    hot = _multi_hot()
    if bad == "two":
        hot[3, 1] = 2
    else:
        hot[5] = 0
    x = np.zeros((len(hot), 2), "float32")
    makers = [lambda: PKSampler(hot, 2, 2), lambda: tfdml.data.PKDataset((x, hot), 2, 2),
              lambda: tfdml.data.pk_batches((x, hot), 2, 2),
              lambda: DatasetSplit("toy", "train", labels=hot, images=x)]
    for make in makers:
        with pytest.raises(ValueError, match=match):
            make()


def test_pk_batches_and_pk_dataset_yield_the_multi_hot_rows():
    hot = _multi_hot()
    x = np.arange(len(hot), dtype="float32")[:, None]
    want = PKSampler(hot, 3, 4, seed=2).epoch_batches(0)
    tf_batches = list(tfdml.data.pk_batches((x, hot), 3, 4, seed=2, repeat=False))
    py_batches = tfdml.data.PKDataset((x, hot), 3, 4, seed=2, repeat=False)
    assert len(tf_batches) == len(py_batches) == len(want)
    for i, idx in enumerate(want):
        xb, yb = tf_batches[i]
        assert yb.shape == (12, 6) and yb.dtype == tf.int64
        np.testing.assert_array_equal(xb.numpy().ravel(), idx)
        np.testing.assert_array_equal(yb.numpy(), hot[idx])
        px, py = py_batches[i]
        assert py.shape == (12, 6) and py.dtype == np.int64
        np.testing.assert_array_equal(px.ravel(), idx)
        np.testing.assert_array_equal(py, hot[idx])
    # with a per-image map_fn (the unbatched path) the rows follow their images too
    mapped = tfdml.data.pk_batches((x, hot), 3, 4, seed=2, map_fn=lambda image: image * 1.0)
    xb, yb = next(iter(mapped))
    np.testing.assert_array_equal(yb.numpy(), hot[xb.numpy().ravel().astype(int)])


def test_a_multi_label_split_counts_labels_and_feeds_the_sampler():
    hot = _multi_hot()
    x = np.arange(len(hot), dtype="float32")[:, None]
    split = DatasetSplit("toy", "train", labels=hot.astype(bool), images=x,
                         categories={i: i // 2 for i in range(6)})
    assert split.labels.dtype == np.int64 and split.labels.shape == (60, 6)
    assert split.class_counts() == {i: int(n) for i, n in enumerate(hot.sum(axis=0))}
    assert split.num_classes == 6
    data = tfdml.data.PKDataset(split, 3, 2, seed=0, categories_per_batch=3)
    idx = PKSampler(hot, 3, 2, seed=0, categories={i: i // 2 for i in range(6)},
                    categories_per_batch=3).epoch_batches(0)[0]
    np.testing.assert_array_equal(data[0][1], hot[idx])
    with pytest.raises(ValueError, match=r"`labels` must have shape \[60, L\]"):
        DatasetSplit("toy", "train", labels=hot[:-1], images=x)


def test_skipped_file_takes_an_image_of_its_group_and_its_labels(tmp_path, caplog):
    hot = np.zeros((8, 3), np.int64)
    hot[:4, 0] = 1
    hot[4:, 1] = 1
    hot[[1, 2, 5, 6], 2] = 1
    paths = []
    for i in range(8):  # a PNG whose pixels are the example's index
        paths.append(str(tmp_path / f"img_{i}.png"))
        tf.io.write_file(paths[-1], tf.io.encode_png(np.full((4, 4, 3), i, np.uint8)))
    with open(paths[5], "wb") as f:
        f.write(b"not an image")
    data = tfdml.data.pk_batches((paths, hot), 3, 2, seed=0, on_error="skip", prefetch=None)
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        batches = list(data.take(8))
    for images, y in batches:
        drawn = images.numpy()[:, 0, 0, 0].astype(int)
        assert 5 not in drawn.tolist()
        np.testing.assert_array_equal(y.numpy(), hot[drawn])  # the labels of the images
        _check(drawn, hot, 3, 2)
    assert "img_5.png" in caplog.text
