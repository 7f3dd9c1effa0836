"""ManifoldLoss on scikit-learn's digits: random proxies against proxies started in the data.

The protocol of `examples/digits_losses.py`: a 16-d linear embedding of the 8x8
digit images, trained on the digits 0-5 with `tfdml.data.PKDataset` batches
(6 classes x 8 images, 10 epochs x 40 steps, Adam 1e-3) through
`tfdml.models.MetricModel`, evaluated on the held-out digits 6-9 (Recall@1,
cosine, query excluded). `ManifoldLoss(l=16, k=6)` has one proxy per training
digit: the meta class of an image (`y_true`) is its digit. Two starts of the proxies:

* `random`: the loss's own initializer (normal, so random directions);
* `class-means`: before training, proxy `c` is set to the mean of the unit
  embeddings of the training images of digit `c` under the untrained network.

For each run it prints the loss and its two terms (intrinsic, `lambda_c=0`; context,
`lambda_c=inf`) averaged over 40 fixed training batches (`--eval-batches`) before and after training,
the last epoch's mean training loss, and the fraction of (image, proxy) pairs of those
batches whose cosine is positive: the random walk's edge weight is `exp(2 max(cos, 0))`,
so a pair at a cosine <= 0 weighs 1 whatever its cosine and passes no gradient. When no
proxy is closer to an image than the others, each term is `log(1 + (k-1) e^margin)`
(about `ln k`). It also prints the Recall@1 of the raw 64 pixel values (cosine, no learning
at all) on the same test images: on these digits it is above every run, untrained or trained,
so the Recall@1 here tells the proxy starts apart, not whether training helps (the glyph
benchmark, `examples/glyphs/demo.py`, measures that).

Runs offline in under a minute on 2 CPU cores:

    python examples/digits_manifold.py
    python examples/digits_manifold.py --proxies random --lambda-c 0
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

import keras
import numpy as np

import tfdml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_demo import (  # noqa: E402  (the demo's)
    JIT_COMPILE,
    add_training_options,
    build_model,
    check_sizes,
)

STARTS = ("random", "class-means")


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def class_mean_proxies(embedder, train, num_classes):
    """``[k, l]``: the mean unit embedding of each training class."""
    embeddings = unit(embedder.predict(train.images, verbose=0))
    return np.stack([embeddings[train.labels == c].mean(axis=0) for c in range(num_classes)])


def loss_terms(loss, embedder, batches):
    """The loss, its intrinsic and context terms, and the fraction of positive (image, proxy)
    cosines, averaged over ``batches``."""
    proxies = keras.ops.convert_to_numpy(loss.class_vectors)
    rows = []
    for x, y in batches:
        embeddings = embedder.predict_on_batch(x)
        terms = [float(keras.ops.convert_to_numpy(tfdml.losses.manifold_loss(
            y, embeddings, proxies, loss.l, loss.k, lambda_c=lambda_c, alpha=loss.alpha,
            margin=loss.margin))) for lambda_c in (0.0, math.inf)]
        positive = float(np.mean(unit(np.asarray(embeddings)) @ unit(proxies).T > 0))
        if math.isinf(loss.lambda_c):
            total = terms[1]
        else:
            total = terms[0] + (loss.lambda_c * terms[1] if loss.lambda_c else 0.0)
        rows.append([total, *terms, positive])
    return dict(zip(("loss", "intrinsic", "context", "positive"), np.mean(rows, axis=0),
                    strict=True))


def recall_at_1(embedder, test):
    recalls = tfdml.metrics.recall_at_k(embedder.predict(test.images, verbose=0), test.labels,
                                        ks=(1,))
    return float(recalls[1])


def describe(terms):
    return (f"loss {terms['loss']:.4f} (intrinsic {terms['intrinsic']:.4f}, context "
            f"{terms['context']:.4f}), cos(image, proxy) > 0 for {100 * terms['positive']:.0f}%")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", nargs="+", choices=STARTS, default=list(STARTS))
    parser.add_argument("--lambda-c", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--margin", type=float, default=5e-4)
    add_training_options(parser)
    parser.add_argument("--jit-compile", action=argparse.BooleanOptionalAction,
                        default=JIT_COMPILE, help="compile the training step (XLA / jax.jit)")
    parser.add_argument("--eval-batches", type=int, default=40,
                        help="fixed training batches the loss and its terms are averaged over")
    args = parser.parse_args(argv)
    check_sizes(parser, args)
    if args.eval_batches < 1:
        parser.error(f"--eval-batches must be >= 1, got {args.eval_batches}")

    start = time.perf_counter()
    train = tfdml.datasets.load("digits", "train", dtype="float32")  # digits 0-5
    test = tfdml.datasets.load("digits", "test", dtype="float32")    # digits 6-9
    class_ids, train_ids = np.unique(train.labels, return_inverse=True)
    train = dataclasses.replace(train, labels=train_ids)
    k = len(class_ids)
    evaluation = tfdml.data.PKDataset(train, args.classes_per_batch, args.samples_per_class,
                                      seed=args.seed + 1)
    batches = [evaluation[i] for i in range(args.eval_batches)]
    print(f"tfdml {tfdml.__version__}: ManifoldLoss(l={args.embedding_dim}, k={k}, "
          f"lambda_c={args.lambda_c:g}, alpha={args.alpha:g}, margin={args.margin:g}) on the "
          f"digits 0-5, Recall@1 on the held-out digits 6-9; {args.epochs} epochs x "
          f"{args.steps_per_epoch} steps, Adam {args.learning_rate:g}, seed {args.seed}; "
          f"ln k = {math.log(k):.4f}", flush=True)
    raw = float(tfdml.metrics.recall_at_k(test.images.reshape(len(test), -1), test.labels,
                                          ks=(1,))[1])
    print(f"Recall@1 of the raw pixels (cosine on the 64 values, no learning): "
          f"{100 * raw:.1f}", flush=True)

    results = {}
    for name in args.proxies:
        keras.utils.set_random_seed(args.seed)  # the same network and proxies for each start
        embedder = build_model("linear", args.embedding_dim)
        loss = tfdml.losses.ManifoldLoss(args.embedding_dim, k, lambda_c=args.lambda_c,
                                         alpha=args.alpha, margin=args.margin)
        loss.build_state(args.embedding_dim)
        if name == "class-means":
            loss.class_vectors.assign(class_mean_proxies(embedder, train, k))
        model = tfdml.models.MetricModel(embedder, loss)
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      jit_compile=args.jit_compile)
        before = loss_terms(loss, embedder, batches) | {"R@1": recall_at_1(embedder, test)}
        dataset = tfdml.data.PKDataset(train, args.classes_per_batch, args.samples_per_class,
                                       seed=args.seed)
        history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                            shuffle=False, verbose=0)
        after = loss_terms(loss, embedder, batches) | {"R@1": recall_at_1(embedder, test)}
        losses = history.history["loss"]
        results[name] = {"before": before, "after": after, "epoch_losses": losses}
        print(f"\n{name} proxies:\n  before: {describe(before)}\n  after:  {describe(after)}\n"
              f"  training loss by epoch: {' '.join(f'{v:.3f}' for v in losses)}\n"
              f"  Recall@1 {100 * before['R@1']:.1f} -> {100 * after['R@1']:.1f} (raw pixels "
              f"{100 * raw:.1f})", flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s in all)")
    return results


if __name__ == "__main__":
    main()
