"""The gradient vector field of the triplet scatter diagram ("Extreme triplet learning", Sec. 4-5).

A triplet ``(f_a, f_p, f_n)`` of unit vectors is a point ``(S_ap, S_an)`` of the
triplet scatter diagram. :func:`similarity_change` predicts, in closed form,
where that point moves after one gradient step taken directly on the three
feature vectors (followed by re-normalization to the unit sphere), for the
1st-order triplet NCA loss, the 2nd-order loss and the vanilla margin loss,
plus the paper's "entanglement" model of how a step on the network weights
drags the other pair along. :func:`plot_vector_field` and
:func:`plot_problem_regions` draw Figures 2 and 5 of the paper.

Only NumPy is needed for the computation; the plotting functions import
matplotlib when called (``pip install matplotlib``, or ``pip install ".[plot]"`` in a clone).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from tfdml._argument_checks import is_number
from tfdml._pyplot import import_pyplot

__all__ = [
    "LOSSES",
    "SimilarityChange",
    "plot_problem_regions",
    "plot_vector_field",
    "problem_masks",
    "similarity_change",
]

LOSSES = ("nca", "nca2", "margin")
QUANTITIES = ("ds_ap", "ds_an", "ds_ap_total", "ds_an_total")
_REGIONS = {"positive": (0.0, 1.0, 0.0, 1.0), "full": (-1.0, 1.0, -1.0, 1.0)}
_CMAP = "winter"  # blue (slow) to green (fast): every arrow stays visible on white
_LOSS_LABELS = {"nca": "1st order (NCA)", "nca2": "2nd order", "margin": "vanilla (margin)"}


class SimilarityChange(NamedTuple):
    """The result of :func:`similarity_change`: four arrays of the broadcast shape.

    Attributes:
        ds_ap: plain change of ``S_ap`` (eq. 9).
        ds_an: plain change of ``S_an`` (eq. 10).
        ds_ap_total: change of ``S_ap`` with entanglement (eq. 11).
        ds_an_total: change of ``S_an`` with entanglement (eq. 12).
    """

    ds_ap: np.ndarray
    ds_an: np.ndarray
    ds_ap_total: np.ndarray
    ds_an_total: np.ndarray


def _as_array(value, name, low=None, high=None):
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be a number or an array of numbers. "
                         f"Received: {name}={value!r}") from err
    ok = np.isfinite(arr)
    if low is not None:
        ok &= arr >= low
    if high is not None:
        ok &= arr <= high
    if not np.all(ok):
        if low is not None and high is not None:
            what = f"in [{low:g}, {high:g}]"
        elif low is not None:
            what = f">= {low:g}"
        else:
            what = "finite"
        bad = arr[~ok].ravel()[:5]
        raise ValueError(f"`{name}` must be {what}. Received: {name}={value!r} "
                         f"(offending values: {bad.tolist()})")
    return arr


def _check_positive_scalar(value, name):
    if not is_number(value) or not np.isfinite(value) or not value > 0:
        raise ValueError(f"`{name}` must be a finite number > 0. Received: {name}={value!r}")
    return float(value)


def _check_loss(loss):
    if loss not in LOSSES:
        raise ValueError(f"`loss` must be one of {LOSSES}. Received: loss={loss!r}")


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _step_coefficients(s_ap, s_an, loss, lr, temperature, margin):
    """The step as ``f_p' = c_p f_p + b_p f_a``, ``f_n' = c_n f_n - b_n f_a``,
    ``f_a' = f_a + b_p f_p - b_n f_n``."""
    if loss == "nca":
        # L = softplus((S_an - S_ap) / T): dL/dS_an = -dL/dS_ap = sigmoid(.) / T.
        beta = lr * _sigmoid((s_an - s_ap) / temperature) / temperature
        return 1.0, beta, 1.0, beta
    if loss == "nca2":
        # L = softplus((v - u) / T), u = S_ap - S_ap^2/2, v = S_an^2/2:
        # dL/dS_ap = -beta_w (1 - S_ap), dL/dS_an = beta_w S_an (eqs. 13-15).
        u = s_ap - 0.5 * s_ap**2
        v = 0.5 * s_an**2
        beta_w = lr * _sigmoid((v - u) / temperature) / temperature
        return 1.0, beta_w * (1.0 - s_ap), 1.0, beta_w * s_an
    # margin, squared L2: L = |f_a - f_p|^2 - |f_a - f_n|^2 + m, gradients eqs. 29-31
    # with the factor 2 of the squares: f_p' = f_p + 2 lr (f_a - f_p), ...
    beta = 2.0 * lr
    if margin is not None:
        active = 2.0 * (s_an - s_ap) + margin > 0  # |f_a - f_p|^2 = 2 - 2 S_ap on the sphere
        beta = np.where(active, beta, 0.0)
    else:
        beta = np.broadcast_to(np.float64(beta), np.broadcast(s_ap, s_an).shape)
    return 1.0 - beta, beta, 1.0 + beta, beta


def similarity_change(
    s_ap,
    s_an,
    gamma,
    p=0.0,
    loss: str = "nca",
    lr: float = 0.1,
    *,
    temperature: float = 1.0,
    margin: float | None = None,
) -> SimilarityChange:
    """Predicted change of ``(S_ap, S_an)`` after one gradient step on the features.

    The three unit vectors are moved by one plain gradient-descent step of
    the loss of the single triplet, ``f <- f - lr * dL/df`` (the features are
    treated as free parameters, as in eqs. 4-6), then re-normalized to the
    unit sphere; the result is the change of the two cosine similarities.
    The configuration is fixed up to rotation by ``S_ap``, ``S_an`` and
    ``gamma``, the cosine between the components of ``f_p`` and ``f_n``
    orthogonal to ``f_a``, so that ``S_pn = S_ap S_an + gamma sqrt(1 -
    S_ap^2) sqrt(1 - S_an^2)`` (eq. 19).

    Every loss gives a step of the form ``f_p' = c_p f_p + b_p f_a``,
    ``f_n' = c_n f_n - b_n f_a``, ``f_a' = f_a + b_p f_p - b_n f_n``:

    * ``"nca"``, 1st-order triplet NCA, ``L = softplus((S_an - S_ap) / T)``
      (eq. 1, ``tfdml.losses.TripletNCALoss(order=1)``): ``c = 1``,
      ``b_p = b_n = beta = lr e^{S_an/T} / (e^{S_ap/T} + e^{S_an/T}) / T``
      (eqs. 4-6; ``T = 1`` is the paper's ``beta``). New similarities are
      eqs. 7 and 8 (eq. 8, not the typo'd appendix eq. 18), norms eqs. 20-22.
    * ``"nca2"``, 2nd-order loss (eq. 16, ``TripletNCALoss(order=2)``):
      ``c = 1``, ``b_p = beta_w w_ap``, ``b_n = beta_w w_an`` with
      ``w_ap = 1 - S_ap``, ``w_an = S_an`` and ``beta_w = lr e^{v/T} /
      (e^{u/T} + e^{v/T}) / T``, ``u = S_ap - S_ap^2/2``, ``v = S_an^2/2``
      (eqs. 13-15, 23-27).
    * ``"margin"``, vanilla triplet loss with squared L2 distances (eq. 28,
      ``TripletMarginLoss(distance="squared_l2")``): ``b_p = b_n = beta``,
      ``c_p = 1 - beta``, ``c_n = 1 + beta`` (eqs. 32-39) with
      ``beta = 2 lr``. The appendix writes the gradients (eqs. 29-31) with a
      factor ``beta = 2`` (from the squares) and the step (eqs. 32-34) with
      the same ``beta``, i.e. it absorbs a learning rate of 1; here the step
      is ``lr`` times the true gradient, so the paper's printed figures
      correspond to ``lr = 1``. The hinge is assumed active (``D > 0``, as
      in the appendix) unless ``margin`` is given; then the changes are 0
      where ``2 (S_an - S_ap) + margin <= 0``.

    With ``f_a, f_p, f_n`` unit vectors, ``S_ap' = f_a'.f_p' / (|f_a'| |f_p'|)``
    and ``S_an' = f_a'.f_n' / (|f_a'| |f_n'|)``; the numerators and norms are
    expanded in ``S_ap``, ``S_an``, ``S_pn`` (for the NCA losses this is
    algebraically the same as the appendix's eqs. 7-8, 20-27). The
    entanglement totals are eqs. 11-12::

        ds_ap_total = ds_ap + p * q * ds_an
        ds_an_total = ds_an + p * q * ds_ap,   q = sqrt(max(S_ap * S_an, 0))

    The paper defines ``q = sqrt(S_ap S_an)`` only where the product is
    non-negative; where ``S_ap`` and ``S_an`` have opposite signs, ``q = 0``
    (no entanglement).

    The closed form agrees with autodiff of ``tfdml.losses`` on three
    explicit vectors (see the tests) to floating-point precision, for any
    ``lr``; it is exact, not a first-order approximation in ``lr``. For very
    large steps an updated feature can be the zero vector; the changes are
    then NaN.

    Args:
        s_ap: anchor-positive cosine similarity, scalar or array in ``[-1, 1]``.
        s_an: anchor-negative cosine similarity, in ``[-1, 1]``.
        gamma: the relative orientation of ``f_p`` and ``f_n`` around
            ``f_a`` (eq. 19), in ``[-1, 1]``.
        p: entanglement strength ``>= 0`` (eqs. 11-12). Defaults to `0.0`.
        loss: ``"nca"``, ``"nca2"`` or ``"margin"``. Defaults to `"nca"`.
        lr: learning rate ``> 0`` of the step on the features. Defaults to
            `0.1`.
        temperature: temperature ``T > 0`` of the NCA losses, as in
            ``TripletNCALoss``; ignored for ``"margin"``. Defaults to `1.0`
            (the paper's equations).
        margin: margin of the vanilla loss, ``>= 0``, or `None` to assume
            the hinge is active everywhere (the paper's appendix E). Ignored
            for the NCA losses. Defaults to `None`.

    Returns:
        A :class:`SimilarityChange` ``(ds_ap, ds_an, ds_ap_total,
        ds_an_total)`` of float64 arrays with the broadcast shape of
        ``s_ap``, ``s_an``, ``gamma`` and ``p``.

    Raises:
        ValueError: for similarities or ``gamma`` outside ``[-1, 1]``, a
            negative ``p``, ``lr``/``temperature`` not ``> 0``, a negative
            ``margin``, an unknown ``loss``, or shapes that do not broadcast.

    Examples:

    >>> import numpy as np
    >>> from tfdml.analysis.vector_field import similarity_change
    >>> s_ap, s_an = np.meshgrid(np.linspace(0, 1, 21), np.linspace(0, 1, 21))
    >>> change = similarity_change(s_ap, s_an, gamma=0.5, p=0.8, loss="nca2")
    >>> change.ds_an_total.shape
    (21, 21)

    Reference:
        "Extreme triplet learning: effectively optimizing easy positives and
        hard negatives", Section 4 and appendices A-E.
    """
    _check_loss(loss)
    lr = _check_positive_scalar(lr, "lr")
    temperature = _check_positive_scalar(temperature, "temperature")
    if margin is not None:
        if not is_number(margin) or not np.isfinite(margin) or margin < 0:
            raise ValueError(f"`margin` must be None or a finite number >= 0. "
                             f"Received: margin={margin!r}")
        margin = float(margin)
    s_ap_in, s_an_in, gamma_in, p_in = s_ap, s_an, gamma, p
    s_ap = _as_array(s_ap, "s_ap", -1.0, 1.0)
    s_an = _as_array(s_an, "s_an", -1.0, 1.0)
    gamma = _as_array(gamma, "gamma", -1.0, 1.0)
    p = _as_array(p, "p", 0.0)
    try:
        s_ap, s_an, gamma, p = np.broadcast_arrays(s_ap, s_an, gamma, p)
    except ValueError as err:
        raise ValueError(
            "`s_ap`, `s_an`, `gamma` and `p` must broadcast to one shape. Received shapes: "
            f"s_ap={np.shape(s_ap_in)}, s_an={np.shape(s_an_in)}, "
            f"gamma={np.shape(gamma_in)}, p={np.shape(p_in)}"
        ) from err

    sin_ap = np.sqrt(np.clip(1.0 - s_ap**2, 0.0, None))
    sin_an = np.sqrt(np.clip(1.0 - s_an**2, 0.0, None))
    s_pn = s_ap * s_an + gamma * sin_ap * sin_an  # eq. 19

    c_p, b_p, c_n, b_n = _step_coefficients(s_ap, s_an, loss, lr, temperature, margin)

    # Dot products of f_a' = f_a + b_p f_p - b_n f_n with f_p' and f_n' (eqs. 7-8, 23-24, 38-39).
    dot_ap = c_p * s_ap + b_p + b_p * c_p - b_n * c_p * s_pn + b_p**2 * s_ap - b_p * b_n * s_an
    dot_an = c_n * s_an - b_n - b_n * c_n + b_p * c_n * s_pn - b_p * b_n * s_ap + b_n**2 * s_an
    # Squared norms (eqs. 20-22, 25-27, 35-37).
    sq_a = 1.0 + b_p**2 + b_n**2 + 2.0 * b_p * s_ap - 2.0 * b_n * s_an - 2.0 * b_p * b_n * s_pn
    sq_p = c_p**2 + b_p**2 + 2.0 * c_p * b_p * s_ap
    sq_n = c_n**2 + b_n**2 - 2.0 * c_n * b_n * s_an
    with np.errstate(divide="ignore", invalid="ignore"):
        ds_ap = dot_ap / np.sqrt(np.clip(sq_a * sq_p, 0.0, None)) - s_ap  # eq. 9
        ds_an = dot_an / np.sqrt(np.clip(sq_a * sq_n, 0.0, None)) - s_an  # eq. 10
    pq = p * np.sqrt(np.clip(s_ap * s_an, 0.0, None))
    return SimilarityChange(
        ds_ap=ds_ap,
        ds_an=ds_an,
        ds_ap_total=ds_ap + pq * ds_an,  # eq. 11
        ds_an_total=ds_an + pq * ds_ap,  # eq. 12
    )


# -- plotting ---------------------------------------------------------------------------------


def _check_grid(grid, minimum=2):
    if not isinstance(grid, numbers.Integral) or isinstance(grid, bool) or grid < minimum:
        raise ValueError(f"`grid` must be an int >= {minimum}. Received: grid={grid!r}")
    return int(grid)


def _extent(region):
    if isinstance(region, str):
        if region not in _REGIONS:
            raise ValueError("`region` must be 'positive', 'full' or a tuple (s_ap_min, "
                             f"s_ap_max, s_an_min, s_an_max). Received: region={region!r}")
        return _REGIONS[region]
    try:
        values = tuple(float(v) for v in region)
    except (TypeError, ValueError):
        values = ()
    if (len(values) != 4 or not all(-1.0 <= v <= 1.0 for v in values)
            or not values[0] < values[1] or not values[2] < values[3]):
        raise ValueError("`region` must be 'positive', 'full' or a tuple (s_ap_min, s_ap_max, "
                         "s_an_min, s_an_max) of increasing pairs in [-1, 1]. "
                         f"Received: region={region!r}")
    return values


def _scalar_in(value, name, low, high=None):
    if not is_number(value) or not np.isfinite(value) or value < low or (
            high is not None and value > high):
        what = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise ValueError(f"`{name}` must be a number {what}. Received: {name}={value!r}")
    return float(value)


def _grid(extent, n):
    s_ap = np.linspace(extent[0], extent[1], n)
    s_an = np.linspace(extent[2], extent[3], n)
    return np.meshgrid(s_ap, s_an)  # rows follow S_an (y), columns S_ap (x)


def _decorate(ax, extent, title):
    lo, hi = max(extent[0], extent[2]), min(extent[1], extent[3])
    if lo < hi:
        ax.plot([lo, hi], [lo, hi], color="0.4", linestyle="--", linewidth=0.8)
    ax.set_xlim(extent[0], extent[1])
    ax.set_ylim(extent[2], extent[3])
    ax.set_aspect("equal")
    ax.set_xlabel(r"$S_{ap}$")
    ax.set_ylabel(r"$S_{an}$")
    ax.set_title(title, fontsize=9)


def plot_vector_field(
    gamma: float,
    p: float,
    loss: str = "nca",
    ax=None,
    grid: int = 21,
    region="positive",
    lr: float = 0.1,
    *,
    style: str = "quiver",
    temperature: float = 1.0,
    margin: float | None = None,
):
    """Draws the vector field ``(ds_ap_total, ds_an_total)`` on the scatter diagram.

    The bottom row of Figure 2 of the paper: at each point ``(S_ap, S_an)``
    of a grid, the direction in which one gradient step moves the triplet,
    with the entanglement model (see :func:`similarity_change`). Arrows have
    unit length (the magnitudes vary over orders of magnitude, vanishing at
    the corners) and are coloured by ``log10`` of the magnitude (blue: slow,
    green: fast); the dashed line is ``S_an = S_ap``.

    Args:
        gamma: relative orientation of the triplet, in ``[-1, 1]``.
        p: entanglement strength, ``>= 0``.
        loss: ``"nca"``, ``"nca2"`` or ``"margin"``. Defaults to `"nca"`.
        ax: matplotlib Axes to draw into. Defaults to `None` (a new figure).
        grid: number of grid points per axis, ``>= 2``. Defaults to `21`.
        region: ``"positive"`` (``[0, 1]^2``, the paper's ``Omega_s``),
            ``"full"`` (``[-1, 1]^2``) or a tuple ``(s_ap_min, s_ap_max,
            s_an_min, s_an_max)`` to zoom in. Defaults to `"positive"`.
        lr: learning rate of the step. Defaults to `0.1`.
        style: ``"quiver"`` (arrows) or ``"stream"`` (streamlines).
            Defaults to `"quiver"`.
        temperature, margin: as in :func:`similarity_change`.

    Returns:
        The matplotlib Axes.

    Raises:
        ImportError: if matplotlib is not installed.
        ValueError: for invalid arguments (see :func:`similarity_change`).
    """
    _check_loss(loss)
    gamma = _scalar_in(gamma, "gamma", -1.0, 1.0)
    p = _scalar_in(p, "p", 0.0)
    grid = _check_grid(grid)
    extent = _extent(region)
    if style not in ("quiver", "stream"):
        raise ValueError(f"`style` must be 'quiver' or 'stream'. Received: style={style!r}")
    s_ap, s_an = _grid(extent, grid)
    change = similarity_change(s_ap, s_an, gamma, p, loss, lr,
                               temperature=temperature, margin=margin)
    u, v = change.ds_ap_total, change.ds_an_total
    plt = import_pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 4.2))
    from matplotlib.colors import Normalize

    magnitude = np.hypot(u, v)
    moving = np.isfinite(magnitude) & (magnitude > 0)
    log_mag = np.log10(np.where(moving, magnitude, 1.0))
    if moving.any():
        log_mag = np.where(moving, log_mag, log_mag[moving].min())
    # Percentiles: a single point at rest (e.g. the corner (1, 1)) would stretch the scale.
    low, high = np.percentile(log_mag, [5, 100])
    norm = Normalize(vmin=low, vmax=max(high, low + 1e-12))
    # Points that do not move (the corners, an inactive hinge) get zero-length arrows.
    scale = np.where(moving, magnitude, 1.0)
    u_dir = np.where(moving, u / scale, 0.0)
    v_dir = np.where(moving, v / scale, 0.0)
    if style == "quiver":
        ax.quiver(s_ap, s_an, u_dir, v_dir, log_mag, cmap=_CMAP, norm=norm, angles="xy",
                  pivot="mid", scale=1.25 * (grid - 1) / (extent[1] - extent[0]),
                  scale_units="x", width=0.006)
    else:
        ax.streamplot(s_ap[0], s_an[:, 0], np.where(moving, u, 0.0), np.where(moving, v, 0.0),
                      color=log_mag, cmap=_CMAP, norm=norm, density=1.0, linewidth=0.9,
                      arrowsize=0.9)
    _decorate(ax, extent, f"{_LOSS_LABELS[loss]}: $\\gamma$={gamma:g}, p={p:g}")
    return ax


_QUANTITY_INFO = {
    "ds_ap": (r"$\Delta S_{ap} < 0$", "tab:blue"),
    "ds_an": (r"$\Delta S_{an} > 0$", "tab:red"),
    "ds_ap_total": (r"$\Delta S_{ap}^{total} < 0$", "tab:blue"),
    "ds_an_total": (r"$\Delta S_{an}^{total} > 0$", "tab:red"),
}


def problem_masks(gamma, p=0.0, loss="nca", grid=101, region="positive", lr=0.1, **kwargs):
    """The grid and the four problem masks drawn by :func:`plot_problem_regions`.

    Returns:
        ``(s_ap, s_an, masks)``: ``[grid, grid]`` coordinates (rows follow
        ``S_an``) and a dict with keys ``"ds_ap"`` (``ds_ap < 0``),
        ``"ds_an"`` (``ds_an > 0``), ``"ds_ap_total"``, ``"ds_an_total"``.
    """
    grid = _check_grid(grid)
    s_ap, s_an = _grid(_extent(region), grid)
    change = similarity_change(s_ap, s_an, gamma, p, loss, lr, **kwargs)
    masks = {
        "ds_ap": change.ds_ap < 0,
        "ds_an": change.ds_an > 0,
        "ds_ap_total": change.ds_ap_total < 0,
        "ds_an_total": change.ds_an_total > 0,
    }
    return s_ap, s_an, masks


def plot_problem_regions(
    gamma: float,
    p: float = 0.0,
    loss: str = "nca",
    axes=None,
    quantities=QUANTITIES,
    grid: int = 101,
    region="positive",
    lr: float = 0.1,
    *,
    temperature: float = 1.0,
    margin: float | None = None,
):
    """Draws the regions where a gradient step moves a triplet the wrong way.

    The top rows of Figure 2 and Figure 5 of the paper: in colour, where
    the anchor-positive similarity decreases (``ds_ap < 0``, blue) or the
    anchor-negative similarity increases (``ds_an > 0``, red), without
    (``"ds_ap"``, ``"ds_an"``) and with (``"ds_ap_total"``,
    ``"ds_an_total"``) the entanglement model. One panel per quantity.

    Args:
        gamma: relative orientation of the triplet, in ``[-1, 1]``.
        p: entanglement strength ``>= 0`` (only the totals use it).
            Defaults to `0.0`.
        loss: ``"nca"``, ``"nca2"`` or ``"margin"``. Defaults to `"nca"`.
        axes: a sequence of matplotlib Axes, one per quantity. Defaults to
            `None` (a new figure with one row of panels).
        quantities: which panels, among ``"ds_ap"``, ``"ds_an"``,
            ``"ds_ap_total"``, ``"ds_an_total"``. Defaults to all four.
        grid: grid points per axis, ``>= 2``. Defaults to `101`.
        region: ``"positive"``, ``"full"`` or a tuple, as in
            :func:`plot_vector_field`. Defaults to `"positive"`.
        lr: learning rate of the step. Defaults to `0.1`.
        temperature, margin: as in :func:`similarity_change`.

    Returns:
        The matplotlib Figure holding the panels.

    Raises:
        ImportError: if matplotlib is not installed.
        ValueError: for invalid arguments, an unknown quantity, or a number
            of axes different from the number of quantities.
    """
    _check_loss(loss)
    gamma = _scalar_in(gamma, "gamma", -1.0, 1.0)
    p = _scalar_in(p, "p", 0.0)
    if isinstance(quantities, str):
        quantities = (quantities,)
    quantities = tuple(quantities)
    if not quantities or any(q not in QUANTITIES for q in quantities):
        raise ValueError(f"`quantities` must be a non-empty sequence of {QUANTITIES}. "
                         f"Received: quantities={quantities!r}")
    extent = _extent(region)
    s_ap, s_an, masks = problem_masks(gamma, p, loss, grid, extent, lr,
                                      temperature=temperature, margin=margin)
    plt = import_pyplot()
    from matplotlib.colors import ListedColormap

    if axes is None:
        fig, axes = plt.subplots(1, len(quantities), figsize=(3.2 * len(quantities), 3.4),
                                 squeeze=False)
        axes = axes[0]
    else:
        axes = list(np.ravel(axes))
        if len(axes) != len(quantities):
            raise ValueError(f"`axes` must hold one Axes per quantity ({len(quantities)}). "
                             f"Received: {len(axes)} axes")
        fig = axes[0].figure
    for ax, quantity in zip(axes, quantities, strict=True):
        label, color = _QUANTITY_INFO[quantity]
        ax.pcolormesh(s_ap, s_an, masks[quantity].astype(float), shading="nearest",
                      cmap=ListedColormap(["white", color]), vmin=0.0, vmax=1.0)
        title = f"{_LOSS_LABELS[loss]}: {label}\n$\\gamma$={gamma:g}"
        if quantity.endswith("total"):
            title += f", p={p:g}"
        _decorate(ax, extent, title)
    return fig
