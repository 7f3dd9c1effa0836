"""GPU measurement of the multi-backend core (Keras' JAX backend, XLA) against its floor and a peer.

Run with the JAX backend on a machine with a GPU::

    KERAS_BACKEND=jax python benchmarks/gpu.py --output benchmarks/results/gpu.md

and, to check the script on a CPU (small sizes, a few seconds per section)::

    KERAS_BACKEND=jax python benchmarks/gpu.py --small

What it measures, all in one process on one device (``jax.devices()[0]``), with ``D = 512``
(``--small``: 64), float32 embeddings, ``B / 4`` classes of 4 samples each, shuffled:

1. **Loss forward + backward**, compiled (``jax.jit`` of the loss value and its gradient
   with respect to the embeddings), for ``B`` = 128 ... 32768 (``--sizes``):
   the *floor* (L2-normalize + ``B x B`` matmul + sum: the least any of these losses does),
   ``TripletNCALoss(order=2)`` with EPHN mining, ``TripletMarginLoss`` with every positive
   and its semi-hard negative, ``MultiSimilarityLoss`` with its pair miner and
   ``MarginLoss`` with random positives and distance-weighted negatives. Each time is also
   given as a ratio to the floor at the same ``B``.
2. ``FAPPYLoss(min_bin_width=0.01)`` and ``LoOpLoss(base="multi_similarity")`` at ``B`` = 128 and 512.
3. **Exact Recall@K** (``tfdml.metrics.recall_at_k``, K = 1, 10, 100, 1000) over
   60,000 x 512 unit vectors (``--small``: 4,000 x 64), every sample a query against the rest.
4. A **ResNet50** (``keras.applications``, ``weights=None``, 224 px, batch 128,
   ``mixed_bfloat16``, compiled ``train_on_batch`` on device-resident arrays) with a 512-d
   float32 embedding head, trained with ``MultiSimilarityLoss``. The loss's share of the
   step, two ways: the step time minus that of the same step with a trivial loss (the mean
   of the embeddings), and the loss's own forward + backward time (as in section 1), each
   over the step time.
5. The peer, **pytorch-metric-learning** (when importable) on the same device with PyTorch:
   ``MultiSimilarityLoss`` + ``MultiSimilarityMiner``, ``TripletMarginLoss`` +
   ``BatchHardMiner``, ``TripletMarginLoss`` + ``TripletMarginMiner("semihard")``, forward +
   backward, same ``B`` and ``D``.

Timing: after 2 warm-up calls (compilation), the median of ``--repeats`` calls, each
waited for (``block_until_ready`` / ``torch.cuda.synchronize``). A configuration that runs
out of memory is reported as ``OOM`` and the script goes on. Output: a Markdown report
(``--output``, and stdout) with the device name, versions and the command.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402

SIZES = (128, 512, 2048, 8192, 16384, 32768)
SMALL_SIZES = (64, 128, 256)
LOSSES = ("floor", "nca2-ephn", "margin-semihard", "ms", "margin-dw")
SMALL_LOSSES = ("fappy-0.01", "loop-ms")
PEERS = ("pml-ms", "pml-batchhard", "pml-semihard")
LABELS = {
    "floor": "floor (normalize + B x B matmul + sum)",
    "nca2-ephn": "TripletNCALoss(order=2), EPHN",
    "margin-semihard": "TripletMarginLoss, all positives / semi-hard",
    "ms": "MultiSimilarityLoss + its miner",
    "margin-dw": "MarginLoss, random / distance-weighted",
    "fappy-0.01": "FAPPYLoss(min_bin_width=0.01)",
    "loop-ms": "LoOpLoss(base='multi_similarity')",
    "pml-ms": "pml MultiSimilarityLoss + MultiSimilarityMiner",
    "pml-batchhard": "pml TripletMarginLoss + BatchHardMiner",
    "pml-semihard": "pml TripletMarginLoss + TripletMarginMiner('semihard')",
}


def make_inputs(batch, dim, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(max(1, batch // 4)), 4)[:batch]).astype("int32")
    if len(labels) < batch:
        labels = np.concatenate([labels, np.zeros(batch - len(labels), "int32")])
    return rng.standard_normal((batch, dim)).astype("float32"), labels


def is_oom(err) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return any(k in text for k in ("resource_exhausted", "out of memory", "oom", "resourceexhausted"))


def time_calls(fn, block, repeats, warmup=2):
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- tfdml on JAX -------------------------------------------------------------------------------


def tfdml_loss(name):
    import tfdml

    miners = tfdml.miners
    losses = tfdml.losses
    if name == "nca2-ephn":
        return losses.TripletNCALoss(order=2, miner=miners.TripletMiner("easy", "hard"))
    if name == "margin-semihard":
        return losses.TripletMarginLoss(miner=miners.TripletMiner("all", "semihard"))
    if name == "ms":
        return losses.MultiSimilarityLoss()
    if name == "margin-dw":
        return losses.MarginLoss()
    if name == "fappy-0.01":
        return losses.FAPPYLoss(min_bin_width=0.01)
    if name == "loop-ms":
        return losses.LoOpLoss(base="multi_similarity")
    raise ValueError(name)


def jax_step(name, labels, compute_dtype="float32"):
    """A jitted ``x -> (loss, d loss / d x)`` for the loss ``name`` (``"floor"``: the floor)."""
    import jax
    import jax.numpy as jnp
    import keras

    labels = jnp.asarray(labels)
    if name == "floor":
        def value(x):
            x = x.astype(compute_dtype)
            x = x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=1, keepdims=True), 1e-12))
            return jnp.sum(x @ x.T)
    else:
        loss = tfdml_loss(name)
        state = loss_variables(loss)

        def value(x):
            # The loss's variables (a miner's seed, MarginLoss's beta) as explicit state, as
            # Keras' JAX trainer passes those of a model the loss is attached to.
            with keras.StatelessScope(state_mapping=[(v, v.value) for v in state]):
                return loss(labels, x.astype(compute_dtype))

    return jax.jit(jax.value_and_grad(value))


def loss_variables(loss):
    """The variables a model owns once ``loss.attach(model)``: seeds and learned weights."""
    import keras

    holder = keras.Model()
    loss.attach(holder)
    return list(holder.variables)


def jax_block(out):
    import jax

    jax.block_until_ready(out)


def time_jax_loss(name, batch, dim, repeats):
    import jax.numpy as jnp

    x, labels = make_inputs(batch, dim)
    step = jax_step(name, labels)
    xj = jnp.asarray(x)
    return time_calls(lambda: step(xj), jax_block, repeats)


# -- the peer on PyTorch ----------------------------------------------------------------------


def peer_step(name, labels, dim):
    import torch
    from pytorch_metric_learning import losses, miners

    device = "cuda" if torch.cuda.is_available() else "cpu"
    y = torch.as_tensor(labels, device=device).long()
    if name == "pml-ms":
        loss, miner = losses.MultiSimilarityLoss(), miners.MultiSimilarityMiner()
    elif name == "pml-batchhard":
        loss, miner = losses.TripletMarginLoss(), miners.BatchHardMiner()
    elif name == "pml-semihard":
        loss, miner = losses.TripletMarginLoss(), miners.TripletMarginMiner(type_of_triplets="semihard")
    else:
        raise ValueError(name)

    def step(x):
        x = x.detach().requires_grad_(True)
        value = loss(x, y, miner(x, y))
        value.backward()
        return x.grad

    def block(_):
        if device == "cuda":
            torch.cuda.synchronize()

    return step, block, device


def time_peer(name, batch, dim, repeats):
    import torch

    x, labels = make_inputs(batch, dim)
    step, block, device = peer_step(name, labels, dim)
    xt = torch.as_tensor(x, device=device)
    try:
        return time_calls(lambda: step(xt), block, repeats)
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


# -- sections ---------------------------------------------------------------------------------


def measure(fn, *args):
    try:
        return fn(*args), ""
    except Exception as err:  # noqa: BLE001 - report and go on
        if is_oom(err):
            return None, "OOM"
        traceback.print_exc()
        return None, f"error: {type(err).__name__}"


def fmt_ms(seconds, note=""):
    return note if seconds is None else f"{seconds * 1e3:.3f}"


def loss_table(names, sizes, dim, repeats, timer, floors=None):
    rows = []
    floors = {} if floors is None else floors
    for batch in sizes:
        for name in names:
            seconds, note = measure(timer, name, batch, dim, repeats)
            if name == "floor" and seconds is not None:
                floors[batch] = seconds
            ratio = "" if seconds is None or batch not in floors else f"{seconds / floors[batch]:.2f}"
            rows.append(f"| {LABELS[name]} | {batch} | {fmt_ms(seconds, note)} | {ratio} |")
            print(rows[-1], flush=True)
    return rows, floors


def recall_section(num, dim, repeats):
    import tfdml

    rng = np.random.default_rng(1)
    x = rng.standard_normal((num, dim)).astype("float32")
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, num // 50, size=num)
    ks = (1, 10, 100, 1000)

    def run():
        return tfdml.metrics.recall_at_k(x, y, ks=ks)

    seconds = time_calls(run, lambda _: None, repeats, warmup=1)
    return f"| exact Recall@K, K = {ks} | {num} x {dim} | {seconds:.3f} s |"


def resnet_section(batch, image, dim, repeats):
    """The compiled train step of a ResNet50 with ``MultiSimilarityLoss``, the same step with a
    trivial loss (the mean of the embeddings), and the loss alone: the loss's share of the step
    measured both ways."""
    import jax.numpy as jnp
    import keras

    import tfdml

    _, labels = make_inputs(batch, 1)
    rng = np.random.default_rng(2)
    images = jnp.asarray(rng.uniform(0, 255, size=(batch, image, image, 3)), "float32")
    labels_j = jnp.asarray(labels)

    def step_time(loss):
        keras.config.set_dtype_policy("mixed_bfloat16")
        try:
            keras.utils.set_random_seed(0)
            backbone = keras.applications.ResNet50(include_top=False, weights=None,
                                                   pooling="avg", input_shape=(image, image, 3))
            model = keras.Sequential([backbone, keras.layers.Dense(dim, dtype="float32")])
            model.compile(optimizer="adam", loss=loss, jit_compile=True)
            return time_calls(lambda: model.train_on_batch(images, labels_j), lambda _: None,
                              repeats)
        finally:
            keras.config.set_dtype_policy("float32")

    with_loss = step_time(tfdml.losses.MultiSimilarityLoss())
    trivial = step_time(lambda y_true, y_pred: keras.ops.mean(y_pred))
    loss_step = jax_step("ms", labels, compute_dtype="float32")
    emb = jnp.asarray(np.random.default_rng(3).standard_normal((batch, dim)), "float32")
    loss_time = time_calls(lambda: loss_step(emb), jax_block, repeats)
    return (f"| ResNet50 {image} px, batch {batch}, mixed_bfloat16, MultiSimilarityLoss | "
            f"{with_loss * 1e3:.2f} ms | {trivial * 1e3:.2f} ms | "
            f"{(with_loss - trivial) * 1e3:.2f} ms ({100 * (with_loss - trivial) / with_loss:.2f} %) | "
            f"{loss_time * 1e3:.3f} ms ({100 * loss_time / with_loss:.2f} %) |")


def device_name():
    import jax

    dev = jax.devices()[0]
    return f"{dev.platform}: {getattr(dev, 'device_kind', str(dev))}"


def versions():
    import jax
    import keras

    parts = [f"Python {platform.python_version()}", f"JAX {jax.__version__}",
             f"Keras {keras.__version__}"]
    try:
        import torch

        parts.append(f"PyTorch {torch.__version__}")
        import pytorch_metric_learning

        parts.append(f"pytorch-metric-learning {pytorch_metric_learning.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes, for a CPU check")
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--dim", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--sections", nargs="+", default=["losses", "small", "recall", "resnet",
                                                          "peer"])
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    import keras

    if keras.backend.backend() != "jax":
        parser.error("run with KERAS_BACKEND=jax")
    small = args.small
    sizes = args.sizes or (SMALL_SIZES if small else SIZES)
    dim = args.dim or (64 if small else 512)
    repeats = args.repeats or (3 if small else 10)
    lines = [
        "# tfdml on a GPU: the multi-backend core under Keras' JAX backend (XLA)",
        "",
        f"- device: {device_name()}",
        f"- {versions()}",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `KERAS_BACKEND=jax python {' '.join(shlex.quote(a) for a in sys.argv)}`",
        f"- D = {dim}, float32, B / 4 classes x 4; median of {repeats} calls after 2 warm-ups",
        "",
    ]
    header = ["| loss | B | forward + backward (ms) | / floor |", "|---|---|---|---|"]
    floors = {}
    if "losses" in args.sections:
        rows, floors = loss_table(LOSSES, sizes, dim, repeats, time_jax_loss, floors)
        lines += ["## Losses, compiled (jax.jit), forward + backward", ""] + header + rows + [""]
    if "small" in args.sections:
        small_sizes = [b for b in (128, 512) if not small or b <= max(sizes)]
        rows, _ = loss_table(("floor",) + SMALL_LOSSES, small_sizes, dim, repeats,
                             time_jax_loss, dict(floors))
        lines += ["## FAPPY and LoOp", ""] + header + rows + [""]
    if "recall" in args.sections:
        num = 4000 if small else 60000
        row = recall_section(num, dim, max(1, repeats // 3))
        print(row, flush=True)
        lines += ["## Exact retrieval", "", "| what | N x D | time |", "|---|---|---|", row, ""]
    if "resnet" in args.sections:
        row, note = measure(resnet_section, 8 if small else 128, 64 if small else 224, dim,
                            max(2, repeats // 2))
        row = row or f"| ResNet50 | {note} | | | |"
        print(row, flush=True)
        lines += ["## Loss share of a training step", "",
                  "| model | step | step, trivial loss | difference (share) | "
                  "loss alone, fwd + bwd (share) |", "|---|---|---|---|---|", row, ""]
    if "peer" in args.sections:
        try:
            import pytorch_metric_learning  # noqa: F401
            import torch  # noqa: F401
        except ImportError as err:
            lines += ["## pytorch-metric-learning", "", f"not run: {err}", ""]
        else:
            rows, _ = loss_table(PEERS, sizes, dim, repeats, time_peer, {})
            lines += ["## pytorch-metric-learning (PyTorch, same device)", ""]
            lines += ["| loss | B | forward + backward (ms) | |", "|---|---|---|---|"] + rows + [""]
    report = "\n".join(lines)
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
