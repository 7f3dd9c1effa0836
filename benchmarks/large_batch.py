"""Large batches: peak memory and time of dense and blocked losses, and of chunked training steps.

Two parts, each configuration in a fresh worker process (this file run with ``--worker``) so
that its peak memory is its own:

* **losses** (default): one compiled value + gradient (w.r.t. the ``[B, D]`` embeddings) of
  a tfdml loss, dense (``block_size=None``) and in row blocks (``block_size``), for every
  batch size ``B``. Losses: ``ephn`` (``TripletNCALoss(order=2)``, easy positive / hard
  negative), ``semihard`` (``TripletMarginLoss()``: every positive with its semi-hard
  negative), ``ms`` (``MultiSimilarityLoss()``), ``supcon`` (``SupConLoss()``); and
  ``floor``: one pass over the ``B x B`` similarities in blocks (``max_j x_i . x_j``, no
  gradient), the least any of these losses has to compute.
* **fit** (``--fit``): one compiled training step (``train_on_batch``) of
  ``tfdml.models.MetricModel`` around a small convolutional embedder (32 x 32 x 3 images,
  3 convolutions, 128-d embeddings) with ``SupConLoss``, without chunks and with
  ``chunk_size`` (gradient caching), for every batch size. With ``--contrastive simclr``
  (or ``moco``): ``tfdml.models.ContrastiveModel`` on ``B`` two-view pairs instead (the
  same embedder, a ``Dense(128)`` projector), the chunks holding both views of their
  samples.

Inputs: ``B/4`` classes of 4 samples, shuffled; standard-normal embeddings (or images);
fixed seed. Compiled with XLA: ``tf.function(jit_compile=True)`` under TensorFlow,
``jax.jit`` under JAX (``KERAS_BACKEND``). The worker runs the step once (tracing,
compilation and the run: "first") and then ``--repeats`` more times ("time": the median).

Memory: on a GPU (JAX) the device's peak bytes in use (``memory_stats()``); on the CPU the
process's peak resident set size (``ru_maxrss``) after the step minus the reading before it
(inputs already made), which includes compilation. The report gives the peak and its
increase. Under JAX it also gives the temporary buffers XLA assigns to the compiled step
(``memory_analysis().temp_size_in_bytes``): the step's own working memory, without the
compiler's or the runtime's, and the number to compare between dense and blocked, or whole
and chunked.

Usage::

    python benchmarks/large_batch.py [--sizes 1024 8192 65536] [--dim 128]
        [--losses ephn semihard ms supcon floor] [--block-size 1024] [--dense-max 16384]
        [--repeats 2] [--output benchmarks/results/large_batch.md]
    python benchmarks/large_batch.py --fit [--sizes 512 1024 2048] [--chunk-size 128] [--no-xla]
        [--chunked-without-xla]  # the whole step with XLA, the chunked one without
        [--contrastive simclr|moco]  # a ContrastiveModel on B two-view pairs

Dense configurations above ``--dense-max`` are not run (their ``[B, B]`` float32 matrix
alone is listed instead). A configuration that fails (out of memory, a time-out) is a
``FAILED`` row; the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time

from workers import (  # benchmarks/workers.py
    log,
    machine_info,
    mib,
    peak_rss_kib,
    run_worker,
    write_report,
)

LOSSES = ("ephn", "semihard", "ms", "supcon", "floor")
LOSS_LABELS = {
    "ephn": "TripletNCALoss(order=2) (EPHN)",
    "semihard": "TripletMarginLoss() (all positives, semi-hard negatives)",
    "ms": "MultiSimilarityLoss()",
    "supcon": "SupConLoss()",
    "floor": "B x B similarities in blocks, max per row (forward only)",
}
SAMPLES_PER_CLASS = 4
SEED = 1234
RESULT_PREFIX = "LARGE_BATCH_RESULT "
WORKER_TIMEOUT_S = 3600


# -- worker -------------------------------------------------------------------------------------


def _backend():
    import keras

    return keras.backend.backend()


def _gpu():
    if _backend() != "jax":
        return None
    import jax

    devices = [d for d in jax.devices() if d.platform == "gpu"]
    return devices[0] if devices else None


def _memory_reading():
    """Peak memory so far in MiB: the GPU's peak bytes in use, or the process's peak RSS."""
    gpu = _gpu()
    if gpu is not None:
        return gpu.memory_stats()["peak_bytes_in_use"] / 2**20
    return mib(peak_rss_kib())


def _labels(batch):
    import numpy as np

    rng = np.random.default_rng(SEED)
    labels = np.repeat(np.arange(-(-batch // SAMPLES_PER_CLASS)), SAMPLES_PER_CLASS)[:batch]
    rng.shuffle(labels)
    return labels.astype("int32"), rng


def _loss(name, block_size):
    import tfdml

    losses = tfdml.losses
    return {
        "ephn": lambda: losses.TripletNCALoss(order=2, block_size=block_size),
        "semihard": lambda: losses.TripletMarginLoss(block_size=block_size),
        "ms": lambda: losses.MultiSimilarityLoss(block_size=block_size),
        "supcon": lambda: losses.SupConLoss(block_size=block_size),
    }[name]()


def _floor_fn(block_size):
    """Forward only: the maximum similarity of each row, computed in blocks of rows."""
    from keras import ops

    from tfdml.losses.row_blocks import RowBlocks

    def floor(labels, x):
        del labels
        blocks = RowBlocks(x.shape[0], block_size)
        maxima = blocks.map(lambda i, x: (ops.max(ops.matmul(blocks.rows(x, i),
                                                             ops.transpose(x)), axis=1),),
                            (x,), [((None,), "float32")])[0]
        return ops.sum(blocks.assemble(maxima))

    return floor


def _compiled_step(fn, with_grad):
    backend = _backend()
    if backend == "tensorflow":
        import tensorflow as tf

        def step(labels, x):
            if not with_grad:
                return fn(labels, x), x
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = fn(labels, x)
            return value, tape.gradient(value, x)

        return tf.function(step, jit_compile=True)
    import jax

    if not with_grad:
        return jax.jit(lambda labels, x: (fn(labels, x), x))
    return jax.jit(lambda labels, x: jax.value_and_grad(lambda e: fn(labels, e))(x))


def _fetch(outputs):
    import numpy as np
    from keras import ops

    value, grad = outputs
    return float(ops.convert_to_numpy(value)), float(np.abs(ops.convert_to_numpy(grad)).sum())


def _versions():
    import keras

    versions = {"keras": keras.__version__, "backend": _backend()}
    try:
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
    except ImportError:
        versions["tensorflow"] = "not installed"
    if _backend() == "jax":
        import jax

        versions["jax"] = jax.__version__
    return versions


def _xla_temp_mib(jitted, args):
    """JAX: the temporary buffers XLA assigns to the compiled step (its exact working memory)."""
    analysis = jitted.lower(*args).compile().memory_analysis()
    return None if analysis is None else analysis.temp_size_in_bytes / 2**20


def _time_step(step, args, repeats, result):
    result["mem_base_mib"] = _memory_reading()
    t0 = time.perf_counter()
    result["value"], result["grad_abs_sum"] = _fetch(step(*args))
    result["first_s"] = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _fetch(step(*args))
        times.append(time.perf_counter() - t0)
    result["time_s"] = statistics.median(times) if times else None
    result["mem_peak_mib"] = _memory_reading()
    return result


def _measure_loss(loss, mode, batch, dim, block_size, repeats):
    from keras import ops

    labels, rng = _labels(batch)
    x = rng.standard_normal((batch, dim)).astype("float32")
    if loss == "floor":
        step = _compiled_step(_floor_fn(block_size), with_grad=False)
    else:
        fn = _loss(loss, None if mode == "dense" else block_size)
        step = _compiled_step(fn, with_grad=True)
    args = (ops.convert_to_tensor(labels), ops.convert_to_tensor(x))
    result = {"loss": loss, "mode": mode, "batch": batch, "dim": dim, "block_size": block_size,
              "versions": _versions(), "device": str(_gpu() or "cpu")}
    result = _time_step(step, args, repeats, result)
    if _backend() == "jax":
        result["xla_temp_mib"] = _xla_temp_mib(step, args)
    return result


def _conv_embedder():
    import keras

    inputs = keras.Input((32, 32, 3))
    h = inputs
    for filters in (32, 64, 64):
        h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
        h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(128)(h), name="conv_embedder")


def _contrastive_model(algorithm, chunk_size):
    """A ContrastiveModel on the conv embedder, a linear projector and the algorithm's loss
    (MoCo: a queue of 16,384 keys)."""
    import keras

    import tfdml

    loss = tfdml.losses.MoCoLoss(queue_size=16384, seed=SEED) if algorithm == "moco" else None
    return tfdml.models.ContrastiveModel(_conv_embedder(),
                                         keras.Sequential([keras.layers.Dense(128)]),
                                         algorithm=algorithm, loss=loss, chunk_size=chunk_size)


def _measure_fit(batch, chunk_size, repeats, xla=True, contrastive=None):
    import keras

    import tfdml

    keras.utils.set_random_seed(SEED)
    labels, rng = _labels(batch)
    images = rng.standard_normal((batch, 32, 32, 3)).astype("float32")
    if contrastive:  # two views of each of the B samples
        model = _contrastive_model(contrastive, chunk_size)
        labels = rng.standard_normal(images.shape).astype("float32")
    else:
        model = tfdml.models.MetricModel(_conv_embedder(), tfdml.losses.SupConLoss(),
                                         chunk_size=chunk_size)
    model.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=xla)

    def step(images, labels):
        if contrastive:
            logs = model.train_on_batch(x=(images, labels), return_dict=True)
        else:
            logs = model.train_on_batch(images, labels, return_dict=True)
        return logs["loss"], 0.0

    result = {"loss": "fit", "mode": "chunked" if chunk_size else "whole", "batch": batch,
              "chunk_size": chunk_size, "versions": _versions(), "device": str(_gpu() or "cpu")}
    result = _time_step(step, (images, labels), repeats, result)
    if _backend() == "jax":  # the step Keras compiles, lowered again for its memory analysis
        import jax

        state = tuple([v.value for v in variables] for variables in (
            model.trainable_variables, model.non_trainable_variables,
            model.optimizer.variables, model.metrics_variables))
        data = ((images, labels),) if contrastive else (images, labels)
        result["xla_temp_mib"] = _xla_temp_mib(jax.jit(model.train_step), (state, data))
    return result


def _worker(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--loss")
    parser.add_argument("--mode")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--dim", type=int)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--chunk-size", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--no-xla", action="store_true")
    parser.add_argument("--contrastive")
    args = parser.parse_args(argv)
    if args.loss == "fit":
        result = _measure_fit(args.batch, args.chunk_size or None, args.repeats,
                              xla=not args.no_xla, contrastive=args.contrastive)
    else:
        result = _measure_loss(args.loss, args.mode, args.batch, args.dim, args.block_size,
                               args.repeats)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -- driver -------------------------------------------------------------------------------------


def _fmt(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def _row(config, result, with_ratio=None):
    name = config["loss"]
    if "error" in result:
        return f"| {name} | {config['mode']} | {config['batch']} | FAILED: {result['error']} |" \
               + " |" * 6
    added = result["mem_peak_mib"] - result["mem_base_mib"]
    ratio = "-" if with_ratio is None or not result.get("time_s") else \
        f"{result['time_s'] / with_ratio:.2f}"
    return (f"| {name} | {config['mode']} | {config['batch']} | {_fmt(result['first_s'])} | "
            f"{_fmt(result['time_s'], '.4g')} | {ratio} | {result['mem_peak_mib']:.0f} | "
            f"{added:.0f} | {_fmt(result.get('xla_temp_mib'), '.0f')} | {result['value']:.6g} |")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="the chunked training step part")
    parser.add_argument("--no-xla", action="store_true",
                        help="--fit: compile the step without XLA (jit_compile=False)")
    parser.add_argument("--chunked-without-xla", action="store_true",
                        help="--fit: the whole step with XLA, the chunked one without")
    parser.add_argument("--contrastive", choices=("simclr", "moco"),
                        help="--fit: a ContrastiveModel on B two-view pairs instead")
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--dense-max", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output")
    args = parser.parse_args(argv)

    configs = []
    if args.fit:
        for batch in args.sizes or (512, 1024, 2048):
            for chunk in (None, args.chunk_size):
                configs.append({"loss": "fit", "mode": "chunked" if chunk else "whole",
                                "batch": batch, "chunk": chunk or 0})
    else:
        for batch in args.sizes or (1024, 8192, 65536):
            for loss in args.losses:
                modes = ["blocked"] if loss == "floor" else ["dense", "blocked"]
                for mode in modes:
                    configs.append({"loss": loss, "mode": mode, "batch": batch})

    results = []
    for config in configs:
        if config["mode"] == "dense" and config["batch"] > args.dense_max:
            gib = config["batch"] ** 2 * 4 / 2**30
            results.append((config, {"error": f"not run: the [B, B] matrix alone is {gib:.0f} GiB"}))
            continue
        log(f"running {config} ...")
        worker_args = ["--loss", config["loss"], "--batch", config["batch"],
                       "--repeats", args.repeats]
        if args.fit:
            no_xla = args.no_xla or (args.chunked_without_xla and config["chunk"])
            worker_args += ["--chunk-size", config["chunk"]] + (["--no-xla"] if no_xla else [])
            worker_args += ["--contrastive", args.contrastive] if args.contrastive else []
        else:
            worker_args += ["--mode", config["mode"], "--dim", args.dim,
                            "--block-size", args.block_size]
        result = run_worker(__file__, worker_args, RESULT_PREFIX, WORKER_TIMEOUT_S)
        log(f"  -> {result}")
        results.append((config, result))

    versions = next((r["versions"] for _, r in results if "versions" in r), {})
    device = next((r["device"] for _, r in results if "device" in r), "cpu")
    lines = [
        f"# {'Chunked training steps' if args.fit else 'Large-batch losses'}: "
        "peak memory and time",
        "",
        f"Run {datetime.date.today()}: `python benchmarks/large_batch.py "
        f"{shlex.join(argv)}` under KERAS_BACKEND={versions.get('backend', '?')} "
        f"(Keras {versions.get('keras', '?')}, JAX {versions.get('jax', '-')}), "
        f"device: {device}.",
        "",
        machine_info([(c, {"versions": {"tensorflow": versions.get("tensorflow", "-"),
                                         "keras": versions.get("keras", "-")}})
                      for c, _ in results[:1]], memory=True),
        "",
    ]
    if args.fit:
        what = (f"ContrastiveModel(conv embedder, Dense(128) projector, "
                f"algorithm={args.contrastive!r}) on B two-view pairs"
                if args.contrastive else "MetricModel(conv embedder, SupConLoss())")
        lines += [f"{what}, one train_on_batch compiled "
                  f"{'without' if args.no_xla else 'with'} XLA"
                  f"{' (the chunked one without)' if args.chunked_without_xla else ''}; chunked: "
                  f"chunk_size={args.chunk_size}.", ""]
    else:
        lines += [f"D = {args.dim}; blocked: block_size={args.block_size}. Losses: "
                  + "; ".join(f"`{k}` {LOSS_LABELS[k]}" for k in args.losses) + ".", ""]
    lines += ["| loss | mode | B | first s | time s | / floor | peak MiB | added MiB | "
              "XLA temp MiB | value |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    floors = {c["batch"]: r.get("time_s") for c, r in results if c["loss"] == "floor"}
    for config, result in results:
        lines.append(_row(config, result, floors.get(config["batch"])))
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        write_report(report, args.output)


if __name__ == "__main__":
    main()
