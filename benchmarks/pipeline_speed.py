"""Throughput of the P x K pipeline against a plain shuffled tf.data pipeline.

Writes a few hundred random JPEG files (64 to 128 px, several classes) to a temporary
directory, then times, in the same process and in alternating rounds,

* `pk`: `tfdml.data.pk_batches((paths, labels), P, K, map_fn=augment)` (the default
  `on_error="raise"`),
* `pk-skip`: the same with `on_error="skip"` (one small pipeline per batch), and
* `plain`: `Dataset.from_tensor_slices((paths, labels)).shuffle().repeat()
  .map(read + decode + augment).batch(P * K).prefetch()`,

with the same decode (`tf.io.decode_image`) and the same augmentation
(`tfdml.data.augment.train_transform`, resize + random crop + flip + ResNet50
normalization, per-element stateless seeds in all). It reports images per second
(median over rounds), the ratios of the medians, and the medians of the per-round ratios
(pipelines timed next to each other, which cancels slow changes of the machine's load). Each round times a
fresh iterator of one pipeline after a few discarded batches, so only one pipeline runs at
a time.

    python benchmarks/pipeline_speed.py                 # defaults below
    python benchmarks/pipeline_speed.py --rounds 11 --batches 40
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

import tfdml.data


def write_jpegs(directory, num_images, num_classes, seed):
    rng = np.random.default_rng(seed)
    paths, labels = [], []
    for i in range(num_images):
        h, w = rng.integers(64, 129, size=2)
        # Smooth random images compress like photos more than white noise does.
        small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        image = tf.image.resize(small, (h, w)).numpy().astype(np.uint8)
        path = os.path.join(directory, f"img_{i:05d}.jpg")
        tf.io.write_file(path, tf.io.encode_jpeg(image, quality=90))
        paths.append(path)
        labels.append(i % num_classes)
    return paths, np.array(labels, dtype=np.int64)


def plain_pipeline(paths, labels, batch, augment, seed):
    base = tf.constant([seed, 0], tf.int64)

    def load(index, path_label):
        path, label = path_label
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        elem_seed = tf.random.experimental.stateless_fold_in(base, index)
        return augment(image, seed=elem_seed), label

    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    ds = ds.shuffle(len(paths), seed=seed).repeat().enumerate()
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def time_round(dataset, warmup, batches):
    """Seconds for `batches` batches of a fresh iterator, after `warmup` batches.

    Each round has its own iterator, deleted at the end, so that no pipeline keeps filling
    its buffers in the background while the other one is timed.
    """
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(iterator)
    images.numpy()
    seconds = time.perf_counter() - start
    del iterator
    gc.collect()
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--classes-per-batch", type=int, default=16)
    parser.add_argument("--samples-per-class", type=int, default=4)
    parser.add_argument("--crop", type=int, default=112)
    parser.add_argument("--resize", type=int, default=128)
    parser.add_argument("--batches", type=int, default=30, help="batches timed per round")
    parser.add_argument("--warmup", type=int, default=5,
                        help="batches discarded at the start of each round (buffers filling)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    p, k = args.classes_per_batch, args.samples_per_class
    batch = p * k
    augment = tfdml.data.augment.train_transform(args.crop, args.resize, preprocess="resnet50")
    with tempfile.TemporaryDirectory() as directory:
        paths, labels = write_jpegs(directory, args.images, args.classes, args.seed)
        pipelines = {
            "pk": tfdml.data.pk_batches((paths, labels), p, k, seed=args.seed, map_fn=augment),
            "pk-skip": tfdml.data.pk_batches((paths, labels), p, k, seed=args.seed,
                                             map_fn=augment, on_error="skip"),
            "plain": plain_pipeline(paths, labels, batch, augment, args.seed),
        }
        for ds in pipelines.values():  # warm-up: tracing, page cache
            time_round(ds, args.warmup, args.batches)
        rates = {name: [] for name in pipelines}
        order = list(pipelines)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                seconds = time_round(pipelines[name], args.warmup, args.batches)
                rates[name].append(args.batches * batch / seconds)

    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
          f"{platform.system()} {platform.release()}, TensorFlow {tf.__version__}")
    print(f"data: {args.images} JPEG files 64-128 px, {args.classes} classes; batch {p} x {k} = "
          f"{batch}; augment: resize {args.resize}, random crop {args.crop}, flip, resnet50")
    print(f"timing: {args.rounds} alternating rounds, each a fresh iterator: {args.warmup} "
          f"batches discarded, then {args.batches} batches timed")
    print("")
    print("| pipeline | images/s (median) | rounds |")
    print("|---|---|---|")
    for name in pipelines:
        cells = ", ".join(f"{v:.0f}" for v in rates[name])
        print(f"| {name} | {med[name]:.0f} | {cells} |")
    print("")
    for name in ("pk", "pk-skip"):
        ratio = med[name] / med["plain"]
        # Rounds are timed next to each other, so per-round ratios cancel slow load drifts.
        paired = statistics.median(a / b for a, b in zip(rates[name], rates["plain"], strict=True))
        print(f"ratio {name} / plain: {ratio:.3f} of the medians, {paired:.3f} median of the "
              f"per-round ratios (cost {100 * (1 - paired):+.1f}% of throughput)")


if __name__ == "__main__":
    main()
