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
   60,000 x 512 unit vectors (``--small``: 4,000 x 64), every sample a query against the rest;
   and ``tfdml.search.Index.search`` top-101 and top-1001 over the same vectors against
   PyTorch ``matmul`` + ``topk`` in chunks of 1024 queries on the same device.
4. A **ResNet50** (``keras.applications``, ``weights=None``, 224 px, batch 128,
   ``mixed_bfloat16``, compiled ``train_on_batch`` on device-resident arrays) with a 512-d
   float32 embedding head, trained with ``MultiSimilarityLoss``. The loss's share of the
   step, two ways: the step time minus that of the same step with a trivial loss (the mean
   of the embeddings), and the loss's own forward + backward time (as in section 1), each
   over the step time.
5. **Pair losses with a softmax, and cross-batch memory**, at ``B`` = 512 and 8192
   (``--state-sizes``): ``SupConLoss()``, ``NTXentLoss()``, ``CircleLoss()`` and
   ``CrossBatchMemory(ContrastiveLoss(), memory_size=4 * B)`` with a full bank (random
   embeddings and labels; the bank's variables are inputs of the compiled step, and the
   updated bank is one of its outputs, as in a training step), next to the floor.
6. **Losses with class vectors** at ``B`` = 512 and 8192 and ``C`` = 1,000 and 100,000
   classes (``--classes``): the functional forms ``proxy_anchor_loss``, ``proxy_nca_loss``,
   ``normalized_softmax_loss``, ``cosface_loss``, ``arcface_loss``,
   ``subcenter_arcface_loss`` (3 sub-centres) and ``soft_triple_loss`` (10 centres), with the
   defaults of their classes, on one fixed random array of class vectors (``[C, D]`` or
   ``[C, k, D]``); the gradient is taken with respect to the embeddings **and** the class
   vectors (what a training step needs). Class ids: the ``B / 4`` batch classes modulo ``C``.
   Their floor, the *class floor*, is L2-normalize both + ``B x C`` matmul + sum, with the
   same two gradients. The ``B x C`` cosines take 3.3 GB at ``B = 8192``, ``C = 100,000``
   (``[B, C, k]``: ``k`` times that); before timing, the section compiles each loss at small
   sizes and checks that no tensor of the compiled program has ``B x C x D`` elements.
7. The peer, **pytorch-metric-learning** (when importable) on the same device with PyTorch:
   ``MultiSimilarityLoss`` + ``MultiSimilarityMiner``, ``TripletMarginLoss`` +
   ``BatchHardMiner``, ``TripletMarginLoss`` + ``TripletMarginMiner("semihard")``, forward +
   backward, same ``B`` and ``D``; ``SupConLoss`` at the sizes of section 5, and
   ``ProxyAnchorLoss`` and ``ArcFaceLoss`` (its default margin, 28.6 degrees) at those of
   section 6, with the gradient of their own class vectors too.

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
import re
import shlex
import statistics
import sys
import time
import traceback
import warnings

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402
from class_losses import CLASS_LOSSES  # noqa: E402  (benchmarks/class_losses.py)

SIZES = (128, 512, 2048, 8192, 16384, 32768)
SMALL_SIZES = (64, 128, 256)
LOSSES = ("floor", "nca2-ephn", "margin-semihard", "ms", "margin-dw")
SMALL_LOSSES = ("fappy-0.01", "loop-ms")
PEERS = ("pml-ms", "pml-batchhard", "pml-semihard")
STATE_SIZES = (512, 8192)
SMALL_STATE_SIZES = (64, 256)
CLASSES = (1000, 100000)
SMALL_CLASSES = (10, 1000)
PAIR_LOSSES = ("supcon", "ntxent", "circle", "xbm-contrastive")
XBM_MEMORY_FACTOR = 4  # xbm-contrastive: memory_size = 4 * B
PAIR_PEERS = ("pml-supcon",)
CLASS_PEERS = ("pml-proxy-anchor", "pml-arcface")
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
    "supcon": "SupConLoss()",
    "ntxent": "NTXentLoss()",
    "circle": "CircleLoss()",
    "xbm-contrastive": "CrossBatchMemory(ContrastiveLoss(), memory_size=4*B), full bank",
    "class-floor": "class floor (normalize + B x C matmul + sum)",
    "proxy-anchor": "proxy_anchor_loss",
    "proxy-nca": "proxy_nca_loss",
    "normalized-softmax": "normalized_softmax_loss",
    "cosface": "cosface_loss",
    "arcface": "arcface_loss",
    "subcenter-arcface": "subcenter_arcface_loss, 3 sub-centres",
    "soft-triple": "soft_triple_loss, 10 centres",
    "pml-supcon": "pml SupConLoss",
    "pml-proxy-anchor": "pml ProxyAnchorLoss",
    "pml-arcface": "pml ArcFaceLoss",
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
    if name == "supcon":
        return losses.SupConLoss()
    if name == "ntxent":
        return losses.NTXentLoss()
    if name == "circle":
        return losses.CircleLoss()
    raise ValueError(name)


def _unit_rows(x):
    import jax
    import jax.numpy as jnp

    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-12))


def jax_step(name, labels, compute_dtype="float32", dim=None):
    """A jitted ``x -> (loss, d loss / d x)`` for the loss ``name`` (``"floor"``: the floor).

    A loss with state (a miner's seed, ``MarginLoss``'s beta, a memory bank) gets its
    variables as inputs of the compiled function, as Keras' JAX trainer passes those of
    the ``tfdml.models.MetricModel`` that owns them, and returns their new values (an
    updated memory bank) as an auxiliary output.
    """
    import jax
    import jax.numpy as jnp
    import keras

    labels = jnp.asarray(labels)
    if name == "floor":
        def value(x):
            x = _unit_rows(x.astype(compute_dtype))
            return jnp.sum(x @ x.T)

        return jax.jit(jax.value_and_grad(value))
    if name == "xbm-contrastive":
        loss, values = xbm_loss(len(labels), dim)
    else:
        loss = tfdml_loss(name)
        values = None
    state = loss_variables(loss, dim)
    if values is None:
        values = [v.value for v in state]

    def value(x, values):
        with keras.StatelessScope(state_mapping=list(zip(state, values, strict=True))) as scope:
            result = loss(labels, x.astype(compute_dtype))
        updated = [scope.get_current_value(v) for v in state]
        return result, [old if new is None else new for old, new in zip(values, updated,
                                                                        strict=True)]

    step = jax.jit(jax.value_and_grad(value, has_aux=True))
    return lambda x: step(x, values)


def loss_variables(loss, dim=None):
    """The variables of the loss's state (seeds, learned weights, a memory bank), built."""
    state = loss.build_state(dim)
    return [] if state is None else list(state.variables)


def xbm_loss(batch, dim):
    """``CrossBatchMemory(ContrastiveLoss())`` and the values of its variables with a full
    bank of random embeddings and labels."""
    import jax.numpy as jnp

    import tfdml

    memory = XBM_MEMORY_FACTOR * batch
    loss = tfdml.losses.CrossBatchMemory(tfdml.losses.ContrastiveLoss(), memory_size=memory)
    bank = loss.build_state(dim)
    rng = np.random.default_rng(4)
    full = {
        id(bank.embeddings): rng.standard_normal((memory, dim)).astype("float32"),
        id(bank.labels): rng.integers(0, max(1, batch // 4), memory).astype("int32"),
        id(bank.filled): np.asarray(memory, "int32"),
    }
    values = [jnp.asarray(full[id(v)]) if id(v) in full else v.value
              for v in loss_variables(loss, dim)]
    return loss, values


def class_vectors(name, classes, dim, seed=5):
    """The fixed random class vectors of a class loss: ``[C, D]`` or ``[C, k, D]``."""
    per_class = CLASS_LOSSES[name][1]
    shape = (classes, dim) if per_class is None else (classes, per_class, dim)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(dim)))


def class_value_fn(name, labels):
    """``(x, w) -> loss`` for a class loss (its functional form) or the class floor."""
    import jax.numpy as jnp

    import tfdml

    func_name = CLASS_LOSSES[name][0]
    labels = jnp.asarray(labels)
    if func_name is None:
        def value(x, w):
            return jnp.sum(_unit_rows(x) @ _unit_rows(w).T)

        return value
    loss = getattr(tfdml.losses, func_name)
    return lambda x, w: loss(labels, x, w)


def class_step(name, labels):
    """A jitted ``(x, w) -> (loss, (d loss / d x, d loss / d w))``."""
    import jax

    return jax.jit(jax.value_and_grad(class_value_fn(name, labels), argnums=(0, 1)))


def class_labels(batch, classes):
    _, labels = make_inputs(batch, 1)
    return labels % classes


def time_class_loss(name, batch, classes, dim, repeats):
    import jax.numpy as jnp

    x, _ = make_inputs(batch, dim)
    step = class_step(name, class_labels(batch, classes))
    xj = jnp.asarray(x)
    wj = jnp.asarray(class_vectors(name, classes, dim))
    return time_calls(lambda: step(xj, wj), jax_block, repeats)


_SHAPE = re.compile(r"\b(?:pred|[fsu](?:8|16|32|64)|bf16)\[([0-9,]*)\]")


def largest_compiled_tensor(name, batch=64, classes=96, dim=48):
    """The element count of the largest array in the optimized program of a class loss's
    value and gradients (compiled, not run), at small sizes, and ``B * C * D``."""
    import jax.numpy as jnp

    x, _ = make_inputs(batch, dim)
    step = class_step(name, class_labels(batch, classes))
    text = step.lower(jnp.asarray(x),
                      jnp.asarray(class_vectors(name, classes, dim))).compile().as_text()
    largest = max(int(np.prod([int(d) for d in m.group(1).split(",") if d] or [1]))
                  for m in _SHAPE.finditer(text))
    return largest, batch * classes * dim


def jax_block(out):
    import jax

    jax.block_until_ready(out)


def time_jax_loss(name, batch, dim, repeats):
    import jax.numpy as jnp

    x, labels = make_inputs(batch, dim)
    step = jax_step(name, labels, dim=dim)
    xj = jnp.asarray(x)
    return time_calls(lambda: step(xj), jax_block, repeats)


# -- the peer on PyTorch ----------------------------------------------------------------------


def peer_step(name, labels, dim, classes=None):
    import torch
    from pytorch_metric_learning import losses, miners

    device = "cuda" if torch.cuda.is_available() else "cpu"
    y = torch.as_tensor(labels, device=device).long()
    miner = None
    if name == "pml-ms":
        loss, miner = losses.MultiSimilarityLoss(), miners.MultiSimilarityMiner()
    elif name == "pml-batchhard":
        loss, miner = losses.TripletMarginLoss(), miners.BatchHardMiner()
    elif name == "pml-semihard":
        loss, miner = losses.TripletMarginLoss(), miners.TripletMarginMiner(type_of_triplets="semihard")
    elif name == "pml-supcon":
        loss = losses.SupConLoss()
    elif name == "pml-proxy-anchor":
        loss = losses.ProxyAnchorLoss(num_classes=classes, embedding_size=dim)
    elif name == "pml-arcface":
        loss = losses.ArcFaceLoss(num_classes=classes, embedding_size=dim)
    else:
        raise ValueError(name)
    loss = loss.to(device)

    def step(x):
        x = x.detach().requires_grad_(True)
        for p in loss.parameters():  # the class vectors: a fresh gradient each step
            p.grad = None
        value = loss(x, y, miner(x, y)) if miner is not None else loss(x, y)
        value.backward()
        return x.grad

    def block(_):
        if device == "cuda":
            torch.cuda.synchronize()

    return step, block, device


def time_peer(name, batch, dim, repeats, classes=None):
    import torch

    x, labels = make_inputs(batch, dim)
    if classes is not None:
        labels = labels % classes
    step, block, device = peer_step(name, labels, dim, classes)
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


def class_table(names, sizes, classes, dim, repeats, timer):
    """Rows ``| loss | B | C | ms | / class floor |``; ``timer(name, B, C, D, repeats)``."""
    rows = []
    for num_classes in classes:
        for batch in sizes:
            floor = None
            for name in names:
                seconds, note = measure(timer, name, batch, num_classes, dim, repeats)
                if name == "class-floor":
                    floor = seconds
                ratio = "" if seconds is None or not floor else f"{seconds / floor:.2f}"
                rows.append(f"| {LABELS[name]} | {batch} | {num_classes} | "
                            f"{fmt_ms(seconds, note)} | {ratio} |")
                print(rows[-1], flush=True)
    return rows


def time_class_peer(name, batch, classes, dim, repeats):
    return time_peer(name, batch, dim, repeats, classes)


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


def index_rows(num, dim, repeats, ks=(101, 1001)):
    """``tfdml.search.Index.search`` (every sample a query) against PyTorch ``matmul`` +
    ``topk`` on the same device, in chunks of 1024 queries (when PyTorch is importable)."""
    import tfdml

    rng = np.random.default_rng(2)
    x = rng.standard_normal((num, dim)).astype("float32")
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = tfdml.search.Index("dot")
    index.add(x)
    rows = []
    for k in ks:
        k = min(k, num)
        seconds = time_calls(lambda k=k: index.search(x, k), lambda _: None, repeats, warmup=1)
        rows.append(f"| tfdml.search.Index.search, top-{k} | {num} x {dim} | {seconds:.3f} s |")
        try:
            import torch
        except ImportError:
            rows.append(f"| PyTorch matmul + topk, top-{k} | {num} x {dim} | not run (no torch) |")
            continue
        device = "cuda" if torch.cuda.is_available() else "cpu"
        xt = torch.from_numpy(x).to(device)

        def peer(k=k, xt=xt):
            out = []
            for start in range(0, num, 1024):
                out.append(torch.topk(xt[start:start + 1024] @ xt.T, k, dim=1).indices)
            return torch.cat(out).cpu()

        def block(_, device=device):
            if device == "cuda":
                torch.cuda.synchronize()

        seconds = time_calls(peer, block, repeats, warmup=1)
        rows.append(f"| PyTorch matmul + topk ({device}), top-{k} | {num} x {dim} | "
                    f"{seconds:.3f} s |")
    return rows


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
    loss_step = jax_step("ms", labels, compute_dtype="float32", dim=dim)
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
    parser.add_argument("--state-sizes", type=int, nargs="+", default=None,
                        help="B of the pair-softmax, XBM and class-vector losses "
                             "(default: 512 8192; --small: 64 256)")
    parser.add_argument("--classes", type=int, nargs="+", default=None,
                        help="C of the class-vector losses (default: 1000 100000; "
                             "--small: 10 1000)")
    parser.add_argument("--sections", nargs="+", default=["losses", "small", "pairs", "classes",
                                                          "recall", "resnet", "peer"])
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    import keras

    if keras.backend.backend() != "jax":
        parser.error("run with KERAS_BACKEND=jax")
    # jax_step passes the losses' variables in and out of the compiled step itself, as the
    # MetricModel that would own them does: the losses' warning about it does not apply.
    warnings.filterwarnings("ignore", message=r"Loss '.*' has (learned variables|a memory bank"
                                              r"|a random miner)")
    small = args.small
    sizes = args.sizes or (SMALL_SIZES if small else SIZES)
    dim = args.dim or (64 if small else 512)
    repeats = args.repeats or (3 if small else 10)
    state_sizes = args.state_sizes or (SMALL_STATE_SIZES if small else STATE_SIZES)
    classes = args.classes or (SMALL_CLASSES if small else CLASSES)
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
    if "pairs" in args.sections:
        rows, _ = loss_table(("floor",) + PAIR_LOSSES, state_sizes, dim, repeats, time_jax_loss)
        lines += ["## SupCon, NT-Xent, circle and cross-batch memory", ""] + header + rows + [""]
    if "classes" in args.sections:
        checks = []
        for name in CLASS_LOSSES:
            largest, cube = largest_compiled_tensor(name)
            checks.append(f"{name} {largest}")
            if largest >= cube:
                raise AssertionError(f"{name}: a compiled tensor has {largest} >= B x C x D = "
                                     f"{cube} elements")
        note = ("Largest tensor of each compiled program at B = 64, C = 96, D = 48 "
                f"(B x C x D = {64 * 96 * 48} elements): " + ", ".join(checks) + ".")
        print(note, flush=True)
        rows = class_table(tuple(CLASS_LOSSES), state_sizes, classes, dim, repeats,
                           time_class_loss)
        lines += ["## Losses with class vectors (gradients w.r.t. embeddings and vectors)", "",
                  "| loss | B | C | forward + backward (ms) | / class floor |",
                  "|---|---|---|---|---|"] + rows + ["", note, ""]
    if "recall" in args.sections:
        num = 4000 if small else 60000
        row = recall_section(num, dim, max(1, repeats // 3))
        print(row, flush=True)
        search_rows = index_rows(num, dim, max(1, repeats // 3))
        print("\n".join(search_rows), flush=True)
        lines += ["## Exact retrieval", "", "| what | N x D | time |", "|---|---|---|", row,
                  *search_rows, ""]
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
            if "pairs" in args.sections:
                rows, _ = loss_table(PAIR_PEERS, state_sizes, dim, repeats, time_peer, {})
                lines += ["| loss | B | forward + backward (ms) | |",
                          "|---|---|---|---|"] + rows + [""]
            if "classes" in args.sections:
                rows = class_table(CLASS_PEERS, state_sizes, classes, dim, repeats,
                                   time_class_peer)
                lines += ["| loss | B | C | forward + backward (ms) | |",
                          "|---|---|---|---|---|"] + rows + [""]
    report = "\n".join(lines)
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
