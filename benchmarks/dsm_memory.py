"""Peak memory of ``DynamicSoftMarginLoss``: the dense ``[B, B, B]`` formula against the sorted one.

For every batch size ``B`` (embedding size ``D``) and every mode it runs one training step of
the loss (its value, its gradient w.r.t. the embeddings and the updated histogram, under a
``tf.GradientTape``, all fetched with ``.numpy()``) of:

* ``dense``: the formula the loss computed before (a private copy, below): every triplet's
  ``x = d_ap - d_an`` in a ``[B, B, B]`` tensor, its mass split between two histogram nodes
  by a scatter, the CDF gathered per triplet;
* ``sorted``: ``tfdml.losses.dynamic_soft_margin_loss``, which sorts each anchor's positives
  and counts by binary search (``O(B^2)`` memory);
* ``blocks``: ``tfdml.losses.DynamicSoftMarginLoss(block_size=--block-size)``, a training
  call of the class (it assigns its histogram), blocks of anchors in two passes;
* ``floor``: the sum of the ``B x B`` Euclidean distances of the L2-normalized embeddings
  (``tfdml.ops.distance_matrix``, the loss's own first step) and its gradient: the least a
  step of the loss keeps for its backward pass (in eager mode the tape alone keeps several
  ``B x B`` arrays of it).

Defaults: the dense formula at B = 256 and 512, the sorted one at B = 256, 512, 1024 and
4096, blocks and the floor at 4096; ``D = 128``, the default loss settings (10 nodes, ``min_val = -2``),
a previous histogram of 10 equal entries. Modes (``--modes``): ``eager`` (the tape keeps what
each gradient needs until ``tape.gradient``), ``function`` (one ``tf.function``) and ``xla``
(``tf.function(jit_compile=True)``).

Each (loss, mode, B) configuration runs in a fresh worker process (this file run with
``--worker``), with TensorFlow's BFC allocator on the CPU (``TF_CPU_ALLOCATOR_USE_BFC=true``),
whose statistics ``tf.config.experimental.get_memory_info("CPU:0")`` reports (the default
CPU allocator keeps none). After the imports and the inputs (``B/4`` classes x 4 samples,
shuffled; standard-normal float32 embeddings; fixed seed) the worker resets the peak and
reads the bytes in use and the peak resident set size (``ru_maxrss``); after the step it
reads both peaks again, and prints one JSON line. The report gives the allocator's peak
minus the bytes in use before (the tensors the step added at its peak: XLA's buffers go
through the same allocator), the process's peak RSS (it includes the TensorFlow runtime)
and its increase (what the step added, allocator overhead and, in the compiled modes,
tracing and compilation included), the seconds of the step (tracing and compilation
included) and the loss value, so that rows of the same B can be compared. Progress goes to
stderr, the report to stdout and to ``--output``.

Usage::

    python benchmarks/dsm_memory.py [--dim 128] [--modes eager function xla]
                                    [--dense-sizes 256 512] [--sorted-sizes 256 512 1024 4096]
                                    [--block-sizes 4096] [--block-size 512]
                                    [--floor-sizes 4096]
                                    [--output benchmarks/results/dsm_memory.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

from workers import (  # benchmarks/workers.py
    log,
    machine_info,
    make_inputs,
    mib,
    peak_rss_kib,
    run_worker,
    write_report,
)

LOSSES = ("floor", "dense", "sorted", "blocks")
MODES = ("eager", "function", "xla")
MODE_LABELS = {"eager": "eager", "function": "tf.function", "xla": "tf.function(jit_compile=True)"}
SAMPLES_PER_CLASS = 4
NUM_BINS = 10
SEED = 1234
LIMIT_MIB = 1024  # the bound on what the sorted step adds at B = 4096, D = 128
WORKER_TIMEOUT_S = 1800
RESULT_PREFIX = "DSM_MEMORY_RESULT "


# -- the dense formula, as the loss computed it before ------------------------------------------


def _dense_loss(labels, embeddings, histogram, min_val=-2.0, momentum=0.01):
    """``(value, new_histogram)`` of the dense formula: every triplet of a ``[B, B, B]`` tensor."""
    from keras import ops

    from tfdml import ops as dml
    from tfdml._shims import dtype_name
    from tfdml.losses.base import functional_value
    from tfdml.losses.inputs import mined_triplets, prepare_inputs
    from tfdml.losses.terms import triplet_terms
    from tfdml.miners import AllPairsMiner, gather_triplet_scores

    inputs = prepare_inputs(labels, embeddings, None, None, None, True)
    ok = dml.all_finite(embeddings)
    dist = dml.distance_matrix(inputs.x, inputs.ref, "l2")
    triplets = mined_triplets(inputs, -dist, AllPairsMiner())
    d_ap, d_an = gather_triplet_scores(dist, triplets)
    mask = triplets.mask
    x = ops.broadcast_to(d_ap - d_an, ops.shape(mask))
    num_bins = histogram.shape[0]
    dtype = dtype_name(x)
    v = (ops.stop_gradient(x) - min_val) / (2.0 * abs(min_val) / num_bins)
    v = ops.clip(ops.where(ops.isfinite(v), v, ops.zeros_like(v)), 0.0, float(num_bins - 1))
    low = ops.floor(v)
    frac = v - low
    low = ops.cast(low, "int32")
    weight = ops.cast(mask, dtype)
    high = ops.minimum(low + 1, num_bins - 1)

    def flat(t):
        return ops.reshape(t, (1, -1))

    nodes = ops.concatenate([flat(low), flat(high)], axis=1)
    shares = ops.concatenate([flat((1.0 - frac) * weight), flat(frac * weight)], axis=1)
    counts = dml.scatter_rows(ops.zeros((1, num_bins), dtype), nodes, shares, mode="add")[0]
    total = ops.sum(weight)
    old = ops.cast(histogram, dtype)
    m = ops.where(ops.sum(old) > 0, ops.convert_to_tensor(momentum, dtype), ops.ones((), dtype))
    mixed = (1.0 - m) * old + m * dml.divide_no_nan(counts, total)
    mixed = dml.divide_no_nan(mixed, ops.sum(mixed))
    new = ops.where(ops.logical_and(total > 0, ok), mixed, old)
    cdf = ops.stop_gradient(dml.cumsum(new, axis=0))
    terms = triplet_terms(ops.take(cdf, low) * x, mask)
    return functional_value(terms, "terms", embeddings), new


# -- worker -------------------------------------------------------------------------------------


def _measure(loss, mode, batch, dim, block_size):
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdml import ops as dml
    from tfdml.losses import DynamicSoftMarginLoss, dynamic_soft_margin_loss

    labels_np, embeddings_np = make_inputs(batch, dim, SEED, SAMPLES_PER_CLASS)
    labels = tf.constant(labels_np)
    embeddings = tf.constant(embeddings_np)
    histogram = tf.constant(np.full(NUM_BINS, 1.0 / NUM_BINS, np.float32))
    if loss == "blocks":
        blocked = DynamicSoftMarginLoss(num_bins=NUM_BINS, block_size=block_size)
        blocked.histogram.assign(histogram)

        def fn(labels, embeddings, histogram):
            return blocked(labels, embeddings), blocked.histogram.value
    elif loss == "floor":
        def fn(labels, embeddings, histogram):
            del labels
            x = dml.l2_normalize(embeddings)
            return tf.reduce_sum(dml.distance_matrix(x, x, "l2")), histogram
    else:
        function = _dense_loss if loss == "dense" else dynamic_soft_margin_loss

        def fn(labels, embeddings, histogram):
            return function(labels, embeddings, histogram)

    def step(labels, embeddings, histogram):
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            value, new = fn(labels, embeddings, histogram)
        return value, tape.gradient(value, embeddings), tf.identity(new)

    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "xla", autograph=False)

    result = {"loss": loss, "mode": mode, "batch": batch, "dim": dim,
              "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}
    tf.config.experimental.reset_memory_stats("CPU:0")
    in_use = tf.config.experimental.get_memory_info("CPU:0")["current"]
    result["rss_base_kib"] = peak_rss_kib()
    t0 = time.perf_counter()
    value, grad, new = step(labels, embeddings, histogram)
    result["value"] = float(value.numpy())
    result["grad_abs_sum"] = float(abs(grad.numpy()).sum())
    result["histogram"] = [float(h) for h in new.numpy()]
    result["seconds"] = time.perf_counter() - t0
    result["rss_peak_kib"] = peak_rss_kib()
    result["tensor_peak_kib"] = (
        tf.config.experimental.get_memory_info("CPU:0")["peak"] - in_use) // 1024
    return result


# -- driver -------------------------------------------------------------------------------------


def _increase(result):
    """MiB the step added to the worker's peak resident set size."""
    return mib(result["rss_peak_kib"] - result["rss_base_kib"])


def _row(config, result):
    loss, mode, batch = config
    if "error" in result:
        error = result["error"].replace("|", "/")
        return f"| {loss} | {MODE_LABELS[mode]} | {batch} | FAILED: {error} | | | | | |"
    peak = mib(result["rss_peak_kib"])
    return (f"| {loss} | {MODE_LABELS[mode]} | {batch} | {mib(result['tensor_peak_kib']):.0f} "
            f"| {peak:.0f} | {_increase(result):.0f} | {result['seconds']:.1f} "
            f"| {result['value']:.7g} | {result['grad_abs_sum']:.7g} |")


def _report(args, results, machine, started, elapsed, load):
    labels = {"floor": "the sum of the B x B L2 distances of the normalized embeddings",
              "dense": "the dense [B, B, B] formula (the loss before)",
              "sorted": "tfdml.losses.dynamic_soft_margin_loss (sorted positives, counts)",
              "blocks": f"DynamicSoftMarginLoss(block_size={args.block_size}), a training call"}
    lines = [
        "# DynamicSoftMarginLoss peak memory: dense against sorted",
        "",
        f"- command: `{shlex.join(['python', 'benchmarks/dsm_memory.py'] + sys.argv[1:])}`",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine}",
        f"- D = {args.dim}; labels: B/{SAMPLES_PER_CLASS} classes x {SAMPLES_PER_CLASS} "
        f"samples each, shuffled; embeddings: standard normal, float32; seed {SEED}; "
        f"{NUM_BINS} nodes, min_val -2, momentum 0.01, previous histogram uniform",
        "- one training step per worker process (value, gradient w.r.t. the embeddings and "
        "the updated histogram under a tf.GradientTape, all fetched with .numpy())",
        f"- total run time: {elapsed:.0f} s; 1-minute load average {load[0]:.2f} at the "
        f"start, {load[1]:.2f} at the end",
        "",
        "| loss | mode | B | tensors MiB | peak RSS MiB | RSS increase MiB | seconds | value "
        "| sum of abs(grad) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, result in results:
        lines.append(_row(config, result))
    used = sorted({loss for (loss, _, _), _ in results}, key=LOSSES.index)
    lines += [
        "",
        "Losses: " + "; ".join(f"`{k}` = {labels[k]}" for k in used) + ".",
        "",
        "Tensors: the peak bytes in use of TensorFlow's CPU allocator (BFC) during the step, "
        "minus those in use before it (the inputs): what the step's tensors, XLA's buffers "
        "included, added at their peak. Peak RSS: `ru_maxrss` of the worker after the step "
        "(includes the TensorFlow runtime). RSS increase: that peak minus the peak after the "
        "imports and the inputs (allocator overhead and, compiled, tracing and compilation "
        "included). Seconds: the one step, tracing and compilation included in the compiled "
        "modes.",
    ]
    lines += _histogram_checks(results)
    floors = {(mode, batch): result for (loss, mode, batch), result in results
              if loss == "floor" and "error" not in result}
    verdicts = []
    for (loss, mode, batch), result in results:
        if loss in ("sorted", "blocks") and batch == 4096 and args.dim == 128 \
                and "error" not in result:
            tensors, increase = mib(result["tensor_peak_kib"]), _increase(result)
            verdict = "under" if max(tensors, increase) < LIMIT_MIB else "NOT under"
            floor = floors.get((mode, batch))
            beyond = "" if floor is None else (
                f" (the floor: {mib(floor['tensor_peak_kib']):.0f} and "
                f"{_increase(floor):.0f} MiB)")
            verdicts.append(f"- {loss}, {MODE_LABELS[mode]}: tensors {tensors:.0f} MiB, RSS "
                            f"increase {increase:.0f} MiB{beyond}: {verdict} {LIMIT_MIB} MiB.")
    if verdicts:
        lines += ["", "B = 4096, D = 128 against the 1 GiB bound on what a step adds:", "",
                  *verdicts]
    failed = [c for c, r in results if "error" in r]
    if failed:
        lines += ["", f"{len(failed)} configuration(s) failed: " + ", ".join(
            f"{loss} {mode} B={b}" for loss, mode, b in failed) + "."]
    return "\n".join(lines) + "\n"


def _histogram_checks(results):
    """Per B: the largest difference of the value and of the histogram between the losses."""
    by_batch = {}
    for (_, _, batch), result in results:
        if "error" not in result and result["loss"] != "floor":
            by_batch.setdefault(batch, []).append(result)
    lines = []
    for batch, group in sorted(by_batch.items()):
        if len(group) < 2:
            continue
        first = group[0]
        value = max(abs(r["value"] - first["value"]) / abs(first["value"]) for r in group)
        hist = max(max(abs(a - b) for a, b in zip(r["histogram"], first["histogram"],
                                                  strict=True)) for r in group)
        lines.append(f"- B = {batch}: values agree to {value:.1e} (relative), histograms to "
                     f"{hist:.1e} (absolute), over {len(group)} rows.")
    return ["", "Agreement of the rows of the same B (every loss but the floor, every mode):",
            "", *lines] if lines else []


def run_driver(args):
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    configs = ([("floor", mode, b) for b in args.floor_sizes for mode in args.modes]
               + [("dense", mode, b) for b in args.dense_sizes for mode in args.modes]
               + [("sorted", mode, b) for b in args.sorted_sizes for mode in args.modes]
               + [("blocks", mode, b) for b in args.block_sizes for mode in args.modes])
    configs.sort(key=lambda c: (c[2], LOSSES.index(c[0]), MODES.index(c[1])))
    log(f"dsm_memory: {len(configs)} configurations, one worker process each")
    results = []
    for i, (loss, mode, batch) in enumerate(configs, 1):
        log(f"[{i}/{len(configs)}] {loss} {mode} B={batch} D={args.dim} ...")
        t = time.perf_counter()
        result = run_worker(__file__, ["--loss", loss, "--mode", mode, "--batch", batch,
                                       "--dim", args.dim, "--block-size", args.block_size],
                            RESULT_PREFIX, WORKER_TIMEOUT_S)
        if "error" in result:
            log(f"    FAILED: {result['error']}")
        else:
            log(f"    peak RSS {mib(result['rss_peak_kib']):.0f} MiB (increase "
                f"{mib(result['rss_peak_kib'] - result['rss_base_kib']):.0f} MiB), "
                f"step {result['seconds']:.1f} s, value {result['value']:.7g}; "
                f"worker {time.perf_counter() - t:.1f} s")
        results.append(((loss, mode, batch), result))
    elapsed = time.perf_counter() - t0
    report = _report(args, results, machine_info(results, memory=True), started, elapsed,
                     (load_start, os.getloadavg()[0]))
    print(report, end="")
    if args.output:
        write_report(report, args.output)
        log(f"wrote {args.output}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dense-sizes", type=int, nargs="*", default=[256, 512],
                        help="batch sizes of the dense formula (default: 256 512)")
    parser.add_argument("--sorted-sizes", type=int, nargs="*", default=[256, 512, 1024, 4096],
                        help="batch sizes of the sorted loss (default: 256 512 1024 4096)")
    parser.add_argument("--block-sizes", type=int, nargs="*", default=[4096],
                        help="batch sizes of the loss in blocks (default: 4096)")
    parser.add_argument("--floor-sizes", type=int, nargs="*", default=[4096],
                        help="batch sizes of the floor (default: 4096)")
    parser.add_argument("--block-size", type=int, default=512,
                        help="anchors per block for the blocks rows (default: 512)")
    parser.add_argument("--dim", type=int, default=128, help="embedding size D (default: 128)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="execution modes (default: " + " ".join(MODES) + ")")
    parser.add_argument("--output", default="benchmarks/results/dsm_memory.md",
                        help="markdown file to write the report to ('' to skip)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loss", choices=LOSSES, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = args.dense_sizes + args.sorted_sizes + args.block_sizes + args.floor_sizes
    if any(b < 2 for b in sizes) or args.dim < 1 or args.block_size < 1:
        parser.error("batch sizes must be >= 2, --dim and --block-size >= 1")
    if args.worker:
        # Before TensorFlow is imported: the allocator that keeps statistics on the CPU.
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        try:
            result = _measure(args.loss, args.mode, args.batch, args.dim, args.block_size)
        except Exception as e:  # reported as a failed row (e.g. an out-of-memory error)
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            result = {"error": f"{type(e).__name__}: {message}"[:200],
                      "rss_peak_kib": peak_rss_kib()}
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
