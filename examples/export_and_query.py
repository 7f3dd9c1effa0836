"""Example: export an embedding model as a SavedModel, load it, answer nearest-neighbour queries.

1. Builds a ResNet18 embedding model (``weights=None``: runs offline; nothing is downloaded)
   for 32x32 images and, optionally, trains it for a few steps with the 2nd-order triplet
   loss.
2. Exports it with :func:`tfdml.export.export_embedding_model`: the SavedModel takes raw
   ``uint8`` images of any batch size, here of any height and width (they are resized to
   32x32), applies ResNet18's preprocessing and returns L2-normalized embeddings.
3. Loads it with plain ``tf.saved_model.load`` and embeds a gallery, calibration images and
   queries with it.
4. Indexes the gallery (:class:`tfdml.search.Index`, with labels and ids), looks up the
   queries' top-k neighbours, calibrates a match threshold for a target precision on the
   calibration images (:func:`tfdml.search.calibrate`), matches the queries (their nearest
   gallery label, or -1 for "unknown"), and saves the index.

It also prints the precision@k of the same queries against the same gallery for two
baselines: the raw pixel values (cosine, no learning) and the same network before training
(in Keras, with the SavedModel's resizing and preprocessing). On these digits the raw pixels
are at least as good as the trained network: the example shows export and search, not that
training helps (the glyph benchmark, ``examples/glyphs/demo.py``, measures that).

Images: scikit-learn's 8x8 digits, scaled to 0..255 and repeated into 24x24 RGB images (a
different size than the model's, to show the resizing). Runs in about 30 s on 2 CPU cores:

    python examples/export_and_query.py
    python examples/export_and_query.py --steps 0 --k 3 --out /tmp/embedder
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfdml
import tfdml.export
import tfdml.models


def digit_images(size=24):
    """Digits as uint8 RGB images ``[N, size, size, 3]`` and their labels."""
    digits = load_digits()
    scale = size // 8
    images = np.kron(digits.images, np.ones((scale, scale))) * (255.0 / 16.0)
    images = np.repeat(images[..., None], 3, axis=-1).round().astype(np.uint8)
    return images, digits.target.astype(np.int32)


def embed(serve, images, batch_size=64):
    """Runs the SavedModel's serving signature over ``images`` in batches."""
    out = [
        serve(images=tf.constant(images[i:i + batch_size]))["embeddings"].numpy()
        for i in range(0, len(images), batch_size)
    ]
    return np.concatenate(out)


def model_inputs(images):
    """The model's inputs for uint8 images: resized to 32x32, ResNet18's preprocessing."""
    preprocess = tfdml.models.get_preprocess("resnet18")
    return preprocess(tf.image.resize(tf.cast(images, tf.float32), (32, 32))).numpy()


def precision_at_k(gallery, gallery_labels, queries, query_labels, k):
    """The share of the queries' top-k gallery neighbours (cosine) with the query's label."""
    index = tfdml.search.Index("cosine")
    index.add(gallery, labels=gallery_labels)
    return float(np.mean(index.lookup(queries, k=k).labels == query_labels[:, None]))


def train(model, images, labels, steps, seed):
    """A few steps of 2nd-order triplet NCA (EPHN) on P x K batches: 8 classes x 4 images."""
    rng = np.random.default_rng(seed)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=tfdml.losses.TripletNCALoss(order=2))
    x = model_inputs(images)
    for _ in range(steps):
        classes = rng.choice(np.unique(labels), size=8, replace=False)
        idx = np.concatenate([rng.choice(np.flatnonzero(labels == c), 4) for c in classes])
        model.train_on_batch(x[idx], labels[idx])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps before export")
    parser.add_argument("--k", type=int, default=5, help="neighbours per query")
    parser.add_argument("--queries", type=int, default=5, help="number of queries shown")
    parser.add_argument("--gallery", type=int, default=500, help="gallery size")
    parser.add_argument("--calibration", type=int, default=500,
                        help="images the match threshold is calibrated on")
    parser.add_argument("--target-precision", type=float, default=0.9)
    parser.add_argument("--out", default=None, help="SavedModel directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("k", "queries", "gallery", "calibration"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.steps < 0:
        parser.error(f"--steps must be >= 0, got {args.steps}")
    if args.k > args.gallery:
        parser.error(f"--k {args.k} asks for more neighbours than --gallery {args.gallery}")
    start = time.time()
    keras.utils.set_random_seed(args.seed)

    images, labels = digit_images()
    needed = args.gallery + args.queries + args.calibration
    if needed > len(images):
        parser.error(f"--gallery {args.gallery} + --queries {args.queries} + --calibration "
                     f"{args.calibration} = {needed} images, but the digits hold {len(images)}")
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(images))
    gallery_idx = order[: args.gallery]
    query_idx = order[args.gallery: args.gallery + args.queries]
    calibration_idx = order[args.gallery + args.queries:
                            args.gallery + args.queries + args.calibration]

    model = tfdml.models.build_embedding_model(
        "resnet18", embedding_dim=32, input_shape=(32, 32, 3), weights=None,
        freeze_batchnorm=True,
    )
    # Baselines on the same queries and gallery: the raw pixel values (no learning at all)
    # and the network before training.
    baselines = {
        "raw pixels": precision_at_k(
            images[gallery_idx].reshape(args.gallery, -1).astype(np.float32),
            labels[gallery_idx], images[query_idx].reshape(args.queries, -1).astype(np.float32),
            labels[query_idx], args.k),
        "untrained network": precision_at_k(
            model.predict(model_inputs(images[gallery_idx]), verbose=0), labels[gallery_idx],
            model.predict(model_inputs(images[query_idx]), verbose=0), labels[query_idx],
            args.k),
    }
    if args.steps:
        train(model, images[gallery_idx], labels[gallery_idx], args.steps, args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(args.out or tmp) / "embedder"
        # "auto" preprocessing: the model knows it is a ResNet18 ("torch" normalization).
        tfdml.export.export_embedding_model(model, path, image_size=(None, None))

        # --- serving side: only TensorFlow is needed from here on ---
        serve = tf.saved_model.load(str(path)).signatures["serving_default"]
        gallery = embed(serve, images[gallery_idx])
        queries = embed(serve, images[query_idx])
        calibration = embed(serve, images[calibration_idx])

        # --- search: index the gallery, look up, calibrate, match ---
        index = tfdml.search.Index("cosine")
        index.add(gallery, labels=labels[gallery_idx], ids=gallery_idx)
        found = index.lookup(queries, k=args.k)
        calibrated = tfdml.search.calibrate(index, calibration, labels[calibration_idx],
                                            target_precision=args.target_precision)
        matched = index.match(queries, calibrated.threshold)
        index.save(pathlib.Path(path).parent / "gallery_index.npz")

    print(f"gallery {len(index)} images, embeddings {index.dim}-d, "
          f"{args.steps} training steps")
    for q, (lab, nl, s, m) in enumerate(zip(labels[query_idx], found.labels, found.scores,
                                            matched, strict=True)):
        shown = ", ".join(f"{n} ({v:.3f})" for n, v in zip(nl, s, strict=True))
        answer = "unknown" if m == -1 else f"digit {m}"
        print(f"query {q}: digit {lab} -> top-{args.k} digits (cosine): {shown}; "
              f"match: {answer}")
    precision = float(np.mean(found.labels == labels[query_idx][:, None]))
    print(f"precision@{args.k} over {len(query_idx)} queries: {precision:.2f} (raw pixels "
          f"{baselines['raw pixels']:.2f}, untrained network "
          f"{baselines['untrained network']:.2f})")
    print(f"match threshold (cosine >= {calibrated.threshold:.3f}) for a precision of "
          f"{args.target_precision:g} on {len(calibration_idx)} calibration images: precision "
          f"{calibrated.precision:.3f}, recall {calibrated.recall:.3f}"
          f"{'' if calibrated.reached else ' (target not reached)'} "
          f"({time.time() - start:.1f} s)")
    return found, calibrated, precision


if __name__ == "__main__":
    main()
