"""Verification and collapse metrics: FNMR at a target FMR, and the principal-components fraction.

Both are re-exported by :mod:`tfdml.metrics` (``tfdml.metrics.fnmr_at_fmr``,
``tfdml.metrics.pcf``) and follow its conventions (``metric``, self-exclusion,
``groups``, non-finite rows refused; see :mod:`tfdml.metrics`).

* :func:`fnmr_at_fmr` scores every (query, gallery item) pair without holding the
  scores: the score blocks are streamed twice (``chunk_size x gallery_chunk_size``
  scores at a time). A float32 score maps to a 32-bit key in the same order
  (:func:`_keys`); the first pass counts the impostor and genuine pairs per value of
  the key's upper 16 bits, the second, in the bins that hold a threshold, per value
  of its lower 16 bits. Those counts place every threshold on an exact score, so the
  result is that of sorting all the pairs. Memory: a block of scores, the counting
  of at most ``_HOST_PAIRS`` of its pairs at a time, and a few histograms of 65,536
  counts.
* :func:`pcf` accumulates the covariance in float64 over chunks of rows (memory
  ``D x D + chunk_size x D``).
"""

from __future__ import annotations

import numbers

import numpy as np
from keras import ops

from tfdml._argument_checks import check_int
from tfdml._embeddings import check_embeddings
from tfdml._labels import relevance
from tfdml.metrics._neighbours import data_match_counts, exclusion_counts, prepare
from tfdml.search import check_finite as _check_finite
from tfdml.search import exact as _exact
from tfdml.search import score_scale

__all__ = ["fnmr_at_fmr", "pcf"]

#: Values of 16 bits: the bins of each pass of :func:`fnmr_at_fmr`.
_BINS = 1 << 16
_IMPOSTOR, _GENUINE, _LEFT_OUT = 0, 1, 2
#: Pairs of a block counted at a time on the host (bounds the int64 temporaries).
_HOST_PAIRS = 1 << 21


def _keys(scores):
    """uint32 keys in the order of float32 ``scores`` (finite): equal scores, ``-0.0`` and
    ``0.0`` too, have equal keys."""
    bits = (np.asarray(scores, np.float32) + np.float32(0.0)).view(np.uint32)
    negative = (bits >> np.uint32(31)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint32(0x80000000))


def _check_fmr(fmr):
    values = (fmr,) if isinstance(fmr, numbers.Real) else fmr
    try:
        values = tuple(values)
    except TypeError:
        values = None
    if not values or any(not isinstance(f, numbers.Real) or isinstance(f, bool)
                         or not 0.0 < f < 1.0 for f in values):
        raise ValueError("`fmr` must be a number or a non-empty sequence of numbers in (0, 1). "
                         f"Received: fmr={fmr!r}")
    return tuple(float(f) for f in values)


def _allowed(fmr, num_impostors):
    """The most impostor pairs a threshold may accept: the largest ``c`` with
    ``c / num_impostors <= fmr`` (as computed in float64)."""
    count = int(fmr * num_impostors)
    while count + 1 <= num_impostors and (count + 1) / num_impostors <= fmr:
        count += 1
    while count > 0 and count / num_impostors > fmr:
        count -= 1
    return count


def _pair_counts(data):
    """``(genuine, impostor)``: the numbers of pairs scored (unordered without a gallery)."""

    left_out = exclusion_counts(len(data.labels), data.exclude_self, data.groups,
                                          data.gallery_groups)
    genuine = int(data_match_counts(data).sum())
    scored = int((int(data.gallery.shape[0]) - left_out).sum())
    if data.exclude_self:  # each pair {i, j} was counted from both sides
        genuine, scored = genuine // 2, scored // 2
    return genuine, scored - genuine


def _genuine(data, rows, cols):
    """``[len(rows), len(cols)]`` bool: the genuine pairs, equal class ids or relevant
    multi-hot label sets (:func:`tfdml._labels.relevance`)."""
    if data.labels.ndim == 2:
        return relevance(data.labels[rows], data.gallery_labels[cols], data.min_jaccard)
    return data.gallery_labels[cols] == data.labels[rows, None]


def _pair_blocks(data, chunk_size, gallery_chunk_size):
    """Yields ``(keys, kinds)`` of every block of scores: the :func:`_keys` of the scores
    (larger is nearer: dot products, or minus squared distances) and, per pair,
    ``_IMPOSTOR``, ``_GENUINE`` or ``_LEFT_OUT`` (a query's own or group's items, and
    without a gallery the pairs ``(i, j)`` with ``j <= i``: each pair counts once)."""
    num_queries, num_gallery = len(data.labels), len(data.gallery_labels)
    scale = 1.0
    if data.metric == "l2":
        scale = score_scale(max(_exact.largest_abs(data.queries), _exact.largest_abs(data.gallery)),
                            int(data.queries.shape[-1]), "l2")
    for start in range(0, num_queries, chunk_size):
        stop = min(start + chunk_size, num_queries)
        chunk = _exact.scaled(data.queries[start:stop], scale)
        rows = np.arange(start, stop)
        for g_start in range(0, num_gallery, gallery_chunk_size):
            g_stop = min(g_start + gallery_chunk_size, num_gallery)
            if data.exclude_self and g_stop <= start + 1:
                continue  # every pair of the block has j <= i
            block = _exact.scaled(data.gallery[g_start:g_stop], scale)
            scores = ops.convert_to_numpy(_exact.block_scores(chunk, block, data.metric))
            cols = np.arange(g_start, g_stop)
            step = max(1, _HOST_PAIRS // len(cols))  # rows counted at a time on the host
            for lo in range(0, len(rows), step):
                part = rows[lo : lo + step]
                kinds = _genuine(data, part, cols).astype(np.int64)
                left_out = np.zeros(kinds.shape, dtype=bool)
                if data.exclude_self:
                    left_out |= cols[None, :] <= part[:, None]
                if data.groups is not None:
                    left_out |= data.gallery_groups[cols] == data.groups[part, None]
                kinds[left_out] = _LEFT_OUT
                yield _keys(scores[lo : lo + step]), kinds


def _histograms(data, chunk_size, gallery_chunk_size, bins=None):
    """``[2, _BINS]`` counts of the impostor and genuine pairs per upper 16 bits of their key,
    or with ``bins`` (distinct upper values), ``[2, len(bins), _BINS]`` counts per lower 16
    bits of the keys in those bins."""
    slots = None
    if bins is not None:
        slots = np.full(_BINS, -1, np.int64)
        slots[bins] = np.arange(len(bins))
    size = _BINS if bins is None else len(bins) * _BINS
    counts = np.zeros(3 * size, np.int64)
    for keys, kinds in _pair_blocks(data, chunk_size, gallery_chunk_size):
        high = (keys >> np.uint32(16)).astype(np.int64)
        if bins is None:
            counts += np.bincount((kinds * size + high).reshape(-1), minlength=3 * size)
            continue
        slot = slots[high]
        keep = slot >= 0
        low = (keys[keep] & np.uint32(0xFFFF)).astype(np.int64)
        counts += np.bincount(kinds[keep] * size + slot[keep] * _BINS + low, minlength=3 * size)
    counts = counts.reshape(3, size)[:2]
    return counts if bins is None else counts.reshape(2, len(bins), _BINS)


def _nth_from_top(counts, rank):
    """``(position, above)``: the position of the ``rank``-th largest item (1-based) given
    the item counts per position (increasing order), and the items above that position."""
    from_top = np.cumsum(counts[::-1])
    pos = int(np.searchsorted(from_top, rank))  # the first where the count reaches rank
    return len(counts) - 1 - pos, int(from_top[pos] - counts[len(counts) - 1 - pos])


def fnmr_at_fmr(embeddings, labels, fmr=(0.001, 0.01, 0.1), gallery_embeddings=None,
                gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
                gallery_chunk_size: int = 65536, groups=None, gallery_groups=None,
                min_jaccard=None) -> dict:
    """FNMR at FMR: the share of genuine pairs rejected at the threshold of a false match rate.

    Verification over all pairs of a query and a gallery item (without a gallery,
    every unordered pair of two embeddings once; the gallery items of a query's
    ``groups`` are left out): a *genuine* pair has equal labels, an *impostor* pair
    different ones (multi-hot labels: label sets that share a label, or with
    ``min_jaccard`` whose Jaccard similarity reaches it, are genuine). A threshold ``t`` accepts a pair when its similarity is
    ``>= t`` (``metric="l2"``: its distance ``<= t``), so all pairs with an equal
    score are accepted together; ``FMR(t)`` is the share of impostor pairs
    accepted, ``FNMR(t)`` the share of genuine pairs rejected. For each target
    ``f``, ``t`` is the most lenient threshold with ``FMR(t) <= f``: just stricter
    than the ``(A + 1)``-th nearest impostor pair, ``A`` the largest count with
    ``A / N_impostor <= f``, so that ``FNMR = #{genuine pairs scored at most as near
    as that impostor pair} / N_genuine``.

    Scores are float32, as for the search (``"cosine"``: dot products of
    L2-normalized embeddings; ``"l2"``: squared Euclidean distances, the same
    order as the distances); the result is that of sorting every pair's score
    (exact, whatever the chunk sizes), computed from two passes over blocks of
    ``chunk_size x gallery_chunk_size`` scores.

    open-metric-learning's ``fnmr@fmr`` places the threshold at the ``f``-quantile
    of the impostor distances (``numpy.quantile``, interpolating between two pairs)
    and rejects the genuine pairs at a distance ``>=`` it: the same share where the
    quantile falls on a tie or a gap without genuine pairs, otherwise it may count
    a few genuine pairs more or less. It scores ordered pairs (both ``(i, j)`` and
    ``(j, i)`` without a gallery); the shares are the same.

    Args:
        embeddings: ``[Q, D]`` query embeddings.
        labels: ``[Q]`` integer class ids, or ``[Q, L]`` multi-hot label sets.
        fmr: the target false match rates, each in (0, 1) (a number or a
            sequence). Defaults to `(0.001, 0.01, 0.1)`.
        gallery_embeddings: ``[G, D]`` gallery embeddings. Defaults to `None`
            (the queries themselves: every pair of two different rows).
        gallery_labels: ``[G]`` class ids of the gallery (``[G, L]`` multi-hot
            with multi-hot ``labels``). Defaults to `None`.
        metric: ``"cosine"`` or ``"l2"``. Defaults to `"cosine"`.
        chunk_size: queries per matrix product. Defaults to `1024`.
        gallery_chunk_size: gallery items per matrix product. Defaults to `65536`.
        groups: ``[Q]`` integer group ids; the pairs of a query and a gallery
            item of its group are left out. Without a gallery it gives the group
            of every item. Defaults to `None`.
        gallery_groups: ``[G]`` group ids of a separate gallery, required with
            ``groups`` and ``gallery_embeddings``. Defaults to `None`.
        min_jaccard: multi-hot labels: the Jaccard similarity in ``(0, 1]`` of
            the label sets of a genuine pair. Defaults to `None` (sharing a label).

    Returns:
        ``{f: fnmr}`` with Python floats in [0, 1], one per value of ``fmr``.

    Raises:
        ValueError: bad arguments, an ``fmr`` outside (0, 1), no genuine or no
            impostor pair, or a row of ``embeddings`` or ``gallery_embeddings``
            that holds a NaN or an Inf (the message names the argument).

    Examples:

    >>> genuine = [0, 0, 1, 1, 2, 2, 5, 5, 9, 9]  # distances to the query, class 0
    >>> impostor = [3, 3, 4, 4, 6, 6, 7, 7, 8, 8]  # class 1
    >>> gallery = np.array(genuine + impostor, np.float32)[:, None]
    >>> tfdml.metrics.fnmr_at_fmr(np.zeros((1, 1)), [0], (0.1, 0.5), gallery,
    ...                           [0] * 10 + [1] * 10, metric="l2")
    {0.1: 0.4, 0.5: 0.2}
    """

    fmr = _check_fmr(fmr)
    data = prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric,
                             chunk_size, gallery_chunk_size, "exclude", groups=groups,
                             gallery_groups=gallery_groups, multi_label=True,
                             min_jaccard=min_jaccard)
    num_genuine, num_impostors = _pair_counts(data)
    if not num_genuine or not num_impostors:
        raise ValueError(
            "`labels` must give genuine pairs (equal labels) and impostor pairs (different "
            "labels) once the excluded pairs are left out; FNMR at FMR needs both. Received: "
            f"{num_genuine} genuine and {num_impostors} impostor pairs")
    impostor, genuine = _histograms(data, chunk_size, gallery_chunk_size)
    places = [_nth_from_top(impostor, _allowed(f, num_impostors) + 1) for f in fmr]
    bins = np.unique([b for b, _ in places])
    low_impostor, low_genuine = _histograms(data, chunk_size, gallery_chunk_size, bins)
    result = {}
    for f, (b, above) in zip(fmr, places, strict=True):
        slot = int(np.searchsorted(bins, b))
        low, _ = _nth_from_top(low_impostor[slot], _allowed(f, num_impostors) + 1 - above)
        rejected = int(genuine[:b].sum()) + int(low_genuine[slot, : low + 1].sum())
        result[f] = rejected / num_genuine
    return result


def _check_shares(explained_variance):
    values = explained_variance
    if isinstance(values, numbers.Real):
        values = (values,)
    try:
        values = tuple(values)
    except TypeError:
        values = None
    if not values or any(not isinstance(v, numbers.Real) or isinstance(v, bool)
                         or not 0.0 < v <= 1.0 for v in values):
        raise ValueError("`explained_variance` must be a number or a non-empty sequence of "
                         f"numbers in (0, 1]. Received: explained_variance={explained_variance!r}")
    return tuple(float(v) for v in values)


def _covariance(x, chunk_size):
    """The ``[D, D]`` float64 covariance (divided by ``N``) of the float32 rows of ``x``, in
    two passes over chunks of rows: the mean of the rows minus the first row, then the
    centred products. Identical rows give exactly zero."""
    num, dim = int(x.shape[0]), int(x.shape[1])

    def rows(start):
        part = ops.cast(x[start : start + chunk_size], "float32")
        return np.asarray(ops.convert_to_numpy(part), np.float64)

    first = rows(0)[0]
    shift = np.zeros(dim)
    for start in range(0, num, chunk_size):
        shift += (rows(start) - first).sum(axis=0)
    mean = first + shift / num
    cov = np.zeros((dim, dim))
    for start in range(0, num, chunk_size):
        centred = rows(start) - mean
        cov += centred.T @ centred
    return cov / num


def pcf(embeddings, explained_variance=0.5, chunk_size: int = 65536):
    """Principal-components fraction: the share of dimensions the embeddings really use.

    With ``lambda_1 >= ... >= lambda_D`` the eigenvalues of the covariance of the
    embeddings (``numpy.linalg.eigvalsh``; eigenvalues below ``D * eps *
    lambda_1`` count as 0, the numerical rank rule of ``numpy.linalg.matrix_rank``),
    ``PCF(r) = n / D`` with ``n`` the smallest number of principal components whose
    explained variance ``(lambda_1 + ... + lambda_n) / (lambda_1 + ... + lambda_D)``
    reaches ``r``. A small value flags a dimensional collapse: the embeddings lie
    near a subspace of few dimensions. This is open-metric-learning's ``pcf``, except
    when a share reaches ``r`` exactly (e.g. ``r = 1``): OML then counts one
    component more.

    The covariance is accumulated in float64 over ``chunk_size`` rows at a time
    (memory ``D x D + chunk_size x D``), from the embeddings converted to float32
    as for the other metrics. Embeddings without any variance (all rows equal, or
    a single row) have no principal components: the result is ``nan``, not a score
    (0 would read as a total collapse and 1 as none; neither is measured).

    Args:
        embeddings: ``[N, D]`` embeddings.
        explained_variance: the share ``r`` in (0, 1], or a sequence of them.
            Defaults to `0.5`.
        chunk_size: rows per chunk of the covariance. Defaults to `65536`.

    Returns:
        A Python float in (0, 1] (``nan`` without variance), or ``{r: pcf}`` for a
        sequence of shares.

    Raises:
        ValueError: bad arguments, or a row of ``embeddings`` that holds a NaN or
            an Inf (the message names the argument and the rows).

    Examples:

    >>> x = np.random.default_rng(0).normal(size=(1000, 8)) * [10, 10, 1, 1, 1, 1, 1, 1]
    >>> tfdml.metrics.pcf(x, 0.5)
    0.125
    >>> tfdml.metrics.pcf(np.eye(4, 10), (0.5, 1.0))
    {0.5: 0.2, 1.0: 0.3}
    """
    shares = _check_shares(explained_variance)
    chunk_size = check_int("chunk_size", chunk_size)
    x = check_embeddings(embeddings)
    if x.shape[0] == 0:
        raise ValueError(f"`embeddings` is empty. Received: embeddings.shape={x.shape}")
    _check_finite(x, "embeddings")
    dim = int(x.shape[1])
    eig = np.linalg.eigvalsh(_covariance(x, chunk_size))[::-1]
    eig = np.where(eig > dim * np.finfo(np.float64).eps * eig[0], eig, 0.0)
    if eig[0] <= 0.0:
        values = [float("nan")] * len(shares)
    else:
        cumulative = np.cumsum(eig)
        explained = cumulative / cumulative[-1]  # exactly 1 from the numerical rank on
        counts = np.searchsorted(explained, shares, side="left") + 1
        values = [int(min(n, dim)) / dim for n in counts]
    if isinstance(explained_variance, numbers.Real):
        return values[0]
    return dict(zip(shares, values, strict=True))
