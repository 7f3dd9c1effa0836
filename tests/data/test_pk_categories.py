"""Category-aware P x K batches: PKSampler(categories=..., categories_per_batch=C), and the
same through pk_batches and PKDataset."""

import numpy as np
import pytest

import tfdml
from tfdml.data import DatasetSplit, PKSampler


def _data(num_classes=30, per_class=4, num_categories=5, seed=0):
    """Shuffled labels (non-contiguous ids) and ``{class id: category}``."""
    ids = np.arange(num_classes) * 3 + 2
    labels = np.random.default_rng(seed).permutation(np.repeat(ids, per_class))
    return labels, {int(c): int(i % num_categories) for i, c in enumerate(ids)}


def _check(idx, labels, categories, p, k):
    """The batch's classes (one per group of K) and the categories they come from."""
    assert idx.shape == (p * k,)
    groups = labels[idx].reshape(p, k)
    assert np.all(groups == groups[:, :1]), "K examples of one class, consecutive"
    classes = groups[:, 0]
    assert len(np.unique(classes)) == p, "P distinct classes"
    return classes, {categories[int(c)] for c in classes}


@pytest.mark.parametrize("p,k,c", [(6, 2, 3), (7, 3, 3), (5, 2, 5), (4, 2, 1)])
def test_every_batch_draws_from_exactly_c_categories(p, k, c):
    labels, categories = _data()
    sampler = PKSampler(labels, p, k, seed=3, categories=categories, categories_per_batch=c)
    assert sampler.steps_per_epoch == -(-30 // p)  # the formula without categories
    gen = sampler.iter_batches(0)
    for _ in range(200):
        idx, seed = next(gen)
        classes, drawn = _check(idx, labels, categories, p, k)
        assert len(drawn) == c
        shares = np.sort(np.unique([categories[int(x)] for x in classes], return_counts=True)[1])
        assert shares.min() == p // c and shares.max() <= -(-p // c)  # spread evenly
        assert seed.shape == (2,)


def test_classes_take_turns_and_are_drawn_about_equally_often():
    labels, categories = _data(num_classes=30, num_categories=3)
    sampler = PKSampler(labels, 6, 2, seed=0, categories=categories, categories_per_batch=2)
    counts = np.zeros(labels.max() + 1, int)
    for idx in np.concatenate([sampler.epoch_batches(e) for e in range(20)]):
        counts[np.unique(labels[idx])] += 1
    drawn = counts[np.unique(labels)]
    assert drawn.min() >= 0.6 * drawn.mean() and drawn.max() <= 1.4 * drawn.mean()


def test_small_categories_pass_their_share_and_the_fallback_adds_categories():
    # categories 0 and 1 hold one class each, 2 holds ten: P = 4 from C = 2 categories
    labels = np.repeat(np.arange(12), 3)
    categories = {c: 0 if c == 0 else 1 if c == 1 else 2 for c in range(12)}
    sampler = PKSampler(labels, 4, 3, seed=1, categories=categories, categories_per_batch=2)
    seen = {2: 0, 3: 0}
    gen = sampler.iter_batches(0)
    for _ in range(300):
        _, drawn = _check(next(gen)[0], labels, categories, 4, 3)
        seen[len(drawn)] += 1
        if len(drawn) == 3:  # only when 0 and 1 were drawn: 2 classes, fewer than P
            assert drawn == {0, 1, 2}
        else:
            assert 2 in drawn  # a small category gave 1 class, category 2 the other 3
    assert seen[2] > 0 and seen[3] > 0


def test_same_seed_and_epoch_same_batches_and_resume_is_exact():
    labels, categories = _data()
    make = lambda seed: PKSampler(labels, 6, 2, seed=seed, categories=categories,  # noqa: E731
                                  categories_per_batch=2)
    a = make(5).epoch_batches(3)
    np.testing.assert_array_equal(a, make(5).epoch_batches(3))
    assert not np.array_equal(a, make(5).epoch_batches(4))
    assert not np.array_equal(a, make(6).epoch_batches(3))
    gen = make(5).iter_batches(3)
    np.testing.assert_array_equal(np.stack([next(gen)[0] for _ in range(len(a))]), a)


def test_mapping_and_sequence_forms_and_string_categories_agree():
    labels, categories = _data()
    ids = np.unique(labels)
    names = {c: f"kind-{k}" for c, k in categories.items()}
    forms = [categories, [categories[int(c)] for c in ids], np.array([names[int(c)] for c in ids]),
             names]
    batches = [PKSampler(labels, 6, 2, seed=0, categories=f, categories_per_batch=3)
               .epoch_batches(0) for f in forms]
    for other in batches[1:]:
        np.testing.assert_array_equal(batches[0], other)
    sampler = PKSampler(labels, 6, 2, seed=0, categories=names)
    assert sampler.class_categories.tolist() == [names[int(c)] for c in sampler.class_ids]


def test_without_categories_per_batch_the_batches_are_unchanged():
    labels, categories = _data()
    for kwargs in ({}, {"drop_remainder": True}, {"small_classes": "skip", "steps_per_epoch": 9}):
        plain = PKSampler(labels, 4, 3, seed=2, **kwargs)
        recorded = PKSampler(labels, 4, 3, seed=2, categories=categories, **kwargs)
        assert recorded.categories_per_batch is None
        for epoch in (0, 1):
            np.testing.assert_array_equal(plain.epoch_batches(epoch),
                                          recorded.epoch_batches(epoch))
    # The batches of this version and of the versions before categories existed.
    got = PKSampler(np.repeat(np.arange(6), 3), 2, 2, seed=0).epoch_batches(0)
    assert got.tolist() == [[9, 11, 7, 8], [16, 17, 14, 13], [0, 1, 4, 3]]


def test_class_categories_follow_the_kept_classes():
    labels = np.array([0, 0, 1, 2, 2, 3, 3])  # class 1 has one example: left out
    sampler = PKSampler(labels, 2, 2, seed=0, categories=["a", "b", "a", "c"])
    np.testing.assert_array_equal(sampler.class_ids, [0, 2, 3])
    assert sampler.class_categories.tolist() == ["a", "a", "c"]
    assert PKSampler(labels, 2, 2, seed=0).class_categories is None
    # "b" lost its only class: 2 categories are left, too few for C = 3
    with pytest.raises(ValueError, match=r"`categories_per_batch`.*\(2\).*=3"):
        PKSampler(labels, 3, 2, seed=0, categories=["a", "b", "a", "c"],
                  categories_per_batch=3)
    assert PKSampler(labels, 3, 2, seed=0, min_class_size=1, categories=["a", "b", "a", "c"],
                     categories_per_batch=3).num_classes == 4


@pytest.mark.parametrize("kwargs,match", [
    ({"categories": [0, 1, 2]}, r"`categories`.*expected length 30, received length 3"),
    ({"categories": {2: 0, 5: 1}}, r"`categories`.*expected 30 class ids.*misses 28"),
    ({"categories": [None] * 30}, r"`categories`.*integer or string"),
    ({"categories_per_batch": 2}, r"`categories_per_batch` needs `categories`"),
    ({"categories": "CATS", "categories_per_batch": 6}, r"`categories_per_batch`.*\(5\).*=6"),
    ({"categories": "CATS", "categories_per_batch": 0}, r"categories_per_batch=0"),
    ({"categories": "CATS", "categories_per_batch": 2.5}, r"categories_per_batch=2.5"),
    ({"categories": "CATS", "categories_per_batch": True}, r"categories_per_batch=True"),
    ({"categories": "CATS", "categories_per_batch": 5, "classes_per_batch": 4},
     r"`categories_per_batch` must be at most `classes_per_batch`"),
])
def test_bad_categories_raise_naming_the_argument(kwargs, match):
    labels, categories = _data()
    if kwargs.get("categories") == "CATS":
        kwargs = {**kwargs, "categories": categories}
    args = {"classes_per_batch": 6, "samples_per_class": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        PKSampler(labels, **args)


def test_pk_batches_and_pk_dataset_draw_the_sampler_batches():
    labels, categories = _data(num_classes=12, per_class=3, num_categories=4)
    x = np.arange(len(labels), dtype="float32")[:, None]
    kwargs = dict(seed=4, categories=categories, categories_per_batch=2)
    want = PKSampler(labels, 4, 2, **kwargs).epoch_batches(0)
    finite = tfdml.data.pk_batches((x, labels), 4, 2, repeat=False, **kwargs)
    got = np.stack([xb.numpy().ravel() for xb, _ in finite])
    np.testing.assert_array_equal(got, want)
    data = tfdml.data.PKDataset((x, labels), 4, 2, repeat=False, **kwargs)
    np.testing.assert_array_equal(np.stack([data[i][0].ravel() for i in range(len(data))]), want)
    np.testing.assert_array_equal(data[0][1], labels[want[0]])


def test_a_dataset_split_gives_its_categories():
    labels, categories = _data(num_classes=12, per_class=3, num_categories=4)
    images = np.arange(len(labels), dtype="float32")[:, None]
    split = DatasetSplit("toy", "train", labels=labels, images=images, categories=categories,
                         category_names={i: f"kind {i}" for i in range(4)})
    want = PKSampler(labels, 4, 2, seed=0, categories=categories,
                     categories_per_batch=1).epoch_batches(0)
    data = tfdml.data.PKDataset(split, 4, 2, seed=0, repeat=False, categories_per_batch=1)
    np.testing.assert_array_equal(data.sampler.class_categories,
                                  [categories[int(c)] for c in data.sampler.class_ids])
    np.testing.assert_array_equal(np.stack([data[i][0].ravel() for i in range(3)]), want)
    stream = tfdml.data.pk_batches(split, 4, 2, seed=0, categories_per_batch=1)
    np.testing.assert_array_equal(next(iter(stream))[0].numpy().ravel(), want[0])
    with pytest.raises(ValueError, match=r"`categories`.*misses 1"):
        DatasetSplit("toy", "train", labels=labels, images=images,
                     categories={c: 0 for c in list(categories)[1:]})
