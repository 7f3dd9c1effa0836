"""Peak memory of ``tfdml.compat.tfa.TripletSemiHardLoss`` forward+backward, eager and compiled.

For every batch size ``B`` (embedding size ``D``) and every mode it runs one forward+backward
pass (the loss value and its gradient w.r.t. the embeddings, under a ``tf.GradientTape``,
both fetched with ``.numpy()``) of:

* ``semihard``: ``tfdml.compat.tfa.TripletSemiHardLoss()`` (margin 1, L2 distances);
* ``floor``: the sum of the ``B x B`` L2 distances of the batch
  (``tfa.losses.metric_learning.pairwise_distance``, the loss's own first step): the least
  the loss can keep for its backward pass.

Modes (``--modes``): ``eager`` (the tape records every op as it runs and keeps what each
gradient needs until ``tape.gradient``), ``function`` (the same step inside one
``tf.function``: the runtime frees every intermediate as soon as its last user has run) and
``xla`` (``tf.function(jit_compile=True)``).

Each (loss, mode, B) configuration runs in a fresh worker process (this file run with
``--worker``), so that the peak resident set size (``ru_maxrss``) is that configuration's
alone. The worker reads it after the imports and the inputs (``B/4`` classes x 4 samples,
shuffled; standard-normal float32 embeddings; fixed seed) and again after the one
forward+backward pass, and prints one JSON line. The report gives the second reading (it
includes the TensorFlow runtime), its increase over the first (what the pass added; in the
compiled modes it also counts tracing and compilation) and the seconds of that pass
(tracing and compilation included). Progress goes to stderr, the report to stdout and to
``--output``.

Usage::

    python benchmarks/tfa_memory.py [--sizes 8192] [--dim 128] [--modes eager function xla]
                                    [--losses semihard floor]
                                    [--output benchmarks/results/tfa_semihard_memory.md]

At the defaults (B = 8192, D = 128) it takes about 1.5-2 minutes on 2 cores; one worker runs
at a time, the largest (eager semi-hard) peaking at about 5 GiB.
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

LOSSES = ("semihard", "floor")
LOSS_LABELS = {
    "semihard": "tfdml.compat.tfa TripletSemiHardLoss()",
    "floor": "the sum of the B x B L2 distances (tfa pairwise_distance)",
}
MODES = ("eager", "function", "xla")
MODE_LABELS = {
    "eager": "eager",
    "function": "tf.function",
    "xla": "tf.function(jit_compile=True)",
}
SAMPLES_PER_CLASS = 4
SEED = 1234
LIMIT_MIB = 6144  # the bound on the eager peak at B = 8192, D = 128
WORKER_TIMEOUT_S = 1800
RESULT_PREFIX = "TFA_MEMORY_RESULT "

# -- worker -------------------------------------------------------------------------------------


def _loss_fn(name):
    import tensorflow as tf

    from tfdml.compat import tfa

    if name == "semihard":
        return tfa.losses.TripletSemiHardLoss()

    def floor(labels, embeddings):
        del labels
        return tf.reduce_sum(tfa.losses.metric_learning.pairwise_distance(embeddings))

    return floor


def _measure(loss, mode, batch, dim):
    import keras
    import tensorflow as tf

    labels_np, embeddings_np = make_inputs(batch, dim, SEED, SAMPLES_PER_CLASS)
    labels = tf.constant(labels_np)
    embeddings = tf.constant(embeddings_np)
    fn = _loss_fn(loss)

    def step(labels, embeddings):
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            value = fn(labels, embeddings)
        return value, tape.gradient(value, embeddings)

    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "xla")

    result = {"loss": loss, "mode": mode, "batch": batch, "dim": dim,
              "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}
    result["rss_base_kib"] = peak_rss_kib()
    t0 = time.perf_counter()
    value, grad = step(labels, embeddings)
    result["value"] = float(value.numpy())
    result["grad_abs_sum"] = float(abs(grad.numpy()).sum())
    result["seconds"] = time.perf_counter() - t0
    result["rss_peak_kib"] = peak_rss_kib()
    return result


# -- driver -------------------------------------------------------------------------------------


def _spawn(loss, mode, batch, dim):
    return run_worker(__file__, ["--loss", loss, "--mode", mode, "--batch", batch, "--dim", dim],
                      RESULT_PREFIX, WORKER_TIMEOUT_S)


def _row(config, result):
    loss, mode, batch = config
    if "error" in result:
        error = result["error"].replace("|", "/")
        return f"| {loss} | {MODE_LABELS[mode]} | {batch} | FAILED: {error} | | |"
    peak = mib(result["rss_peak_kib"])
    increase = mib(result["rss_peak_kib"] - result["rss_base_kib"])
    return (f"| {loss} | {MODE_LABELS[mode]} | {batch} | {peak:.0f} | {increase:.0f} "
            f"| {result['seconds']:.1f} |")


def _report(args, results, machine, started, elapsed, load):
    lines = [
        "# TripletSemiHardLoss peak memory, eager and compiled",
        "",
        f"- command: `{shlex.join(['python', 'benchmarks/tfa_memory.py'] + sys.argv[1:])}`",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine}",
        f"- D = {args.dim}; labels: B/{SAMPLES_PER_CLASS} classes x {SAMPLES_PER_CLASS} "
        f"samples each, shuffled; embeddings: standard normal, float32; seed {SEED}",
        "- one forward+backward pass per worker process (value and gradient w.r.t. the "
        "embeddings under a tf.GradientTape, both fetched with .numpy())",
        f"- total run time: {elapsed:.0f} s; 1-minute load average {load[0]:.2f} at the "
        f"start, {load[1]:.2f} at the end",
        "",
        "| loss | mode | B | peak RSS MiB | increase MiB | seconds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for config, result in results:
        lines.append(_row(config, result))
    lines += [
        "",
        "Losses: " + "; ".join(f"`{k}` = {v}" for k, v in LOSS_LABELS.items()
                               if k in args.losses) + ".",
        "",
        "Peak RSS: `ru_maxrss` of the worker after the pass (includes the TensorFlow "
        "runtime). Increase: that peak minus the peak after the imports and the inputs. "
        "Seconds: the one pass, tracing and compilation included in the compiled modes.",
    ]
    for (loss, mode, batch), result in results:
        if loss == "semihard" and mode == "eager" and "error" not in result:
            peak = mib(result["rss_peak_kib"])
            verdict = "under" if peak < LIMIT_MIB else "NOT under"
            lines += ["", f"Eager semi-hard peak at B = {batch}, D = {args.dim}: {peak:.0f} MiB, "
                          f"{verdict} the {LIMIT_MIB} MiB (6 GiB) bound."]
    failed = [c for c, r in results if "error" in r]
    if failed:
        lines += ["", f"{len(failed)} configuration(s) failed: " + ", ".join(
            f"{loss} {mode} B={b}" for loss, mode, b in failed) + "."]
    return "\n".join(lines) + "\n"


def run_driver(args):
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    configs = [(loss, mode, batch) for batch in args.sizes for loss in args.losses
               for mode in args.modes]
    log(f"tfa_memory: {len(configs)} configurations, one worker process each")
    results = []
    for i, (loss, mode, batch) in enumerate(configs, 1):
        log(f"[{i}/{len(configs)}] {loss} {mode} B={batch} D={args.dim} ...")
        t = time.perf_counter()
        result = _spawn(loss, mode, batch, args.dim)
        if "error" in result:
            log(f"    FAILED: {result['error']}")
        else:
            log(f"    peak RSS {mib(result['rss_peak_kib']):.0f} MiB (increase "
                f"{mib(result['rss_peak_kib'] - result['rss_base_kib']):.0f} MiB), "
                f"pass {result['seconds']:.1f} s, value {result['value']:.6g}; "
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
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192],
                        help="batch sizes B (default: 8192)")
    parser.add_argument("--dim", type=int, default=128, help="embedding size D (default: 128)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="execution modes (default: " + " ".join(MODES) + ")")
    parser.add_argument("--losses", nargs="+", choices=LOSSES, default=list(LOSSES),
                        help="losses (default: " + " ".join(LOSSES) + ")")
    parser.add_argument("--output", default="benchmarks/results/tfa_semihard_memory.md",
                        help="markdown file to write the report to ('' to skip)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loss", choices=LOSSES, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if any(b < 2 for b in args.sizes) or args.dim < 1:
        parser.error("--sizes must be >= 2 and --dim >= 1")
    if args.worker:
        try:
            result = _measure(args.loss, args.mode, args.batch, args.dim)
        except Exception as e:  # reported as a failed row (e.g. an out-of-memory error)
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            result = {"error": f"{type(e).__name__}: {message}"[:200],
                      "rss_peak_kib": peak_rss_kib()}
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
