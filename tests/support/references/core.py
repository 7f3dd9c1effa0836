"""The building blocks of the references: vector operations, labels, scores, averages.

Plain Python floats and explicit loops, float64 throughout: obviously correct, not fast.

* scores: cosine similarity of L2-normalized embeddings (raw dot products with
  ``normalize=False``), or the negated distance for the margin loss;
* positives of anchor ``a``: reference rows of the same label except ``a``
  itself (row ``a + ref_offset``; none excluded when ``ref_offset`` is None);
  negatives: reference rows of another label.
"""

from __future__ import annotations

import math

import numpy as np

# -- basic vector operations ----------------------------------------------------------------------


def as_floats(u):
    # Plain Python floats: the loops below are much faster on them than on NumPy scalars.
    if isinstance(u, list):
        return u
    return u.tolist() if isinstance(u, np.ndarray) else [float(a) for a in u]


def dot(u, v):
    total = 0.0
    for a, b in zip(as_floats(u), as_floats(v), strict=True):
        total += a * b
    return total


def norm(u):
    return math.sqrt(dot(u, u))


def l2_normalize(x):
    """Row-wise L2 normalization; a zero row stays zero."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        n = norm(x[i])
        if n > 0.0:
            for k in range(x.shape[1]):
                out[i, k] = x[i, k] / n
    return out


def squared_distance(u, v):
    total = 0.0
    for a, b in zip(as_floats(u), as_floats(v), strict=True):
        total += (a - b) ** 2
    return total


def _pairwise(value, x, y=None):
    """``[len(x), len(y)]`` float64: ``value(x[i], y[j])`` for every pair (``y``: ``x``)."""
    x = np.asarray(x, dtype=np.float64)
    y = x if y is None else np.asarray(y, dtype=np.float64)
    out = np.zeros((x.shape[0], y.shape[0]))
    xs, ys = x.tolist(), y.tolist()
    for i in range(x.shape[0]):
        for j in range(y.shape[0]):
            out[i, j] = value(xs[i], ys[j])
    return out


def pairwise_similarity(x, y=None):
    return _pairwise(dot, x, y)


def pairwise_distance(x, y=None, squared=False):
    def distance(u, v):
        sq = squared_distance(u, v)
        return sq if squared else math.sqrt(sq)

    return _pairwise(distance, x, y)


def distance(u, v, kind):
    """``"cosine"``: 1 - u.v; ``"squared_l2"``: |u - v|^2; ``"l2"``: |u - v|."""
    if kind == "cosine":
        return 1.0 - dot(u, v)
    if kind == "squared_l2":
        return squared_distance(u, v)
    if kind == "l2":
        return math.sqrt(squared_distance(u, v))
    raise ValueError(kind)


def softplus(z):
    # log(1 + e^z), computed without overflow.
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


# -- labels and candidates ------------------------------------------------------------------------


class LabelSet(frozenset):
    """One sample's multi-label set. ``==`` is the multi-label rule: two sets are "the same
    class" (positives) when they share a label, and ``!=`` (negatives) when they share none,
    so the references' ``labels[p] == labels[a]`` read multi-hot labels as they read ids."""

    def __eq__(self, other):
        return bool(frozenset(self) & frozenset(other))

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = frozenset.__hash__


class JaccardSet(LabelSet):
    """A :class:`LabelSet` under ``min_jaccard``: ``==`` (positives) when the Jaccard similarity
    of the two sets reaches it, ``!=`` (negatives) when they share no label; a pair between
    is neither."""

    def __new__(cls, labels, min_jaccard):
        made = super().__new__(cls, labels)
        made.min_jaccard = min_jaccard
        return made

    def __eq__(self, other):
        union = frozenset(self) | frozenset(other)
        return len(frozenset(self) & frozenset(other)) / len(union) >= self.min_jaccard

    def __ne__(self, other):
        return not frozenset(self) & frozenset(other)

    __hash__ = frozenset.__hash__


def as_label_list(labels):
    """Class ids as Python ints, or ``[N, L]`` multi-hot rows as :class:`LabelSet` objects."""
    if isinstance(labels, list) and labels and isinstance(labels[0], LabelSet):
        return labels
    array = np.asarray(labels)
    if array.ndim == 2 and array.shape[1] > 1:
        return [LabelSet(np.flatnonzero(row).tolist()) for row in array]
    return [int(v) for v in array.reshape(-1)]


def label_masks(labels, ref_labels=None, ref_offset=0):
    """Boolean ``(positive, negative)`` matrices ``[B, R]`` built pair by pair."""
    labels = as_label_list(labels)
    ref_labels = labels if ref_labels is None else as_label_list(ref_labels)
    pos = np.zeros((len(labels), len(ref_labels)), dtype=bool)
    neg = np.zeros_like(pos)
    for a in range(len(labels)):
        for r in range(len(ref_labels)):
            is_self = ref_offset is not None and r == a + ref_offset
            if ref_labels[r] == labels[a]:
                pos[a, r] = not is_self
            else:
                neg[a, r] = True
    return pos, neg


def positives_of(a, labels, ref_labels, ref_offset):
    self_row = None if ref_offset is None else a + ref_offset
    return [r for r in range(len(ref_labels)) if ref_labels[r] == labels[a] and r != self_row]


def negatives_of(a, labels, ref_labels):
    return [r for r in range(len(ref_labels)) if ref_labels[r] != labels[a]]


def most_similar(row, candidates):
    best = None
    for c in candidates:
        if best is None or row[c] > row[best]:
            best = c
    return best


def least_similar(row, candidates):
    best = None
    for c in candidates:
        if best is None or row[c] < row[best]:
            best = c
    return best


def semihard_candidates(row, negatives, p):
    """Negatives not more similar to the anchor than the positive ``p``."""
    return [n for n in negatives if row[n] <= row[p]]


# -- scores against a reference set ---------------------------------------------------------------


def prepare_embeddings(embeddings, ref_embeddings, normalize):
    x = np.asarray(embeddings, dtype=np.float64)
    ref = x if ref_embeddings is None else np.asarray(ref_embeddings, dtype=np.float64)
    if normalize:
        x, ref = l2_normalize(x), l2_normalize(ref)
    return x, ref


def nca_scores(embeddings, ref_embeddings=None, normalize=True):
    """Cosine similarities (dot products without normalization), ``[B, R]``."""
    x, ref = prepare_embeddings(embeddings, ref_embeddings, normalize)
    return pairwise_similarity(x, ref)


def margin_scores(embeddings, ref_embeddings=None, distance_kind="squared_l2", normalize=True):
    """Negated distances ``-d(a, r)``, ``[B, R]`` (larger is more similar)."""
    x, ref = prepare_embeddings(embeddings, ref_embeddings, normalize)
    out = np.zeros((x.shape[0], ref.shape[0]))
    xs, refs = x.tolist(), ref.tolist()
    for i in range(x.shape[0]):
        for j in range(ref.shape[0]):
            out[i, j] = -distance(xs[i], refs[j], distance_kind)
    return out


def split_ref(labels, ref_embeddings, ref_labels, ref_offset):
    labels = as_label_list(labels)
    if ref_embeddings is None:
        return labels, labels, 0
    return labels, as_label_list(ref_labels), ref_offset


# -- averages and log-sum-exp ---------------------------------------------------------------------


def plain_mean(values):
    return sum(values) / len(values)


def mean_of_anchors(per_anchor, keep=None):
    """Mean of ``{anchor: value}`` over the anchors in ``keep`` (default: all); 0 if none."""
    values = [v for a, v in per_anchor.items() if keep is None or a in keep]
    return plain_mean(values) if values else 0.0


def average_terms(terms, average, batch_size):
    """The value of a loss from its terms, as tfdml's ``average=`` defines it.

    ``terms``: ``{anchor: [term losses]}`` for the anchors that have terms.

    * ``"anchors"``: mean over those anchors of the mean of their terms;
    * ``"batch"``: sum over anchors of the mean of their terms, divided by
      ``batch_size`` (anchors without terms count as 0);
    * ``"terms"``: sum of all terms divided by their number;
    * ``"nonzero"``: sum of all terms divided by the number of terms > 0.

    0 when the denominator is 0.
    """
    means = [plain_mean(v) for v in terms.values() if v]
    everything = [t for v in terms.values() for t in v]
    if average == "anchors":
        return plain_mean(means) if means else 0.0
    if average == "batch":
        return sum(means) / batch_size
    if average == "terms":
        return sum(everything) / len(everything) if everything else 0.0
    if average == "nonzero":
        count = sum(1 for t in everything if t > 0)
        return sum(everything) / count if count else 0.0
    raise ValueError(average)


def anchor_values(terms, average):
    """tfdml's per-anchor values (``reduction="none"``): means for ``"anchors"``/``"batch"``,
    sums for ``"terms"``/``"nonzero"``."""
    if average in ("anchors", "batch"):
        return {a: plain_mean(v) for a, v in terms.items() if v}
    return {a: sum(v) for a, v in terms.items() if v}


def logsumexp(values):
    """``log(sum exp(v))`` of a list of floats (the largest subtracted first); -inf if empty."""
    values = [float(v) for v in values]
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def cross_entropy(logits, target):
    """``-log softmax(logits)[target]`` of a list of floats."""
    return logsumexp(logits) - logits[target]


# -- finite differences ---------------------------------------------------------------------------


def finite_difference_gradient(f, x, h=1e-6):
    """Central differences of the scalar function ``f`` at ``x`` (float64)."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        up = f(x)
        x[idx] = old - h
        down = f(x)
        x[idx] = old
        grad[idx] = (up - down) / (2.0 * h)
    return grad


# -- test data ------------------------------------------------------------------------------------


def make_labels(counts, seed, values=None):
    """Shuffled labels with ``counts[i]`` samples of class ``values[i]``."""
    rng = np.random.default_rng(seed)
    if values is None:
        values = [3 * i + 1 for i in range(len(counts))]  # non-contiguous ids
    labels = []
    for value, count in zip(values, counts, strict=True):
        labels.extend([value] * count)
    labels = np.array(labels, dtype=np.int32)
    rng.shuffle(labels)
    return labels


def make_batch(counts, dim, seed):
    """``(labels [B], embeddings [B, dim] float64)``, seeded."""
    labels = make_labels(counts, seed)
    rng = np.random.default_rng(seed + 1000)
    return labels, rng.normal(size=(len(labels), dim))
