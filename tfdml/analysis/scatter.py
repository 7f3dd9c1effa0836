"""The triplet scatter diagram of "Extreme triplet learning" (Section 3, Figures 1, 3 and 6).

Every triplet is a point ``(S_ap, S_an)``: the cosine similarities of the
L2-normalized anchor-positive and anchor-negative embeddings. Points below the
diagonal (``S_ap > S_an``) are correct triplets, drawn blue; the others red.

* :func:`triplet_scatter` mines one triplet per anchor over a whole data set
  (chunked over anchors, memory ``chunk_size x N`` scores) and returns the
  similarities and the indices of the triplets.
* :func:`plot_triplet_scatter` draws the diagram.
* :func:`rescore_triplets` measures the *same* triplets (fixed indices) on new
  embeddings; :func:`movement_statistics` counts in which direction they moved
  (Section 6.1, Figure 3), and :func:`triplet_movement` does both around one
  optimizer step of a model.

What :class:`tfdml.callbacks.TripletScatter` does at a recorded epoch is in parts:
:func:`triplet_scatter` mines the scatter, :func:`scatter_values` gives the values it
logs (nothing else), :func:`plot_scatter_grid` draws recorded scatters side by side, and
:class:`ScatterFiles` writes the files (:func:`save_scatter`, :func:`save_figure`),
each whole or not at all.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
from keras import ops

from tfdml import _files
from tfdml import ops as dml
from tfdml._argument_checks import check_choice, check_int
from tfdml._embeddings import check_batch_sizes, check_embeddings, compute_dtype
from tfdml._files import atomic_path
from tfdml._pyplot import import_pyplot
from tfdml._shims import dtype_name
from tfdml.analysis._gradients import training_gradients
from tfdml.miners import TripletMiner

__all__ = [
    "MovementStatistics",
    "ScatterFiles",
    "TripletScatterResult",
    "movement_statistics",
    "plot_scatter_grid",
    "plot_triplet_scatter",
    "rescore_triplets",
    "save_figure",
    "save_scatter",
    "scatter_values",
    "triplet_movement",
    "triplet_scatter",
]

POSITIVE_STRATEGIES = ("easy", "hard", "random")
NEGATIVE_STRATEGIES = ("hard", "semihard", "easy", "random")
REGIONS = ("full", "positive")
DIRECTIONS = ("up_right", "up_left", "down_left", "down_right", "still")


class TripletScatterResult(NamedTuple):
    """One mined triplet per anchor that has one, and its similarities.

    ``M`` is the number of anchors with a triplet, ``N`` the data set size.

    Attributes:
        s_ap: ``[M]`` float cosine similarity of anchor and positive.
        s_an: ``[M]`` float cosine similarity of anchor and negative.
        anchors: ``[M]`` int64 indices of the anchors (increasing).
        positives: ``[M]`` int64 indices of their positives.
        negatives: ``[M]`` int64 indices of their negatives.
        used: ``[N]`` bool, true for the anchors that have a triplet
            (``np.flatnonzero(used) == anchors``).
    """

    s_ap: np.ndarray
    s_an: np.ndarray
    anchors: np.ndarray
    positives: np.ndarray
    negatives: np.ndarray
    used: np.ndarray

    @property
    def correct(self) -> np.ndarray:
        """``[M]`` bool: ``S_ap > S_an`` (below the diagonal)."""
        return self.s_ap > self.s_an


class MovementStatistics(NamedTuple):
    """Shares of fixed triplets by direction of movement in the ``(S_ap, S_an)`` plane.

    x is ``S_ap`` (right: anchor and positive became more similar), y is
    ``S_an`` (up: anchor and negative became more similar). A triplet whose
    ``|dS_ap|`` or ``|dS_an|`` is at most the tolerance counts as ``still``.
    The five shares sum to 1 (all ``nan`` when ``count == 0``).

    Attributes:
        up_right: share with ``dS_ap > tol`` and ``dS_an > tol``.
        up_left: share with ``dS_ap < -tol`` and ``dS_an > tol``.
        down_left: share with ``dS_ap < -tol`` and ``dS_an < -tol``.
        down_right: share with ``dS_ap > tol`` and ``dS_an < -tol``.
        still: share with ``|dS_ap| <= tol`` or ``|dS_an| <= tol``.
        count: number of triplets.
    """

    up_right: float
    up_left: float
    down_left: float
    down_right: float
    still: float
    count: int


# -- validation ---------------------------------------------------------------------------------


def check_strategies(positive, negative):
    """Checks the mining strategies of a scatter: one of :data:`POSITIVE_STRATEGIES` and
    one of :data:`NEGATIVE_STRATEGIES` (``"all"`` is refused: a scatter has one triplet per
    anchor).

    Raises:
        ValueError: an unknown strategy, or ``"all"``.
    """
    for name, value, allowed in (("positive", positive, POSITIVE_STRATEGIES),
                                 ("negative", negative, NEGATIVE_STRATEGIES)):
        if value == "all":
            raise ValueError(
                f"The triplet scatter needs one triplet per anchor: `{name}='all'` is not "
                f"supported. Use one of {allowed}. Received: {name}={value!r}"
            )
        check_choice(name, value, allowed)


def _normalized(embeddings, name="embeddings"):
    x = check_embeddings(embeddings, name)
    return dml.l2_normalize(ops.cast(x, compute_dtype(x.dtype)))


# -- the scatter --------------------------------------------------------------------------------


def triplet_scatter(
    embeddings,
    labels,
    positive: str = "easy",
    negative: str = "hard",
    chunk_size: int = 1024,
    seed: int | None = None,
) -> TripletScatterResult:
    """The points of the triplet scatter diagram of a whole data set.

    Every sample is an anchor; its positive and negative are chosen among all
    the other samples by :class:`tfdml.miners.TripletMiner` (``positive``,
    ``negative``) on the cosine similarities of the L2-normalized embeddings,
    itself excluded. The anchors are processed ``chunk_size`` at a time, each
    chunk against the whole set, so memory is about ``chunk_size x N`` scores
    (60,000 samples with the default chunk: 1024 x 60,000 float32, ~250 MB,
    plus masks). An anchor without a positive (a class with a single sample),
    without a negative, or (``"semihard"``) without a negative at most as
    similar as its positive has no point.

    The paper's Figure 6 uses ``positive="easy", negative="hard"`` (EPHN):
    the most similar same-class and other-class samples of the whole data set.

    Args:
        embeddings: ``[N, D]`` float embeddings (any scale: they are
            L2-normalized). float64 input is computed in float64 (under JAX
            only with ``jax_enable_x64``), anything else in float32.
        labels: ``[N]`` integer class ids.
        positive: ``"easy"``, ``"hard"`` or ``"random"``. Defaults to `"easy"`.
        negative: ``"hard"``, ``"semihard"``, ``"easy"`` or ``"random"``.
            Defaults to `"hard"`. ``"all"`` is rejected for both: a scatter
            has one point per anchor.
        chunk_size: anchors per chunk. Deterministic strategies give the same
            result for every chunk size (ties go to the lowest index); random
            choices depend on it. Defaults to `1024`.
        seed: seed of the random strategies. Defaults to `None`.

    Returns:
        A :class:`TripletScatterResult` ``(s_ap, s_an, anchors, positives,
        negatives, used)`` of NumPy arrays.

    Raises:
        ValueError: unknown strategy or ``"all"``, embeddings that are not
            ``[N, D]`` floats, labels that are not ``[N]``, sizes that differ,
            an empty set, or a bad ``chunk_size``.

    Examples:

    >>> points = tfdml.analysis.triplet_scatter(model.predict(x), y)
    >>> tfdml.analysis.plot_triplet_scatter(points.s_ap, points.s_an)
    >>> points.correct.mean()  # share of anchors whose triplet is correct
    """
    check_strategies(positive, negative)
    chunk_size = check_int("chunk_size", chunk_size)
    labels = dml.cast_labels(labels, "labels")
    x = _normalized(embeddings)
    check_batch_sizes(labels, x, "labels", "embeddings")
    n = int(x.shape[0])
    if n == 0:
        raise ValueError(f"`embeddings` is empty. Received: embeddings.shape={x.shape}")
    miner = TripletMiner(positive, negative, seed=seed)
    pos = np.zeros(n, np.int64)
    neg = np.zeros(n, np.int64)
    s_ap = np.zeros(n, dtype_name(x))
    s_an = np.zeros(n, dtype_name(x))
    used = np.zeros(n, bool)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        scores = dml.pairwise_similarity(x[start:stop], x)
        triplets = miner.mine(scores, labels[start:stop], ref_labels=labels, ref_offset=start,
                              embeddings=x[start:stop], ref_embeddings=x)
        p, q = triplets.positive[:, 0], triplets.negative[:, 0]
        pos[start:stop] = ops.convert_to_numpy(p)
        neg[start:stop] = ops.convert_to_numpy(q)
        s_ap[start:stop] = ops.convert_to_numpy(dml.take_along_axis(scores, p[:, None], 1))[:, 0]
        s_an[start:stop] = ops.convert_to_numpy(dml.take_along_axis(scores, q[:, None], 1))[:, 0]
        used[start:stop] = ops.convert_to_numpy(triplets.mask[:, 0, 0])
    anchors = np.flatnonzero(used).astype(np.int64)
    return TripletScatterResult(s_ap[used], s_an[used], anchors, pos[used], neg[used], used)


def rescore_triplets(embeddings, triplets: TripletScatterResult) -> TripletScatterResult:
    """The same triplets (same anchor, positive and negative indices) on other embeddings.

    Use it to follow fixed triplets through training: mine once with
    :func:`triplet_scatter`, then rescore after the model changed and pass
    both to :func:`movement_statistics`. (Mining again would pick other
    triplets.)

    Args:
        embeddings: ``[N, D]`` embeddings of the same ``N`` samples, in the
            same order.
        triplets: a :class:`TripletScatterResult`.

    Returns:
        A :class:`TripletScatterResult` with the new ``s_ap`` and ``s_an`` and
        the indices of ``triplets``.
    """
    if not isinstance(triplets, TripletScatterResult):
        raise ValueError(
            "`triplets` must be a TripletScatterResult (from triplet_scatter). "
            f"Received: triplets of type {type(triplets).__name__}"
        )
    x = _normalized(embeddings)
    if int(x.shape[0]) != len(triplets.used):
        raise ValueError(
            f"`embeddings` must have one row per sample of `triplets` ({len(triplets.used)}). "
            f"Received: embeddings.shape={x.shape}"
        )
    a = ops.take(x, triplets.anchors, axis=0)
    s_ap = ops.convert_to_numpy(ops.sum(a * ops.take(x, triplets.positives, axis=0), axis=1))
    s_an = ops.convert_to_numpy(ops.sum(a * ops.take(x, triplets.negatives, axis=0), axis=1))
    return triplets._replace(s_ap=s_ap, s_an=s_an)


# -- the plot -----------------------------------------------------------------------------------


def _as_1d(name, value):
    value = np.asarray(value, dtype=np.float64)
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array. Received: {name}.shape={value.shape}")
    return value


def plot_triplet_scatter(
    s_ap,
    s_an=None,
    ax=None,
    region: str = "full",
    title: str | None = None,
    point_size: float = 4.0,
    alpha: float = 0.6,
    colors=("tab:blue", "tab:red"),
    legend: bool = True,
    margin: float = 0.02,
):
    """Draws the triplet scatter diagram (Figures 1 and 6 of the extreme-triplet paper).

    x is ``S_ap``, y is ``S_an``; the diagonal ``S_an = S_ap`` is dashed.
    Correct triplets (``S_ap > S_an``, below the diagonal) are drawn in the
    first colour, the others (ties included) in the second. The legend gives
    their shares.

    Args:
        s_ap: ``[M]`` anchor-positive similarities, or a
            :class:`TripletScatterResult` (then leave ``s_an`` out).
        s_an: ``[M]`` anchor-negative similarities.
        ax: a matplotlib ``Axes`` to draw into. Defaults to `None` (a new
            figure).
        region: ``"full"`` shows ``[-1, 1] x [-1, 1]``; ``"positive"`` the
            paper's sub-square ``[0, 1] x [0, 1]`` (points outside are not
            visible; the shares in the legend still count them). Defaults to
            `"full"`.
        title: axes title. Defaults to `None`.
        point_size: marker area in points^2. Defaults to `4.0`.
        alpha: marker opacity. Defaults to `0.6`.
        colors: ``(correct, incorrect)`` colours. Defaults to
            `("tab:blue", "tab:red")`.
        legend: draw the legend. Defaults to `True`.
        margin: space left around the region on each side, so that points on
            its edges (e.g. ``S_ap = 1``) stay visible. Defaults to `0.02`.

    Returns:
        The matplotlib ``Axes``.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: arrays that are not 1-D or differ in length, or an
            unknown ``region``.

    Examples:

    >>> points = tfdml.analysis.triplet_scatter(embeddings, labels)
    >>> ax = tfdml.analysis.plot_triplet_scatter(points, region="positive")
    >>> ax.figure.savefig("scatter.png", dpi=150)
    """
    if s_an is None:
        if not (hasattr(s_ap, "s_ap") and hasattr(s_ap, "s_an")):
            raise ValueError(
                "`s_an` is required unless `s_ap` is a TripletScatterResult. "
                f"Received: s_ap of type {type(s_ap).__name__}, s_an=None"
            )
        s_ap, s_an = s_ap.s_ap, s_ap.s_an
    s_ap = _as_1d("s_ap", s_ap)
    s_an = _as_1d("s_an", s_an)
    if len(s_ap) != len(s_an):
        raise ValueError(
            "`s_ap` and `s_an` must have the same length. "
            f"Received: s_ap.shape={s_ap.shape}, s_an.shape={s_an.shape}"
        )
    check_choice("region", region, REGIONS)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"`margin` must be a number in [0, 1). Received: margin={margin!r}")
    if ax is None:
        plt = import_pyplot()
        _, ax = plt.subplots(figsize=(4.5, 4.5))
    else:
        import_pyplot()
    low = -1.0 if region == "full" else 0.0
    correct = s_ap > s_an
    total = max(len(s_ap), 1)
    ax.plot([low, 1.0], [low, 1.0], linestyle="--", color="0.4", linewidth=1.0, zorder=1)
    for keep, color, label in ((correct, colors[0], "correct"), (~correct, colors[1], "wrong")):
        ax.scatter(s_ap[keep], s_an[keep], s=point_size, c=color, alpha=alpha, linewidths=0,
                   rasterized=True, zorder=2,
                   label=f"{label} {100.0 * keep.sum() / total:.1f}%")
    ax.set_xlim(low - margin, 1.0 + margin)
    ax.set_ylim(low - margin, 1.0 + margin)
    ax.set_aspect("equal")
    ax.set_xlabel(r"$S_{ap}$")
    ax.set_ylabel(r"$S_{an}$")
    ax.grid(True, linewidth=0.4, alpha=0.5)
    if title is not None:
        ax.set_title(title)
    if legend:
        ax.legend(loc="lower left" if region == "full" else "upper left", fontsize="small",
                  markerscale=max(1.0, 16.0 / max(point_size, 1e-3)) ** 0.5, framealpha=0.8)
    return ax


# -- movement -----------------------------------------------------------------------------------


def _pair(name, value):
    if hasattr(value, "s_ap") and hasattr(value, "s_an"):
        return _as_1d(f"{name}.s_ap", value.s_ap), _as_1d(f"{name}.s_an", value.s_an)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return _as_1d(f"{name}[0]", value[0]), _as_1d(f"{name}[1]", value[1])
    raise ValueError(
        f"`{name}` must be a TripletScatterResult or a pair (s_ap, s_an). "
        f"Received: {name} of type {type(value).__name__}"
    )


def movement_statistics(before, after, tol: float = 0.0) -> MovementStatistics:
    """In which direction fixed triplets moved on the scatter diagram (Section 6.1, Figure 3).

    ``before`` and ``after`` are the similarities of the *same* triplets (same
    anchor, positive and negative) at two moments, e.g. before and after one
    optimizer step. With ``dS_ap = after.s_ap - before.s_ap`` (x) and
    ``dS_an = after.s_an - before.s_an`` (y), each triplet moved up-right,
    up-left, down-left or down-right, or is ``still`` when either change is
    at most ``tol`` in absolute value (no definite quadrant: exactly zero
    movement with the default ``tol=0``). The paper's model predicts no
    up-left movement.

    Args:
        before: a :class:`TripletScatterResult` or a pair ``(s_ap, s_an)`` of
            ``[M]`` arrays.
        after: the same for the same triplets. Two
            :class:`TripletScatterResult` must have the same indices (use
            :func:`rescore_triplets`).
        tol: changes with ``|d| <= tol`` count as no movement. Defaults to `0.0`.

    Returns:
        A :class:`MovementStatistics` ``(up_right, up_left, down_left,
        down_right, still, count)``; the shares sum to 1.

    Raises:
        ValueError: inputs of other shapes or lengths, two results of
            different triplets, or a negative ``tol``.

    Examples:

    >>> tfdml.analysis.movement_statistics(([0.5, 0.5], [0.2, 0.2]), ([0.6, 0.4], [0.3, 0.1]))
    MovementStatistics(up_right=0.5, up_left=0.0, down_left=0.5, down_right=0.0, still=0.0,
    count=2)
    """
    if isinstance(before, TripletScatterResult) and isinstance(after, TripletScatterResult):
        same = (len(before.anchors) == len(after.anchors)
                and all(np.array_equal(getattr(before, k), getattr(after, k))
                        for k in ("anchors", "positives", "negatives")))
        if not same:
            raise ValueError(
                "`before` and `after` hold different triplets; measure the same triplets "
                "with rescore_triplets(new_embeddings, before)."
            )
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)) \
            or not tol >= 0:
        raise ValueError(f"`tol` must be a number >= 0. Received: tol={tol!r}")
    ap0, an0 = _pair("before", before)
    ap1, an1 = _pair("after", after)
    lengths = {len(ap0), len(an0), len(ap1), len(an1)}
    if len(lengths) != 1:
        raise ValueError(
            "`before` and `after` must hold the same number of triplets. Received lengths: "
            f"before=({len(ap0)}, {len(an0)}), after=({len(ap1)}, {len(an1)})"
        )
    dx, dy = ap1 - ap0, an1 - an0
    count = len(dx)
    if count == 0:
        return MovementStatistics(*([float("nan")] * 5), 0)
    right, left = dx > tol, dx < -tol
    up, down = dy > tol, dy < -tol
    shares = [np.mean(m) for m in (up & right, up & left, down & left, down & right)]
    still = 1.0 - float(np.mean((up | down) & (left | right)))
    return MovementStatistics(*(float(s) for s in shares), still, count)


def _model_embeddings(model, x):
    out = model(x, training=False)
    if isinstance(out, (list, tuple, dict)):
        raise ValueError(
            "`model` must have a single embedding output. Received: an output of type "
            f"{type(out).__name__}"
        )
    return ops.convert_to_numpy(out).astype(np.float64)


def triplet_movement(
    model,
    x,
    y,
    loss=None,
    optimizer=None,
    positive: str | None = None,
    negative: str | None = None,
    disjoint: bool | None = None,
    tol: float = 0.0,
    return_triplets: bool = False,
):
    """Movement of a batch's triplets after one optimizer step (Section 6.1, Figure 3).

    Embeds ``x`` (inference mode), mines one triplet per anchor within the
    batch, takes one optimizer step on ``loss(y, model(x, training=True))``
    (plus the model's own losses), embeds ``x`` again and measures the *same*
    triplets (fixed indices). Similarities are computed in float64 (under JAX only
    with ``jax_enable_x64``, float32 otherwise). The model's weights and the
    optimizer's state are changed by the step, as in training. The gradient is
    taken with ``tf.GradientTape``, ``jax.grad`` or ``torch.autograd``, whichever
    the Keras backend is.

    The loss mines its own triplets; for the paper's experiment the measured
    triplets are the trained ones, so by default ``positive``, ``negative``
    and ``disjoint`` are taken from ``loss.miner`` when it is a
    :class:`tfdml.miners.TripletMiner` (otherwise ``"easy"``, ``"hard"``,
    ``disjoint=True``, the paper's one-triplet-per-sample setting).

    Args:
        model: a ``keras.Model`` with one embedding output.
        x: one batch of inputs.
        y: ``[B]`` integer class ids.
        loss: a loss ``loss(y_true, y_pred)``. Defaults to `None` (the
            compiled ``model.loss``).
        optimizer: a Keras optimizer. Defaults to `None` (``model.optimizer``).
        positive: measurement strategy (``"easy"``, ``"hard"``, ``"random"``).
            Defaults to `None` (see above).
        negative: ``"hard"``, ``"semihard"``, ``"easy"`` or ``"random"``.
            Defaults to `None` (see above).
        disjoint: every sample in at most one measured triplet, as in
            Section 6.1. Defaults to `None` (see above).
        tol: see :func:`movement_statistics`. Defaults to `0.0`.
        return_triplets: also return the triplets before and after. Defaults
            to `False`.

    Returns:
        A :class:`MovementStatistics`, or ``(statistics, before, after)`` with
        two :class:`TripletScatterResult` of the same triplets when
        ``return_triplets``.

    Raises:
        ValueError: missing loss or optimizer, unknown or ``"all"`` strategy,
            a model with several outputs.

    Examples:

    >>> loss = tfdml.losses.TripletNCALoss(miner=tfdml.miners.TripletMiner("hard", "hard"))
    >>> stats = tfdml.analysis.triplet_movement(
    ...     model, x_batch, y_batch, loss, keras.optimizers.SGD(1e-5))
    >>> stats.up_right, stats.down_right
    """
    loss = getattr(model, "loss", None) if loss is None else loss
    optimizer = getattr(model, "optimizer", None) if optimizer is None else optimizer
    if loss is None or not callable(loss):
        raise ValueError(f"`loss` must be a callable loss(y_true, y_pred). Received: loss={loss!r}")
    if optimizer is None or not hasattr(optimizer, "apply_gradients"):
        raise ValueError(
            f"`optimizer` must be a Keras optimizer. Received: optimizer={optimizer!r}"
        )
    miner = getattr(loss, "miner", None)
    defaults = (("easy", "hard", True) if not isinstance(miner, TripletMiner)
                else (miner.positive, miner.negative, miner.disjoint))
    positive = defaults[0] if positive is None else positive
    negative = defaults[1] if negative is None else negative
    disjoint = defaults[2] if disjoint is None else bool(disjoint)
    check_strategies(positive, negative)

    labels = dml.cast_labels(y, "y")
    before_emb = _model_embeddings(model, x)
    check_batch_sizes(labels, before_emb, "y", "model(x)")
    normed = dml.l2_normalize(ops.convert_to_tensor(before_emb))
    scores = dml.pairwise_similarity(normed)
    triplets = TripletMiner(positive, negative, disjoint=disjoint).mine(
        scores, labels, embeddings=normed)
    used = ops.convert_to_numpy(triplets.mask[:, 0, 0])
    template = TripletScatterResult(
        np.zeros(0), np.zeros(0), np.flatnonzero(used).astype(np.int64),
        ops.convert_to_numpy(triplets.positive[:, 0]).astype(np.int64)[used],
        ops.convert_to_numpy(triplets.negative[:, 0]).astype(np.int64)[used], used)
    before = rescore_triplets(before_emb, template)

    variables = model.trainable_variables
    grads = training_gradients(model, x, y, loss)
    optimizer.apply_gradients(
        [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None])

    after = rescore_triplets(_model_embeddings(model, x), template)
    stats = movement_statistics(before, after, tol=tol)
    return (stats, before, after) if return_triplets else stats


# -- records during training: computing, plotting and writing (tfdml.callbacks.TripletScatter) --


def scatter_values(
    points: TripletScatterResult,
    embeddings,
    reference: TripletScatterResult | None = None,
) -> dict:
    """The values a record logs of ``points``, the :func:`triplet_scatter` of ``embeddings``.

    ``"correct"``, the share of correct triplets (``nan`` when no anchor has a
    triplet), and, when ``reference`` (the triplets of an earlier record) is
    given, ``"move_<direction>"`` for each of :data:`DIRECTIONS`: the
    :func:`movement_statistics` of the reference's triplets measured again on
    ``embeddings``. Computation only: nothing is written or drawn.
    """
    moves = {}
    if reference is not None:
        stats = movement_statistics(reference, rescore_triplets(embeddings, reference))
        moves = {f"move_{direction}": getattr(stats, direction) for direction in DIRECTIONS}
    correct = float(points.correct.mean()) if len(points.s_ap) else float("nan")
    return {"correct": correct, **moves}


def plot_scatter_grid(scatters, positive, negative, region="full", columns=5):
    """A matplotlib ``Figure`` of the scatters ``{epoch: TripletScatterResult}``, one panel
    per epoch in the order of the dict, wrapped after ``columns`` panels (without pyplot:
    nothing is shown or kept open)."""
    from matplotlib.figure import Figure

    epochs = list(scatters)
    columns = min(len(epochs), columns)
    rows = -(-len(epochs) // columns)
    fig = Figure(figsize=(3.2 * columns, 3.4 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).reshape(-1)
    for ax, epoch in zip(axes, epochs, strict=False):
        points = scatters[epoch]
        plot_triplet_scatter(points.s_ap, points.s_an, ax=ax, region=region,
                             title=f"epoch {epoch}")
    for ax in axes[len(epochs):]:
        ax.set_axis_off()
    strategy = f"{positive} positive, {negative} negative"
    fig.suptitle(f"Triplet scatter ({strategy}; {len(scatters[epochs[-1]].used)} samples)")
    return fig


def save_scatter(path, points: TripletScatterResult, epoch: int):
    """Writes ``points`` and ``epoch`` to the ``.npz`` file ``path``, whole or not at all."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, epoch=epoch, **points._asdict())


def save_figure(figure, path, dpi: int = 120):
    """Writes a matplotlib ``figure`` to ``path`` (format from its extension, default PNG),
    whole or not at all."""
    _files.save_figure(figure, path, dpi=dpi)


class ScatterFiles:
    """The files of a record of scatters in ``output_dir``, each written whole or not at all.

    ``files`` chooses among ``"npz"`` (``{name}_epoch{k:03d}.npz``, :func:`save_scatter`),
    ``"png"`` (``{name}_epoch{k:03d}.png``, that epoch's diagram) and ``"grid"``
    (``{name}.png``, every recorded epoch, :func:`plot_scatter_grid`).
    """

    def __init__(self, output_dir, name, files, positive, negative, region="full",
                 grid_columns=5):
        self.output_dir = os.fspath(output_dir)
        self.name = name
        self.files = tuple(files)
        self.positive, self.negative = positive, negative
        self.region = region
        self.grid_columns = grid_columns

    def path(self, epoch=None, ext="png"):
        """Path of the file of ``epoch`` (``None``: the grid)."""
        stem = self.name if epoch is None else f"{self.name}_epoch{epoch:03d}"
        return os.path.join(self.output_dir, f"{stem}.{ext}")

    def _figure(self, scatters):
        return plot_scatter_grid(scatters, self.positive, self.negative, region=self.region,
                                 columns=self.grid_columns)

    def write(self, epoch, scatters):
        """Writes the files of ``epoch``; ``scatters`` is ``{epoch: TripletScatterResult}``
        of the recorded epochs (``epoch`` included), whose grid is written again."""
        if not self.files:
            return
        os.makedirs(self.output_dir, exist_ok=True)
        if "npz" in self.files:
            save_scatter(self.path(epoch, "npz"), scatters[epoch], epoch)
        if "png" in self.files:
            save_figure(self._figure({epoch: scatters[epoch]}), self.path(epoch, "png"))
        if "grid" in self.files:
            grid = {e: scatters[e] for e in sorted(scatters)}
            save_figure(self._figure(grid), self.path(None, "png"))
