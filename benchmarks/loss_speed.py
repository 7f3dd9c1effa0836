"""Forward+backward speed and peak memory of the triplet losses, relative to a bare floor.

For every batch size ``B`` (embedding size ``D``), with and without XLA, it times
the loss value and its gradient w.r.t. the embeddings inside one ``tf.function``:

* ``nca2-ephn``: ``TripletNCALoss(order=2)`` with ``TripletMiner("easy", "hard")``;
* ``margin-semihard``: ``TripletMarginLoss`` with ``TripletMiner("all", "semihard")``;
* ``floor``: L2-normalize + ``B x B`` matmul + sum, the least any of these losses does.

``--losses`` picks others (not run by default): ``margin-dw`` (``MarginLoss``, random
positive + distance-weighted negative), ``margin-dw-all`` (``MarginLoss``, every positive,
each with a distance-weighted negative: one inverse-CDF sort per anchor), ``ms``
(``MultiSimilarityLoss`` with its pair mining) and ``ms-eps`` (the same with easy positives);
the LoOp losses ``loop-triplet``, ``loop-hphn``, ``loop-ls``, ``loop-ms`` and their bases
``triplet-all`` (``TripletMarginLoss``, L2, every triplet), ``hphn``, ``ls`` and ``ms``;
``fappy-0.01``, ``fappy-0.0001`` (``FAPPYLoss`` with that ``min_bin_width``) and
``histogram`` (``HistogramLoss``, bin width 0.01); ``tfa-semihard`` and ``tfa-lifted``
(``tfdml.compat.tfa``'s ``TripletSemiHardLoss`` and ``LiftedStructLoss``) next to
``tiled-semihard`` and ``tiled-lifted``, the same losses written the way TensorFlow Addons
computes them (a ``B x B x B`` tensor; not run when it would exceed ``TILED_LIMIT_GIB``).
With a ``tfa-*`` loss the report ends with their values and gradients on float16 and
bfloat16 embeddings (mixed-precision policies) against float64, at B = 128 and 512.

The losses with state (``--losses``, not run by default):

* the losses with learned class vectors, ``proxy-anchor``, ``proxy-nca``,
  ``normalized-softmax``, ``cosface``, ``arcface``, ``subcenter-arcface`` (3 sub-centres per
  class) and ``soft-triple`` (10 centres per class), each with its class's default settings.
  They are timed through their **functional forms** (``tfdml.losses.proxy_anchor_loss``...)
  with one fixed random ``tf.Variable`` of class vectors (``[C, D]``, or ``[C, k, D]``;
  standard normal / sqrt(D), seed ``SEED + 1``), ``C = --classes`` (default 1000), and
  **their gradient is taken with respect to the embeddings and the class vectors**, as a
  training step needs both. Class ids are the ``B/4`` batch classes modulo ``C``.
  ``class-floor`` is their yardstick: L2-normalize the embeddings and the ``[C, D]`` vectors,
  ``B x C`` matmul, sum, with the same two gradients; the ratio column still divides by the
  ``B x B`` floor, so compare a class loss with ``class-floor`` at the same B and XLA setting;
* ``supcon``, ``ntxent``, ``circle``: ``SupConLoss()``, ``NTXentLoss()``, ``CircleLoss()``
  (all pairs of the batch);
* ``xbm-contrastive``: ``CrossBatchMemory(ContrastiveLoss(), memory_size=4 * B)`` with its bank
  built (``loss.build_state(D)``) and filled with random embeddings and labels before the first
  call, so that every call mines against ``B + 4B`` references and writes the batch into the
  bank (a training call). It also computes the loss against the batch alone (its no-memory
  branch, selected with ``where``), so expect about ``(5 + 1) x`` the pair work of the plain
  ``ContrastiveLoss``.

Each (loss, B, XLA) configuration runs in a fresh worker process (this file run with
``--worker``), so that the peak resident set size (``ru_maxrss``) belongs to that
configuration alone: it is read before the first loss call, after the warm-up calls and
after a few more calls of the loss alone. A loss worker then compiles the floor (same
B/D/XLA setting) and times loss and floor in alternating rounds, so that both see the
same machine load; the reported ratio is loss time / floor time of that one process. A
floor worker measures only the floor.

Timings leave out the warm-up calls (tracing and compilation) and are medians over the
timed rounds (``time.perf_counter``). Wall-clock times on a shared machine are noisy;
the ratios are the comparable quantity.

Usage::

    python benchmarks/loss_speed.py [--sizes 128 512 2048] [--dim 512] [--repeats N]
                                    [--classes 1000] [--losses NAME ...]
                                    [--output benchmarks/results/loss_speed.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import time

from class_losses import CLASS_LOSSES  # benchmarks/class_losses.py
from workers import (  # benchmarks/workers.py
    log,
    machine_info,
    make_inputs,
    mib,
    peak_rss_kib,
    run_worker,
    write_report,
)

LOSSES = ("floor", "nca2-ephn", "margin-semihard")
LOSS_LABELS = {
    "floor": "floor (normalize + B x B matmul + sum)",
    "nca2-ephn": "TripletNCALoss(order=2), EPHN",
    "margin-semihard": "TripletMarginLoss, all/semihard",
    "margin-dw": "MarginLoss, random/distance_weighted",
    "margin-dw-all": "MarginLoss, all/distance_weighted",
    "ms": "MultiSimilarityLoss, MultiSimilarityMiner()",
    "ms-eps": "MultiSimilarityLoss, MultiSimilarityMiner(positive='easy')",
    "triplet-all": "TripletMarginLoss(distance='l2'), all/all",
    "hphn": "HPHNTripletLoss",
    "ls": "LiftedStructureLoss (eq. 16)",
    "loop-triplet": "LoOpLoss('triplet')",
    "loop-hphn": "LoOpLoss('hphn_triplet')",
    "loop-ls": "LoOpLoss('lifted_structure')",
    "loop-ms": "LoOpLoss('multi_similarity')",
    "fappy-0.01": "FAPPYLoss(min_bin_width=0.01)",
    "fappy-0.0001": "FAPPYLoss(min_bin_width=0.0001)",
    "histogram": "HistogramLoss(bin_width=0.01)",
    "tfa-semihard": "tfdml.compat.tfa TripletSemiHardLoss (O(B^2))",
    "tiled-semihard": "semi-hard triplet loss computed as TFA does (B x B x B)",
    "tfa-lifted": "tfdml.compat.tfa LiftedStructLoss (O(B^2))",
    "tiled-lifted": "lifted structured loss computed as TFA does (B x B x B)",
    "class-floor": "class floor (normalize x and [C, D] vectors + B x C matmul + sum; "
                   "gradients w.r.t. both)",
    "proxy-anchor": "proxy_anchor_loss (ProxyAnchorLoss), [C, D] proxies",
    "proxy-nca": "proxy_nca_loss (ProxyNCALoss), [C, D] proxies",
    "normalized-softmax": "normalized_softmax_loss (NormalizedSoftmaxLoss), [C, D] weights",
    "cosface": "cosface_loss (CosFaceLoss), [C, D] weights",
    "arcface": "arcface_loss (ArcFaceLoss), [C, D] weights",
    "subcenter-arcface": "subcenter_arcface_loss (SubCenterArcFaceLoss), [C, 3, D] sub-centres",
    "soft-triple": "soft_triple_loss (SoftTripleLoss), [C, 10, D] centres",
    "supcon": "SupConLoss()",
    "ntxent": "NTXentLoss()",
    "circle": "CircleLoss()",
    "xbm-contrastive": "CrossBatchMemory(ContrastiveLoss(), memory_size=4*B), bank full",
}
DEFAULT_CLASSES = 1000
XBM_MEMORY_FACTOR = 4  # xbm-contrastive: memory_size = 4 * B
TILED_LIMIT_GIB = 8.0  # a tiled configuration needing more (B^3 float32) is reported, not run
ALL_LOSSES = tuple(LOSS_LABELS)
SAMPLES_PER_CLASS = 4
SEED = 1234
WARMUP_CALLS = 2
MEMORY_CALLS = 3  # untimed calls after the warm-up, before the peak RSS is read
MIN_REPEATS = 3
MAX_REPEATS = 50
TIME_BUDGET_S = 4.0  # seconds of timed rounds per worker when --repeats is not given
WORKER_TIMEOUT_S = 900
RESULT_PREFIX = "LOSS_SPEED_RESULT "

# -- worker -------------------------------------------------------------------------------------


def _current_rss_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _class_loss_fn(name, dim, classes):
    """A class loss's functional form on a fixed random variable of class vectors.

    The returned function has the attribute ``class_vectors``: a tuple with the variable of
    class vectors, whose gradient the step computes with the embeddings'.
    """
    import numpy as np
    import tensorflow as tf

    import tfdml

    func_name, per_class = CLASS_LOSSES[name]
    shape = (classes, dim) if per_class is None else (classes, per_class, dim)
    rng = np.random.default_rng(SEED + 1)
    vectors = tf.Variable((rng.standard_normal(shape) / np.sqrt(dim)).astype(np.float32),
                          name="class_vectors")
    if func_name is None:

        def fn(labels, embeddings):
            del labels
            x = tfdml.ops.l2_normalize(embeddings)
            w = tfdml.ops.l2_normalize(vectors)
            return tf.reduce_sum(tf.matmul(x, w, transpose_b=True))

    else:
        loss = getattr(tfdml.losses, func_name)

        def fn(labels, embeddings):
            return loss(labels, embeddings, vectors)

    fn.class_vectors = (vectors,)
    return fn


def _xbm_loss(batch, dim):
    """``CrossBatchMemory(ContrastiveLoss())`` with a full bank of random embeddings."""
    import numpy as np

    import tfdml

    memory = XBM_MEMORY_FACTOR * batch
    loss = tfdml.losses.CrossBatchMemory(tfdml.losses.ContrastiveLoss(), memory_size=memory)
    bank = loss.build_state(dim)
    rng = np.random.default_rng(SEED + 2)
    bank.embeddings.assign(rng.standard_normal((memory, dim), dtype=np.float32))
    bank.labels.assign(rng.integers(0, max(1, batch // SAMPLES_PER_CLASS), memory,
                                    dtype=np.int32))
    bank.filled.assign(memory)
    return loss


def _loss_fn(name, batch=None, dim=None, classes=DEFAULT_CLASSES):
    import tensorflow as tf

    import tfdml

    if name in CLASS_LOSSES:
        return _class_loss_fn(name, dim, classes)
    if name == "xbm-contrastive":
        return _xbm_loss(batch, dim)
    if name == "supcon":
        return tfdml.losses.SupConLoss()
    if name == "ntxent":
        return tfdml.losses.NTXentLoss()
    if name == "circle":
        return tfdml.losses.CircleLoss()
    if name == "floor":

        def floor(labels, embeddings):
            del labels
            x = tfdml.ops.l2_normalize(embeddings)
            return tf.reduce_sum(tf.matmul(x, x, transpose_b=True))

        return floor
    if name == "nca2-ephn":
        return tfdml.losses.TripletNCALoss(order=2, miner=tfdml.miners.TripletMiner("easy", "hard"))
    if name == "margin-semihard":
        return tfdml.losses.TripletMarginLoss(miner=tfdml.miners.TripletMiner("all", "semihard"))
    miners = tfdml.miners
    if name in ("margin-dw", "margin-dw-all"):
        positive = "all" if name == "margin-dw-all" else "random"
        return tfdml.losses.MarginLoss(
            learn_beta=False, miner=miners.TripletMiner(positive, "distance_weighted", seed=SEED)
        )
    if name in ("ms", "ms-eps"):
        positive = "easy" if name == "ms-eps" else "hard"
        return tfdml.losses.MultiSimilarityLoss(miner=miners.MultiSimilarityMiner(positive=positive))
    if name == "triplet-all":
        return tfdml.losses.TripletMarginLoss(distance="l2", miner=miners.TripletMiner("all", "all"))
    if name == "hphn":
        return tfdml.losses.HPHNTripletLoss()
    if name == "ls":
        return tfdml.losses.LiftedStructureLoss()
    if name.startswith("loop-"):
        base = {"triplet": "triplet", "hphn": "hphn_triplet", "ls": "lifted_structure",
                "ms": "multi_similarity"}[name[5:]]
        return tfdml.losses.LoOpLoss(base)
    if name == "tfa-semihard":
        return tfdml.compat.tfa.losses.TripletSemiHardLoss()
    if name == "tfa-lifted":
        return tfdml.compat.tfa.losses.LiftedStructLoss()
    if name == "tiled-semihard":
        return _tiled_semihard
    if name == "tiled-lifted":
        return _tiled_lifted
    if name.startswith("fappy-"):
        return tfdml.losses.FAPPYLoss(min_bin_width=float(name[6:]))
    if name == "histogram":
        return tfdml.losses.HistogramLoss()
    raise ValueError(f"unknown loss {name!r}")


def _tiled_setup(labels, embeddings):
    import tensorflow as tf

    import tfdml

    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    dist = tfdml.compat.tfa.pairwise_distance(embeddings)
    same = tf.equal(labels[:, None], labels[None, :])
    eye = tf.eye(tf.shape(dist)[0], dtype=tf.bool)
    return tf, dist, same, tf.logical_not(same), tf.logical_and(same, tf.logical_not(eye))


def _tiled_semihard(labels, embeddings, margin=1.0):
    """TFA's semi-hard loss with its [B, B, B] comparison (for the comparison only)."""
    tf, dist, same, negative, positive = _tiled_setup(labels, embeddings)
    # farther[a, p, k]: negative k of anchor a farther than positive p.
    farther = tf.logical_and(negative[:, None, :], dist[:, None, :] > dist[:, :, None])
    row_max = tf.reduce_max(dist, axis=1)[:, None, None]
    outside = tf.reduce_min((dist[:, None, :] - row_max) * tf.cast(farther, dist.dtype),
                            axis=2) + row_max[:, :, 0]
    row_min = tf.reduce_min(dist, axis=1, keepdims=True)
    inside = tf.reduce_max((dist - row_min) * tf.cast(negative, dist.dtype), axis=1,
                           keepdims=True) + row_min
    d_an = tf.where(tf.reduce_any(farther, axis=2), outside, inside)
    weights = tf.cast(positive, dist.dtype)
    hinge = tf.maximum((margin + dist - d_an) * weights, 0.0)
    return tf.math.divide_no_nan(tf.reduce_sum(hinge), tf.reduce_sum(weights))


def _tiled_lifted(labels, embeddings, margin=1.0):
    """TFA's lifted structured loss with its [B, B, B] sum of exponentials."""
    tf, dist, same, negative, positive = _tiled_setup(labels, embeddings)
    diff = margin - dist
    mask = tf.cast(negative, dist.dtype)
    row_min = tf.reduce_min(diff, axis=1, keepdims=True)
    row_neg_max = tf.reduce_max((diff - row_min) * mask, axis=1, keepdims=True) + row_min
    top = tf.maximum(row_neg_max, tf.transpose(row_neg_max))  # [B, B]
    # left[i, j] = sum_k mask[j, k] exp(diff[j, k] - top[i, j]): a [B, B, B] tensor.
    left = tf.reduce_sum(mask[None, :, :] * tf.exp(diff[None, :, :] - top[:, :, None]), axis=2)
    j = top + tf.math.log(left + tf.transpose(left)) + dist
    weights = tf.cast(positive, dist.dtype)
    hinge = tf.square(tf.maximum(j * weights, 0.0))
    return tf.math.divide_no_nan(0.25 * tf.reduce_sum(hinge), 0.5 * tf.reduce_sum(weights))


def _step(fn, xla):
    """The loss value and its gradients w.r.t. the embeddings (and ``fn.class_vectors``,
    the class vectors of a class loss) in one ``tf.function``."""
    import tensorflow as tf

    variables = list(getattr(fn, "class_vectors", ()))

    @tf.function(jit_compile=xla)
    def step(labels, embeddings):
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            value = fn(labels, embeddings)
        return value, tape.gradient(value, [embeddings] + variables)

    return step


def _call(step, labels, embeddings):
    value, grads = step(labels, embeddings)
    # Fetching the results waits for the computation to finish.
    value.numpy()
    for grad in grads:
        grad.numpy()


def _measure(loss, batch, dim, xla, repeats, classes=DEFAULT_CLASSES):
    import keras
    import tensorflow as tf

    if loss.startswith("tiled-") and batch**3 * 4 / 2**30 > TILED_LIMIT_GIB:
        raise MemoryError(f"not run: one [B, B, B] float32 tensor needs "
                          f"{batch**3 * 4 / 2**30:.0f} GiB (limit {TILED_LIMIT_GIB:g} GiB)")
    labels_np, embeddings_np = make_inputs(batch, dim, SEED, SAMPLES_PER_CLASS)
    if loss in CLASS_LOSSES:
        labels_np = labels_np % classes  # class ids must index the class vectors
    labels = tf.constant(labels_np)
    embeddings = tf.constant(embeddings_np)
    step = _step(_loss_fn(loss, batch, dim, classes), xla)

    result = {"loss": loss, "batch": batch, "dim": dim, "xla": xla, "classes": classes,
              "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}
    result["rss_base_kib"] = peak_rss_kib()
    result["rss_base_current_kib"] = _current_rss_kib()

    t0 = time.perf_counter()
    for _ in range(WARMUP_CALLS):
        _call(step, labels, embeddings)
    result["warmup_s"] = time.perf_counter() - t0
    result["rss_warm_kib"] = peak_rss_kib()
    # A few more calls of the loss alone: the peak must not grow past the warm-up's.
    for _ in range(MEMORY_CALLS):
        _call(step, labels, embeddings)
    result["rss_peak_kib"] = peak_rss_kib()
    result["loadavg_start"] = os.getloadavg()[0]

    if loss == "floor":
        (times,) = _timed_rounds([step], labels, embeddings, repeats)
        floor_times = times
    else:
        # The floor, compiled only now so that it does not affect the loss's memory readings,
        # timed in rounds alternating with the loss so that both see the same machine load.
        floor = _step(_loss_fn("floor", batch, dim, classes), xla)
        for _ in range(WARMUP_CALLS):
            _call(floor, labels, embeddings)
        times, floor_times = _timed_rounds([step, floor], labels, embeddings, repeats)
    result["times_s"] = times
    result["median_s"] = statistics.median(times)
    result["floor_times_s"] = floor_times
    result["floor_median_s"] = statistics.median(floor_times)
    result["rss_end_kib"] = peak_rss_kib()
    result["loadavg_end"] = os.getloadavg()[0]
    return result


def _timed_rounds(steps, labels, embeddings, repeats):
    """Per-call seconds of each step, called once per round (in alternating order).

    Runs exactly ``repeats`` rounds, or, if None, rounds until about TIME_BUDGET_S has
    passed (at least MIN_REPEATS, at most MAX_REPEATS).
    """
    times = [[] for _ in steps]
    start = time.perf_counter()
    rounds = 0
    while True:
        order = range(len(steps)) if rounds % 2 == 0 else reversed(range(len(steps)))
        for i in order:
            t = time.perf_counter()
            _call(steps[i], labels, embeddings)
            times[i].append(time.perf_counter() - t)
        rounds += 1
        if repeats is not None:
            if rounds >= repeats:
                return times
        elif rounds >= MAX_REPEATS or (
            rounds >= MIN_REPEATS and time.perf_counter() - start >= TIME_BUDGET_S
        ):
            return times


# -- driver -------------------------------------------------------------------------------------


def _spawn(loss, batch, dim, xla, repeats, classes=DEFAULT_CLASSES):
    args = ["--loss", loss, "--batch", batch, "--dim", dim, "--xla", int(xla),
            "--classes", classes]
    if repeats is not None:
        args += ["--repeats", repeats]
    return run_worker(__file__, args, RESULT_PREFIX, WORKER_TIMEOUT_S)


def _row(config, result):
    loss, batch, xla = config
    xla_s = "yes" if xla else "no"
    if "error" in result:
        error = result["error"].replace("|", "/")
        peak = f"{mib(result['rss_peak_kib']):.0f}" if "rss_peak_kib" in result else ""
        return f"| {loss} | {batch} | {xla_s} | FAILED: {error} | | | {peak} | | |"
    med = result["median_s"] * 1e3
    floor = result["floor_median_s"] * 1e3
    peak = mib(result["rss_peak_kib"])
    increase = mib(result["rss_peak_kib"] - result["rss_base_kib"])
    growth = mib(result["rss_peak_kib"] - result["rss_warm_kib"])
    n = len(result["times_s"])
    return (
        f"| {loss} | {batch} | {xla_s} | {med:.2f} (n={n}) | {med / floor:.2f} | {floor:.2f} "
        f"| {peak:.0f} | {increase:.0f} | {growth:.0f} |"
    )


def _report(args, results, machine, started, elapsed, load):
    lines = [
        "# Loss speed benchmark",
        "",
        f"- command: `{shlex.join(['python', 'benchmarks/loss_speed.py'] + sys.argv[1:])}`",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine}",
        f"- D = {args.dim}; labels: B/{SAMPLES_PER_CLASS} classes x {SAMPLES_PER_CLASS} "
        f"samples each, shuffled; embeddings: standard normal, float32; seed {SEED}",
        "- timing: forward+backward (value and gradient w.r.t. the embeddings"
        + (f"; and w.r.t. the class vectors for the class losses, C = {args.classes}"
           if any(loss in CLASS_LOSSES for loss in args.losses) else "")
        + f") in one tf.function; {WARMUP_CALLS} warm-up calls excluded; median of n rounds, "
        f"each round one call of the loss and one of the floor (alternating order)",
        f"- total run time: {elapsed:.0f} s; 1-minute load average {load[0]:.2f} at the "
        f"start, {load[1]:.2f} at the end",
        "",
        "| loss | B | XLA | median ms | ratio to floor | floor ms | peak RSS MiB "
        "| RSS increase MiB | growth after warm-up MiB |",
        "|---|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, result in results:
        lines.append(_row(config, result))
    lines += [
        "",
        "Losses: " + "; ".join(f"`{k}` = {v}" for k, v in LOSS_LABELS.items()
                               if k in args.losses) + ".",
        "",
        "Ratio to floor: loss median / floor median, both timed in alternating rounds in "
        "the same worker process (floor rows: their own worker, ratio 1 by definition). "
        f"Peak RSS: `ru_maxrss` of the worker after the warm-up and {MEMORY_CALLS} more "
        "calls of the loss, before the floor is compiled (includes the TensorFlow runtime). "
        "RSS increase: peak minus the peak just before the first loss call (inputs created); "
        "it includes compilation, so compare it with the floor's. Growth after warm-up: "
        f"peak after the {MEMORY_CALLS} further calls minus peak after the warm-up calls.",
    ]
    lines += ["", _semihard_proof(results)]
    failed = [c for c, r in results if "error" in r]
    if failed:
        lines += ["", f"{len(failed)} configuration(s) failed: " + ", ".join(
            f"{loss} B={b} XLA={'yes' if x else 'no'}" for loss, b, x in failed) + "."]
    return "\n".join(lines) + "\n"


def _cube_size(batch):
    cube = batch**3 * 4
    return f"{cube / 2**30:.2f} GiB" if cube >= 2**30 else f"{cube / 2**20:.1f} MiB"


def _semihard_proof(results):
    by_config = dict(results)
    semihard = [(c, r) for c, r in results if c[0] == "margin-semihard"]
    if not semihard:
        return "Semi-hard memory: `margin-semihard` was not run."

    def describe(batch, xla):
        r = by_config.get(("margin-semihard", batch, xla))
        if r is None:
            return "not run"
        if "error" in r:
            return f"FAILED ({r['error']})"
        text = (f"peak RSS {mib(r['rss_peak_kib']):.0f} MiB, increase "
                f"{mib(r['rss_peak_kib'] - r['rss_base_kib']):.0f} MiB")
        floor = by_config.get(("floor", batch, xla))
        if floor is not None and "error" not in floor:
            text += f" (floor: {mib(floor['rss_peak_kib'] - floor['rss_base_kib']):.0f} MiB)"
        return text

    batches = sorted({c[1] for c, _ in semihard})
    largest = batches[-1]
    lines = [
        f"Semi-hard memory: at B={largest} a [B, B, B] float32 tensor would take "
        f"{largest}^3 * 4 bytes = {_cube_size(largest)}. Measured for `margin-semihard`, "
        f"B={largest}: without XLA: {describe(largest, False)}; "
        f"with XLA: {describe(largest, True)}.",
        "",
        "| B | [B, B, B] float32 | without XLA | with XLA |",
        "|---:|---:|---|---|",
    ]
    for batch in batches:
        lines.append(f"| {batch} | {_cube_size(batch)} | {describe(batch, False)} "
                     f"| {describe(batch, True).replace('|', '/')} |")
    return "\n".join(lines)


PRECISION_SIZES = (128, 512)


def _precision_check(losses, dim):
    """The tfa-* losses on float16 / bfloat16 embeddings (what a model under a
    mixed_float16 / mixed_bfloat16 policy outputs) against float64: value and gradient."""
    import numpy as np
    import tensorflow as tf

    import tfdml

    fns = {"tfa-semihard": tfdml.compat.tfa.losses.triplet_semihard_loss,
           "tfa-lifted": tfdml.compat.tfa.losses.lifted_struct_loss}
    rows = []
    for name in [n for n in losses if n in fns]:
        for batch in PRECISION_SIZES:
            labels, embeddings = make_inputs(batch, dim, SEED, SAMPLES_PER_CLASS)
            # Unit-norm embeddings as an embedding model outputs them (float16 range).
            embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)

            def value_and_grad(inputs, dtype, name=name, labels=labels):
                # float16 gradients are scaled as keras' LossScaleOptimizer does (2^15):
                # unscaled, the small per-element gradients underflow.
                scale = 2.0**15 if dtype == tf.float16 else 1.0
                x = tf.constant(inputs)
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    value = fns[name](labels, tf.cast(x, dtype))
                    scaled = value * tf.cast(scale, value.dtype)
                return value, tape.gradient(scaled, x).numpy() / scale

            def rel(a, b):
                return float(np.linalg.norm(np.subtract(a, b)) / max(np.linalg.norm(b), 1e-30))

            exact = embeddings.astype(np.float64)
            ref_value, ref_grad = value_and_grad(exact, tf.float64)
            for policy, dtype in (("float32", tf.float32), ("mixed_float16", tf.float16),
                                  ("mixed_bfloat16", tf.bfloat16)):
                # The embeddings as the policy delivers them; the loss in float32 (float64
                # for the float32 row) on those values.
                rounded = tf.cast(tf.cast(exact, dtype), tf.float64).numpy()
                value, grad = value_and_grad(rounded, dtype)
                same_value, same_grad = value_and_grad(
                    rounded, tf.float64 if dtype == tf.float32 else tf.float32)
                exact_on_rounded = value_and_grad(rounded, tf.float64)
                rows.append((name, batch, policy, value.dtype.name, float(value),
                             float(same_value), rel(float(value), float(same_value)),
                             rel(grad, same_grad), float(ref_value),
                             rel(float(exact_on_rounded[0]), float(ref_value)),
                             rel(exact_on_rounded[1], ref_grad),
                             bool(np.all(np.isfinite(grad)))))
    return rows


def _precision_report(rows):
    if not rows:
        return ""
    lines = [
        "Mixed precision (`tfa-*` losses). The unit-norm embeddings are cast to the "
        "policy's compute dtype, as a model under `mixed_float16` / `mixed_bfloat16` "
        "outputs them. *Loss error*: the loss on those inputs against the float32 loss on "
        "the same (rounded) values: the losses compute in float32 inside, so this is what "
        "the low-precision input and output dtype add. *Input rounding*: float64 on the "
        "rounded inputs against float64 on the exact ones: what rounding the embeddings "
        "does (near-equal distances can swap and change the semi-hard negative). "
        "In the float32 rows the reference is float64 on the same (exact) inputs. "
        "Relative errors: |a - b| / |b| for values, ||g - g_ref|| / ||g_ref|| for the "
        "gradients w.r.t. the embeddings; float16 gradients with a loss scale of 2^15, as "
        "Keras' `LossScaleOptimizer` starts with.",
        "",
        "| loss | B | policy | loss dtype | value | reference, same inputs | loss error: value "
        "| loss error: gradient | float64, exact inputs | input rounding: value "
        "| input rounding: gradient | gradient finite |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for (name, batch, policy, dtype, value, same, v_err, g_err, exact, r_v, r_g,
         finite) in rows:
        lines.append(f"| {name} | {batch} | {policy} | {dtype} | {value:.5f} | {same:.5f} "
                     f"| {v_err:.1e} | {g_err:.1e} | {exact:.5f} | {r_v:.1e} | {r_g:.1e} "
                     f"| {'yes' if finite else 'NO'} |")
    return "\n".join(lines) + "\n"


def run_driver(args):
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    configs = [
        (loss, batch, xla)
        for batch in args.sizes
        for xla in (False, True)
        for loss in args.losses
    ]
    log(f"loss_speed: {len(configs)} configurations, one worker process each")
    results = []
    for i, (loss, batch, xla) in enumerate(configs, 1):
        log(f"[{i}/{len(configs)}] {loss} B={batch} D={args.dim} XLA={'on' if xla else 'off'} ...")
        t = time.perf_counter()
        result = _spawn(loss, batch, args.dim, xla, args.repeats, args.classes)
        if "error" in result:
            log(f"    FAILED: {result['error']}")
        else:
            log(
                f"    median {result['median_s'] * 1e3:.2f} ms (n={len(result['times_s'])}), "
                f"floor {result['floor_median_s'] * 1e3:.2f} ms, "
                f"ratio {result['median_s'] / result['floor_median_s']:.2f}, "
                f"warm-up {result['warmup_s']:.1f} s, "
                f"peak RSS {mib(result['rss_peak_kib']):.0f} MiB; "
                f"worker {time.perf_counter() - t:.1f} s"
            )
        results.append(((loss, batch, xla), result))
    elapsed = time.perf_counter() - t0
    report = _report(
        args, results, machine_info(results), started, elapsed,
        (load_start, os.getloadavg()[0]),
    )
    precision = _precision_report(_precision_check(args.losses, args.dim))
    if precision:
        report += "\n" + precision
    print(report, end="")
    if args.output:
        write_report(report, args.output)
        log(f"wrote {args.output}")
    failed = sum("error" in r for _, r in results)
    if failed:
        log(f"loss_speed: {failed} configuration(s) FAILED; see the table")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512, 2048],
                        help="batch sizes B (default: 128 512 2048)")
    parser.add_argument("--dim", type=int, default=512, help="embedding size D (default: 512)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed rounds per configuration (default: adaptive, "
                             f"{MIN_REPEATS}-{MAX_REPEATS} within about {TIME_BUDGET_S:g} s)")
    parser.add_argument("--output", default="benchmarks/results/loss_speed.md",
                        help="markdown file to write the report to ('' to skip)")
    parser.add_argument("--classes", type=int, default=DEFAULT_CLASSES,
                        help="number of classes C of the losses with class vectors "
                             f"(default: {DEFAULT_CLASSES})")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--losses", nargs="+", choices=ALL_LOSSES, default=list(LOSSES),
                        help="losses to run (default: " + " ".join(LOSSES) + ")")
    parser.add_argument("--loss", choices=ALL_LOSSES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--xla", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if any(b < 2 for b in args.sizes) or args.dim < 1:
        parser.error("--sizes must be >= 2 and --dim >= 1")
    if args.classes < 1:
        parser.error("--classes must be >= 1")
    if args.worker:
        try:
            result = _measure(args.loss, args.batch, args.dim, bool(args.xla), args.repeats,
                              args.classes)
        except Exception as e:  # reported as a failed row (e.g. an out-of-memory error)
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            result = {
                "error": f"{type(e).__name__}: {message}"[:200],
                "rss_peak_kib": peak_rss_kib(),
            }
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
