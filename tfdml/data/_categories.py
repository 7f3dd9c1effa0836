"""Categories of classes for the P x K sampler: checked, and the batches drawn from them.

A category groups classes (SOP's super-classes, In-shop's garment types): a batch drawn
from a few categories holds classes that look alike, the hard negatives a model learns
most from (open-metric-learning's ``CategoryBalanceSampler``). NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tfdml._argument_checks import check_int

__all__ = ["category_class_batches", "check_categories_per_batch", "class_categories"]


def class_categories(categories, class_ids, what="class", name="categories"):
    """The category of each of ``class_ids``, as a 1-D array (ints or strings).

    Args:
        categories: ``{class id: category}``, or a sequence aligned with ``class_ids``.
        class_ids: the sorted distinct class ids (for multi-label data, the label indices
            ``0 .. L-1``).
        what: ``"class"`` or ``"label"``, for the messages.
        name: the argument's name, for the messages.

    Raises:
        ValueError: naming ``name``, for a mapping that misses a class, a sequence of
            another length than ``class_ids``, or categories that are not integers or
            strings.
    """
    ids = np.asarray(class_ids).tolist()
    if isinstance(categories, Mapping):
        missing = [c for c in ids if c not in categories]
        if missing:
            raise ValueError(
                f"`{name}` must give a category for every {what} of `labels`: expected "
                f"{len(ids)} {what} ids, received a mapping of {len(categories)} that misses "
                f"{len(missing)} of them, e.g. {missing[:5]}")
        values = [categories[c] for c in ids]
    else:
        values = categories if isinstance(categories, np.ndarray) else list(categories)
        if len(values) != len(ids):
            raise ValueError(
                f"`{name}` must hold one category per distinct {what} of `labels` (in sorted "
                f"order, as np.unique gives them), or be a {{{what} id: category}} mapping: "
                f"expected length {len(ids)}, received length {len(values)}")
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iuUS":
        raise ValueError(
            f"`{name}` must map each {what} to an integer or string category. Received: "
            f"categories of dtype {array.dtype} and shape {array.shape}")
    return array


def check_categories_per_batch(value, has_categories, num_categories, classes_per_batch):
    """``value`` as an int (or None), checked against the categories and P."""
    if value is None:
        return None
    if not has_categories:
        raise ValueError(
            "`categories_per_batch` needs `categories` (one category per class). Received: "
            f"categories_per_batch={value!r} and categories=None")
    value = check_int("categories_per_batch", value)
    if value > num_categories:
        raise ValueError(
            "`categories_per_batch` must be at most the number of categories with usable "
            f"classes ({num_categories}). Received: categories_per_batch={value}")
    if value > classes_per_batch:
        raise ValueError(
            "`categories_per_batch` must be at most `classes_per_batch` (each category gives "
            f"a batch at least one class). Received: categories_per_batch={value} and "
            f"classes_per_batch={classes_per_batch}")
    return value


def _shares(rng, sizes, per_batch, p):
    """``(shares, order)``: how many classes each category gives the batch, and the drawn
    categories in the order drawn.

    Categories are drawn without replacement with probability proportional to their number
    of classes (so every class is drawn about equally often); each drawn one gets P // C
    classes and the P mod C left over go to random ones. A category with too few classes
    passes its excess to the drawn category with the smallest share that has room; when
    the drawn categories hold fewer than P classes in all, the next ones in the draw join.
    """
    order = np.argsort(rng.exponential(size=len(sizes)) / sizes, kind="stable")
    shares = np.zeros(len(sizes), np.int64)
    chosen = order[:per_batch]
    shares[chosen] = p // per_batch
    shares[rng.choice(chosen, p % per_batch, replace=False)] += 1
    excess = int(np.maximum(shares - sizes, 0).sum())
    shares = np.minimum(shares, sizes)
    used = per_batch
    while excess:
        drawn = order[:used]
        room = drawn[shares[drawn] < sizes[drawn]]
        if not room.size:
            used += 1  # the drawn categories hold fewer than P classes: draw one more
            continue
        smallest = room[shares[room] == shares[room].min()]
        shares[smallest[rng.integers(len(smallest))]] += 1
        excess -= 1
    return shares, order[:used]


def _take(rng, group, queue, n):
    """``(n classes of group, the queue left)``: the next ``n`` of the category's queue (a
    random permutation of its classes), topped up from a new permutation when it runs out,
    without a class twice."""
    if len(queue) >= n:
        return queue[:n], queue[n:]
    fresh = rng.permutation(group)
    extra = fresh[~np.isin(fresh, queue)][: n - len(queue)]
    return np.concatenate([queue, extra]), fresh[~np.isin(fresh, extra)]


def category_class_batches(rng, category_index, categories_per_batch, classes_per_batch):
    """Endless stream of ``[P]`` class positions drawn from ``categories_per_batch``
    categories (more only when those hold fewer than P classes).

    Args:
        rng: a ``numpy.random.Generator``.
        category_index: ``[C]`` int, the category (``0 .. M-1``, each used) of each class.
        categories_per_batch: categories per batch, at most M and at most P.
        classes_per_batch: P, at most C.

    Each category walks through its classes in random permutations, so the classes of a
    category take turns; the classes of a batch come grouped by category.
    """
    groups = [np.flatnonzero(category_index == c) for c in range(int(category_index.max()) + 1)]
    sizes = np.array([len(g) for g in groups], np.int64)
    queues = [g[:0] for g in groups]
    while True:
        shares, drawn = _shares(rng, sizes, categories_per_batch, classes_per_batch)
        parts = []
        for c in drawn:
            part, queues[c] = _take(rng, groups[c], queues[c], int(shares[c]))
            parts.append(part)
        yield np.concatenate(parts)
