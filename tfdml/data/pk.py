"""`PKSampler`: the indices of P x K batches, P classes per batch and K examples of each.

NumPy only: the ``tf.data`` pipeline (`tfdml.data.pk_batches`) and the Keras `PyDataset`
(`tfdml.data.PKDataset`) both draw their batches from it.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from tfdml._argument_checks import check_int
from tfdml._labels import check_multi_hot, is_multi_label
from tfdml.data._categories import (
    category_class_batches,
    check_categories_per_batch,
    class_categories,
)

__all__ = ["PKSampler", "check_initial_epoch"]

logger = logging.getLogger("tfdml.data")

_SMALL_CLASSES = ("replace", "skip")


def _check_samples_per_class(value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise ValueError(
            "`samples_per_class` must be an integer of at least 2: with fewer samples of a "
            "class in a batch no anchor has a positive, and no tfdml loss learns anything. "
            f"Received: samples_per_class={value!r}"
        )
    return int(value)


def _check_seed(seed):
    """``seed`` as a non-negative int; a random one (drawn now) for None."""
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"`seed` must be a non-negative integer or None. Received: seed={seed!r}")
    return int(seed)


def _check_labels(labels):
    """``labels`` as a 1-D NumPy array of integer class ids (``[N, 1]`` is flattened), or
    ``[N, L]`` multi-hot labels as a bool array (checked by ``check_multi_hot``)."""
    labels = np.asarray(labels)
    if is_multi_label(labels):
        return check_multi_hot(labels, "labels")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            "`labels` must be a 1-D array of integer class ids or [N, L] multi-hot labels. "
            f"Received: labels with shape {labels.shape} and dtype {labels.dtype}"
        )
    return labels


def _groups(labels):
    """``(ids, members, counts)``: the class ids (label indices for multi-hot labels), the
    examples of each (sorted) and their numbers."""
    if labels.ndim == 2:
        _, members = np.nonzero(labels.T)
        counts = labels.sum(axis=0)
        return np.arange(labels.shape[1]), np.split(members, np.cumsum(counts)[:-1]), counts
    ids, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    return ids, np.split(order, np.cumsum(counts)[:-1]), counts


def check_initial_epoch(value):
    """``initial_epoch`` (the first sampler epoch a reader draws) as an int, or a ValueError
    naming it unless it is a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError("`initial_epoch` must be a non-negative integer. "
                         f"Received: initial_epoch={value!r}")
    return int(value)


class PKSampler:
    """Draws index batches of P classes x K examples per class.

    Every batch holds `classes_per_batch` (P) distinct classes and `samples_per_class` (K)
    indices of each, grouped by class (the K indices of the first class, then the next...).

    **Epochs.** Classes are visited in a random permutation, P at a time, so by default one
    epoch (`steps_per_epoch=None`) is `ceil(C / P)` batches and visits every one of the C
    eligible classes once. When C is not a multiple of P the last batch of a permutation
    holds the `C mod P` remaining classes, topped up with classes drawn at random from the
    others (`drop_remainder=False`), or the remaining classes are left out of that epoch
    (`drop_remainder=True`, `floor(C / P)` batches). With `steps_per_epoch=N` an epoch is N
    batches taken from the same endless stream of permutations.

    **Small classes.** Classes with fewer than `min_class_size` examples (by default,
    the classes with a single example: they cannot give a positive pair) are left out,
    and their number is logged (logger `"tfdml.data"`, level WARNING). A class with fewer
    than K examples is, with `small_classes="replace"`, given all its examples in random
    order topped up with examples drawn with replacement, or, with `small_classes="skip"`,
    left out. A class with K or more examples gives K distinct examples drawn at random.

    **Categories.** `categories` gives each class a category (e.g. the super-class of a
    Stanford Online Products product). With `categories_per_batch=C`, each batch draws C
    categories and its P classes among theirs, as open-metric-learning's
    `CategoryBalanceSampler` does: classes of one category look alike, so the batch holds
    hard negatives. The categories are drawn without replacement, with probabilities
    proportional to their number of (kept) classes, so every class is drawn about equally
    often; each gives `P // C` classes and the `P mod C` left over go to random ones among
    them. A category with fewer classes than its share passes the rest to the drawn
    category with the smallest share that has classes left; only when the C categories
    hold fewer than P classes in all does the batch take classes from more categories.
    Within a category, classes take turns (random permutations). An epoch is then
    `steps_per_epoch` such batches (by default `ceil(C / P)` as above, but a class may
    come twice in an epoch and another not at all). Without `categories_per_batch`,
    `categories` are only recorded (`class_categories`) and the batches are those drawn
    without them.

    **Multi-label.** With `[N, L]` multi-hot `labels` each example carries a set of
    labels, and the sampler draws labels where it draws classes: P distinct labels per
    batch (among those with at least `min_class_size` examples, as classes) and K examples
    carrying each drawn label. An example can carry two drawn labels; it is drawn twice in
    a batch only when a label has fewer than K examples not already in the batch.
    `categories` then gives one category per label.

    **Determinism.** `epoch_batches(epoch)` depends only on `seed` and `epoch`: the same
    seed reproduces the same batches and every epoch draws new ones.

    Args:
        labels: `[N]` integer class ids, or `[N, L]` multi-hot labels (0 or 1, `L >= 2`,
            at least one label per example) for multi-label data.
        classes_per_batch: P, the number of distinct classes (labels) in a batch.
        samples_per_class: K, the number of examples of each class in a batch, at least
            2 (with K = 1 no anchor has a positive).
        small_classes: `"replace"` or `"skip"`, for classes with fewer than K examples.
            Defaults to `"replace"`.
        min_class_size: classes with fewer examples are always left out. Defaults to `2`.
        steps_per_epoch: batches per epoch, or `None` for one visit of every class.
            Defaults to `None`.
        drop_remainder: whether to leave out the classes left over when C is not a
            multiple of P, instead of topping up the last batch. Defaults to `False`.
        seed: integer seed, or `None` for a random one (drawn once, at construction).
            Defaults to `None`.
        categories: the category (an integer or a string) of each class: a
            `{class id: category}` mapping, or a sequence of one category per distinct
            class id, in the sorted order of `np.unique(labels)`. For multi-hot `labels`,
            one category per label (`{label index: category}`, or a sequence of length L).
            Defaults to `None`.
        categories_per_batch: C, the number of categories each batch draws its P classes
            from; needs `categories`, and at most P and the number of categories of the
            kept classes. Defaults to `None` (classes drawn whatever their category).

    Attributes:
        class_ids: the class ids drawn from (label indices for multi-hot `labels`).
        class_categories: the category of each of `class_ids`, or None.
        skipped_classes: the class ids left out as too small.
        multi_label: whether `labels` are multi-hot.

    Raises:
        ValueError: on a bad argument (e.g. `samples_per_class < 2`), if fewer than P
            classes are eligible, for multi-hot `labels` with values other than 0 and 1 or
            an example without a label, for `categories` that miss a class or are of the
            wrong length, or for `categories_per_batch` without `categories` or larger
            than P or the number of categories.

    Examples:

    >>> labels = np.repeat(np.arange(10), 5)
    >>> sampler = tfdml.data.PKSampler(labels, 4, 2, seed=0)
    >>> sampler.steps_per_epoch
    3
    >>> sampler.epoch_batches(0).shape
    (3, 8)
    >>> kinds = {c: "even" if c % 2 == 0 else "odd" for c in range(10)}
    >>> by_kind = tfdml.data.PKSampler(labels, 4, 2, seed=0, categories=kinds,
    ...                                categories_per_batch=1)
    >>> np.unique(labels[by_kind.epoch_batches(0)[0]] % 2).size  # one category per batch
    1
    """

    def __init__(self, labels, classes_per_batch, samples_per_class, small_classes="replace",
                 min_class_size=2, steps_per_epoch=None, drop_remainder=False, seed=None, *,
                 categories=None, categories_per_batch=None):
        self.classes_per_batch = check_int("classes_per_batch", classes_per_batch)
        self.samples_per_class = _check_samples_per_class(samples_per_class)
        if small_classes not in _SMALL_CLASSES:
            raise ValueError(
                f"`small_classes` must be one of {_SMALL_CLASSES}. "
                f"Received: small_classes={small_classes!r}"
            )
        self.small_classes = small_classes
        self.min_class_size = check_int("min_class_size", min_class_size)
        if steps_per_epoch is not None:
            steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch)
        self.drop_remainder = bool(drop_remainder)
        self.seed = _check_seed(seed)
        self.labels = _check_labels(labels)
        self.multi_label = self.labels.ndim == 2
        ids, keep = self._keep_classes()
        num = len(self.class_ids)
        if num < self.classes_per_batch:
            raise ValueError(
                f"`classes_per_batch` must be at most the number of usable "
                f"{'labels' if self.multi_label else 'classes'} ({num} with at least "
                f"{self.min_class_size} examples). Received: "
                f"classes_per_batch={self.classes_per_batch}"
            )
        self._set_categories(categories, categories_per_batch, ids, keep)
        if steps_per_epoch is None:
            per_perm = num / self.classes_per_batch
            steps_per_epoch = math.floor(per_perm) if self.drop_remainder else math.ceil(per_perm)
        self.steps_per_epoch = steps_per_epoch

    def _keep_classes(self):
        """Groups the examples by class (label) and leaves out (and logs) the classes too
        small to sample: sets ``class_ids``, ``skipped_classes`` and the members of each kept
        class; returns every class id and the mask of the kept ones."""
        ids, members, counts = _groups(self.labels)
        keep = counts >= self.min_class_size
        if self.small_classes == "skip":
            keep &= counts >= self.samples_per_class
        what, one = ("label(s)", "label") if self.multi_label else ("class(es)", "class")
        too_few = int(np.sum(counts < self.min_class_size))
        if too_few:
            logger.warning(
                "PKSampler: skipped %d %s with fewer than %d example(s) (%d example(s) "
                "in all); a %s needs at least 2 examples to give a positive pair.",
                too_few, what, self.min_class_size,
                int(np.sum(counts[counts < self.min_class_size])), one,
            )
        short = int(np.sum(keep == 0)) - too_few
        if short:
            logger.warning(
                "PKSampler: skipped %d %s with fewer than samples_per_class=%d examples "
                "(small_classes='skip').", short, what, self.samples_per_class,
            )
        self.class_ids = ids[keep]
        self._members = [m for m, k in zip(members, keep, strict=True) if k]
        self._counts = counts[keep]
        self.skipped_classes = ids[~keep]
        return ids, keep

    def _set_categories(self, categories, categories_per_batch, ids, keep):
        """Sets ``class_categories`` (the category of each kept class, or None),
        ``categories_per_batch`` and the category index the batches are drawn with."""
        self.class_categories = self._category_index = None
        num_categories = 0
        if categories is not None:
            what = "label" if self.multi_label else "class"
            self.class_categories = class_categories(categories, ids, what)[keep]
            names, index = np.unique(self.class_categories, return_inverse=True)
            self._category_index, num_categories = index.reshape(-1), len(names)
        self.categories_per_batch = check_categories_per_batch(
            categories_per_batch, categories is not None, num_categories,
            self.classes_per_batch)

    @property
    def batch_size(self) -> int:
        """P x K."""
        return self.classes_per_batch * self.samples_per_class

    @property
    def num_classes(self) -> int:
        """The number of classes (labels) the sampler draws from (after skipping small ones)."""
        return len(self.class_ids)

    def _class_batches(self, rng):
        """Endless stream of `[P]` arrays of class positions (into `self.class_ids`)."""
        if self.categories_per_batch is not None:
            yield from category_class_batches(rng, self._category_index,
                                              self.categories_per_batch, self.classes_per_batch)
        num, p = self.num_classes, self.classes_per_batch
        while True:
            perm = rng.permutation(num)
            full = num - num % p
            for start in range(0, full, p):
                yield perm[start:start + p]
            rest = perm[full:]
            if len(rest) and not self.drop_remainder:
                others = perm[:full]
                yield np.concatenate([rest, rng.choice(others, p - len(rest), replace=False)])

    def _class_sample(self, rng, pos):
        members, k = self._members[pos], self.samples_per_class
        n = len(members)
        if n >= k:
            return members[rng.choice(n, k, replace=False)]
        return np.concatenate([rng.permutation(members), members[rng.integers(0, n, k - n)]])

    def _label_sample(self, rng, pos, used):
        """K examples carrying label ``pos``: examples not ``used`` in the batch yet first,
        then ones already in it, then (a label with fewer than K) repeats."""
        members, k = self._members[pos], self.samples_per_class
        taken = used[members]
        fresh, seen = members[~taken], members[taken]
        if len(fresh) >= k:
            return fresh[rng.choice(len(fresh), k, replace=False)]
        need = k - len(fresh)
        again = seen[rng.choice(len(seen), min(need, len(seen)), replace=False)]
        repeats = members[rng.integers(0, len(members), need - len(again))]
        return np.concatenate([rng.permutation(fresh), again, repeats])

    def _label_batch(self, rng, positions, used):
        """The `[P*K]` indices of a multi-label batch; ``used`` (all False) is scratch."""
        parts = []
        for pos in positions:
            part = self._label_sample(rng, pos, used)
            used[part] = True
            parts.append(part)
        idx = np.concatenate(parts).astype(np.int64)
        used[idx] = False
        return idx

    def iter_batches(self, epoch=0):
        """Yields `(indices [P*K] int64, seed [2] int64)` for the epochs from `epoch` on, forever.

        The seed is a per-batch seed for stateless augmentation.
        """
        rng = np.random.default_rng([self.seed, int(epoch)])
        used = np.zeros(len(self.labels), bool) if self.multi_label else None
        for classes in self._class_batches(rng):
            if used is None:
                idx = np.concatenate([self._class_sample(rng, c) for c in classes]).astype(np.int64)
            else:
                idx = self._label_batch(rng, classes, used)
            yield idx, rng.integers(0, 2**31 - 1, size=2, dtype=np.int64)

    def epoch_batches(self, epoch=0):
        """Returns the `[steps_per_epoch, P*K]` int64 indices of epoch number `epoch`.

        Args:
            epoch: non-negative epoch number. Defaults to `0`.
        """
        gen = self.iter_batches(epoch)
        return np.stack([next(gen)[0] for _ in range(self.steps_per_epoch)])

    def __repr__(self):
        by_category = ("" if self.categories_per_batch is None
                       else f", categories_per_batch={self.categories_per_batch}")
        return (f"PKSampler(classes_per_batch={self.classes_per_batch}, samples_per_class="
                f"{self.samples_per_class}, classes={self.num_classes}{by_category}, "
                f"steps_per_epoch={self.steps_per_epoch}, seed={self.seed})")
