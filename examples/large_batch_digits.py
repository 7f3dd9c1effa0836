"""A batch far past what the dense loss could hold: digits with B = 16,384, in blocks and chunks.

The training digits 0-5 (scikit-learn's 8x8 images) are made into a large training
set of jittered copies (each image shifted by up to one pixel, with pixel noise),
and a small embedder (an MLP; `--model cnn` for the demo's CNN) is trained with the
second-order triplet loss and EPHN mining over batches of 16,384 images:

* the loss in row blocks, `TripletNCALoss(order=2, block_size=256)`: each block of
  256 anchors against the whole batch, recomputed in the backward pass;
* the network in chunks, `MetricModel(embedder, loss, chunk_size=2048)`: gradient
  caching, one chunk's activations at a time.

It prints the process's peak memory (resident set size) before and after training,
and what the dense loss's `[B, B]` float32 matrices would take (the loss holds several:
similarities, masks, mined scores, gradients), then Recall@K on the
held-out digits 6-9 for the raw 64 pixel values (cosine, no learning), the
network before training and after. The raw pixels are the best of the three on
these digits: the script shows that such a batch trains, not that training helps
(the glyph benchmark, `examples/glyphs/demo.py`, measures that). Runs offline under TensorFlow, JAX or
PyTorch (`KERAS_BACKEND`), on NumPy arrays (no tf.data), in under a minute on 2 CPU
cores. (On the CPU, XLA runs convolutions inside the chunk loop slowly: with `--model cnn`
under JAX a step takes about 100 s; TensorFlow and PyTorch run it uncompiled here.)

    python examples/large_batch_digits.py
    python examples/large_batch_digits.py --batch-size 4096 --block-size 512 --epochs 2
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import keras
import numpy as np

import tfdml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_demo import build_model  # noqa: E402  (the demo's embedders)

KS = (1, 2, 4, 8)


def build_embedder(kind, embedding_dim):
    if kind == "cnn":
        return build_model("cnn", embedding_dim)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(embedding_dim),
    ], name="digits_mlp")


def peak_rss_mib():
    """The process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def jittered_copies(images, labels, copies, seed):
    """``copies`` jittered versions of every 8x8 image: shifted by -1, 0 or 1 pixel, plus noise."""
    rng = np.random.default_rng(seed)
    grid = images.reshape(-1, 8, 8)
    out = []
    for _ in range(copies):
        dy, dx = rng.integers(-1, 2, size=2)
        shifted = np.roll(grid, (int(dy), int(dx)), axis=(1, 2))
        out.append(shifted + rng.normal(0.0, 0.05, size=shifted.shape))
    x = np.concatenate(out).reshape(len(out) * len(images), *images.shape[1:])
    return x.astype("float32"), np.tile(labels, copies)


def recalls(embedder, images, labels):
    embeddings = embedder.predict(images, batch_size=1024, verbose=0)
    found = tfdml.metrics.recall_at_k(embeddings, labels, ks=KS)
    return {k: float(found[k]) for k in KS}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=2048)
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("batch_size", "block_size", "chunk_size", "copies", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")

    start = time.perf_counter()
    train = tfdml.datasets.load("digits", "train", dtype="float32")  # digits 0-5
    test = tfdml.datasets.load("digits", "test", dtype="float32")    # digits 6-9
    x, y = jittered_copies(train.images, train.labels, args.copies, args.seed)
    if args.batch_size > len(x):
        parser.error(f"--batch-size {args.batch_size} is larger than the {len(x)} training "
                     f"images ({args.copies} copies of {len(train)} digits): raise --copies or "
                     "lower --batch-size")
    batch = args.batch_size
    steps = len(x) // batch
    print(f"tfdml {tfdml.__version__} ({keras.backend.backend()}): {len(x)} training images "
          f"({args.copies} jittered copies of {len(train)} digits 0-5), {args.model} embedder, "
          f"batches of {batch}, "
          f"{steps} steps per epoch x {args.epochs} epochs; loss blocks of {args.block_size} "
          f"anchors, network chunks of {args.chunk_size} images", flush=True)

    keras.utils.set_random_seed(args.seed)
    loss = tfdml.losses.TripletNCALoss(order=2, block_size=args.block_size)
    model = tfdml.models.MetricModel(build_embedder(args.model, args.embedding_dim), loss,
                                     chunk_size=args.chunk_size)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                  jit_compile=keras.backend.backend() == "jax")
    before = recalls(model.embedder, test.images, test.labels)
    found = tfdml.metrics.recall_at_k(test.images.reshape(len(test), -1), test.labels, ks=KS)
    raw = {k: float(found[k]) for k in KS}  # cosine on the pixel values: no learning at all

    rss_before = peak_rss_mib()
    t = time.perf_counter()
    # Whole batches only (the last, partial one is dropped by using steps_per_epoch).
    history = model.fit(x[:steps * batch], y[:steps * batch], batch_size=batch,
                        epochs=args.epochs, shuffle=True, verbose=0)
    seconds = time.perf_counter() - t
    rss_after = peak_rss_mib()
    after = recalls(model.embedder, test.images, test.labels)

    matrix_mib = batch * batch * 4 / 2**20
    block_mib = min(args.block_size, batch) * batch * 4 / 2**20
    losses = history.history["loss"]
    print(f"\nTraining: {seconds:.1f} s, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"Memory: peak RSS {rss_before:.0f} MiB before training, {rss_after:.0f} MiB after "
          f"(+{rss_after - rss_before:.0f} MiB, compilation included).")
    print(f"The dense loss: one [{batch}, {batch}] float32 matrix is {matrix_mib:.0f} MiB, and "
          f"its step adds about five times that (1.3 GiB at B = 8192 in "
          f"benchmarks/results/large_batch_cpu.md): ~{5 * matrix_mib / 1024:.1f} GiB. In "
          f"blocks: [{min(args.block_size, batch)}, {batch}] matrices of {block_mib:.0f} MiB.")
    print("\nRecall@K (%) on the held-out digits 6-9 (cosine, query excluded):\n")
    print("| | " + " | ".join(f"R@{k}" for k in KS) + " |")
    print("|---|" + "---:|" * len(KS))
    for name, row in (("raw pixels", raw), ("before training", before),
                      ("after training", after)):
        print(f"| {name} | " + " | ".join(f"{100 * row[k]:.1f}" for k in KS) + " |")
    print(f"\n({time.perf_counter() - start:.0f} s in all)")
    return {"raw": raw, "before": before, "after": after, "losses": losses, "batch": batch,
            "rss_increase_mib": rss_after - rss_before, "dense_matrix_mib": matrix_mib}


if __name__ == "__main__":
    main()
