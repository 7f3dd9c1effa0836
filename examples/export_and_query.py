"""Example: export an embedding model as a SavedModel, load it, answer nearest-neighbour queries.

1. Builds a ResNet18 embedding model (``weights=None``: runs offline; nothing is downloaded)
   for 32x32 images and, optionally, trains it for a few steps with the 2nd-order triplet
   loss.
2. Exports it with :func:`tfdml.export.export_embedding_model`: the SavedModel takes raw
   ``uint8`` images of any batch size, here of any height and width (they are resized to
   32x32), applies ResNet18's preprocessing and returns L2-normalized embeddings.
3. Loads it with plain ``tf.saved_model.load`` (no tfdml needed on the serving side), embeds
   a gallery and answers top-k cosine nearest-neighbour queries.

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


def top_k_cosine(queries, gallery, k):
    """Indices ``[Q, k]`` and cosine similarities of each query's k nearest gallery items.

    Both inputs are L2-normalized (the exported model's output is), so the dot product is
    the cosine similarity.
    """
    scores = queries @ gallery.T
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(scores, idx, axis=1)


def embed(serve, images, batch_size=64):
    """Runs the SavedModel's serving signature over ``images`` in batches."""
    out = [
        serve(images=tf.constant(images[i:i + batch_size]))["embeddings"].numpy()
        for i in range(0, len(images), batch_size)
    ]
    return np.concatenate(out)


def train(model, images, labels, steps, seed):
    """A few steps of 2nd-order triplet NCA (EPHN) on P x K batches: 8 classes x 4 images."""
    rng = np.random.default_rng(seed)
    preprocess = tfdml.models.get_preprocess("resnet18")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=tfdml.losses.TripletNCALoss(order=2))
    x = preprocess(tf.image.resize(tf.cast(images, tf.float32), (32, 32))).numpy()
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
    parser.add_argument("--out", default=None, help="SavedModel directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.time()
    keras.utils.set_random_seed(args.seed)

    images, labels = digit_images()
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(images))
    gallery_idx = order[: args.gallery]
    query_idx = order[args.gallery: args.gallery + args.queries]

    model = tfdml.models.build_embedding_model(
        "resnet18", embedding_dim=32, input_shape=(32, 32, 3), weights=None,
        freeze_batchnorm=True,
    )
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

    idx, sims = top_k_cosine(queries, gallery, args.k)
    neighbour_labels = labels[gallery_idx][idx]
    print(f"gallery {len(gallery)} images, embeddings {gallery.shape[1]}-d, "
          f"{args.steps} training steps")
    for q, (lab, nl, s) in enumerate(zip(labels[query_idx], neighbour_labels, sims, strict=True)):
        shown = ", ".join(f"{n} ({v:.3f})" for n, v in zip(nl, s, strict=True))
        print(f"query {q}: digit {lab} -> top-{args.k} digits (cosine): {shown}")
    precision = float(np.mean(neighbour_labels == labels[query_idx][:, None]))
    print(f"precision@{args.k} over {len(query_idx)} queries: {precision:.2f} "
          f"({time.time() - start:.1f} s)")
    return idx, sims, precision


if __name__ == "__main__":
    main()
