"""Self-supervised pretraining on unlabeled digits, evaluated by k-NN on held-out digits.

Pretrains a small convolutional backbone with ``tfdml.models.ContrastiveModel`` (SimSiam,
Barlow Twins, SimCLR...) on scikit-learn's 8 x 8 digits without their labels, and reports
the k-NN accuracy of its embedding (the training images and their labels vote for each
held-out image) against the raw pixels and the same network untrained, for several
seeds. Runs under every Keras backend::

    python examples/self_supervised/pretrain_digits.py                  # all, 3 seeds
    python examples/self_supervised/pretrain_digits.py --algorithms simsiam --seeds 0
    KERAS_BACKEND=jax python examples/self_supervised/pretrain_digits.py --smoke

The two views of each image are made in the training step by random Keras layers
(``--views layer``: translation, zoom, noise), or in NumPy by
``tfdml.data.numpy_views.simclr_views`` through ``tfdml.data.TwoViewDataset``
(``--views numpy``). ``--images-dir`` pretrains on a folder of images instead (any
layout; the digits still evaluate). Writes ``results.json`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import keras
import numpy as np

import tfdml

ALGORITHMS = ("simsiam", "barlow", "simclr")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=sorted(tfdml.models.contrastive_model.ALGORITHMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--views", choices=("layer", "numpy"), default="layer")
    parser.add_argument("--images-dir", default=None,
                        help="pretrain on the images of this folder (resized to 16 x 16 "
                             "grayscale) instead of the digits' training split")
    parser.add_argument("--output-dir", default="runs/self_supervised")
    parser.add_argument("--smoke", action="store_true", help="2 epochs on 256 images")
    parser.add_argument("--verbose", type=int, default=1)
    return parser.parse_args(argv)


def digits(seed=0):
    """Train and held-out digits, ``[N, 16, 16, 1]`` in [0, 1] (upsampled 2 x)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.repeat(np.repeat(data.images / 16.0, 2, axis=1), 2, axis=2)[..., None]
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(0.75 * len(images))
    train, test = order[:cut], order[cut:]
    return ((images[train].astype("float32"), data.target[train]),
            (images[test].astype("float32"), data.target[test]))


def folder_images(path, size=16):
    """The images of a folder (any nesting) as ``[N, size, size, 1]`` grayscale in [0, 1]."""
    from PIL import Image

    files = sorted(p for p in pathlib.Path(path).rglob("*")
                   if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp"))
    if not files:
        raise SystemExit(f"--images-dir {path}: no .png / .jpg / .bmp images found")
    return np.stack([np.asarray(Image.open(f).convert("L").resize((size, size)), "float32")
                     / 255.0 for f in files])[..., None]


def backbone(seed):
    init = keras.initializers.HeNormal
    inputs = keras.Input((16, 16, 1))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu",
                            kernel_initializer=init(seed))(inputs)
    x = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu",
                            kernel_initializer=init(seed + 1))(x)
    x = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu",
                            kernel_initializer=init(seed + 2))(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, x, name="backbone")


def augmenter(seed):
    return keras.Sequential([
        keras.layers.RandomTranslation(0.15, 0.15, fill_mode="constant", seed=seed),
        keras.layers.RandomZoom((-0.2, 0.2), fill_mode="constant", seed=seed + 1),
        keras.layers.GaussianNoise(0.1, seed=seed + 2),
    ], name="augmenter")


def make_model(algorithm, seed, views):
    keras.utils.set_random_seed(seed)
    predictor = (tfdml.models.build_predictor(64, 16)
                 if algorithm in ("simsiam", "byol", "moco") else None)
    loss = tfdml.losses.MoCoLoss(queue_size=1024, seed=seed) if algorithm == "moco" else None
    return tfdml.models.ContrastiveModel(
        backbone(seed), tfdml.models.build_projector(64, hidden_dim=128, num_layers=2),
        predictor, algorithm=algorithm, loss=loss,
        augmenter=augmenter(seed) if views == "layer" else None)


def knn(model, train, test, k):
    gallery = keras.ops.convert_to_numpy(model.predict(train[0], batch_size=256, verbose=0))
    queries = keras.ops.convert_to_numpy(model.predict(test[0], batch_size=256, verbose=0))
    return float(tfdml.metrics.knn_accuracy(queries, test[1], gallery, train[1], k=k))


def knn_raw_pixels(train, test, k):
    """The baseline of no network at all: k-NN on the pixel vectors (cosine)."""
    return float(tfdml.metrics.knn_accuracy(test[0].reshape(len(test[0]), -1), test[1],
                                            train[0].reshape(len(train[0]), -1), train[1],
                                            k=k))


def pretrain(model, images, args, seed):
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    if args.views == "numpy":
        # The views come back in [0, 1], as the images the network is evaluated on.
        views = tfdml.data.numpy_views.simclr_views(16, scale=(0.5, 1.0), flip=False,
                                                    blur_probability=0.0,
                                                    preprocess=lambda view: view / 255.0)
        data = tfdml.data.TwoViewDataset(images * 255.0, views, args.batch_size, seed=seed)
        history = model.fit(data, epochs=args.epochs, verbose=args.verbose)
    else:
        history = model.fit(images, batch_size=args.batch_size, epochs=args.epochs,
                            verbose=args.verbose)
    return history.history


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        args.epochs, args.seeds = 2, args.seeds[:1]
    out = pathlib.Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {"backend": keras.backend.backend(), "smoke": args.smoke, "epochs": args.epochs,
               "k": args.k, "views": args.views, "runs": []}
    for seed in args.seeds:
        train, test = digits(seed)
        images = folder_images(args.images_dir) if args.images_dir else train[0]
        if args.smoke:
            images, train = images[:256], (train[0][:256], train[1][:256])
        raw = knn_raw_pixels(train, test, args.k)
        for algorithm in args.algorithms:
            model = make_model(algorithm, seed, args.views)
            before = knn(model, train, test, args.k)
            start = time.time()
            history = pretrain(model, images, args, seed)
            after = knn(model, train, test, args.k)
            run = {"algorithm": algorithm, "seed": seed, "knn_raw_pixels": raw,
                   "knn_untrained": before,
                   "knn_pretrained": after, "final_loss": history["loss"][-1],
                   "final_output_std": history["output_std"][-1],
                   "seconds": round(time.time() - start, 1)}
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
    summary = {}
    for algorithm in args.algorithms:
        runs = [r for r in results["runs"] if r["algorithm"] == algorithm]
        summary[algorithm] = {key: [float(np.mean([r[key] for r in runs])),
                                    float(np.std([r[key] for r in runs]))]
                              for key in ("knn_raw_pixels", "knn_untrained",
                                          "knn_pretrained")}
    results["summary"] = summary
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, path)  # whole or absent
    print(json.dumps(summary))
    return results


if __name__ == "__main__":
    main()
