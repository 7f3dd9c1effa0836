"""Demo of the API on scikit-learn's digits: EPHN triplet learning, next to raw pixels.

Trains a 16-d embedding of the 8x8 digit images on the digits 0-5 with the
2nd-order triplet NCA loss and EPHN mining, then measures Recall@1/2/4/8 on
the held-out digits 6-9 (classes never seen in training) for three embeddings
of the same test images: the raw 64 pixel values, the network before training
and the network after training.

**Raw pixels beat the trained embedding here** (Recall@1 99.4 against 97.2 with
the defaults under TensorFlow): these digits are too easy, and six training
classes too few, for training to beat the pixels themselves. Training only wins
back part of what the untrained 16-d projection loses (95.1). This script shows the API (the
loss, the miner, the P x K batches, the metric); it is not evidence that
training helps. For that, see the glyph benchmark: `examples/glyphs/demo.py`
(`make demo`) and `docs/glyphs.md`, where the trained network beats both the
raw pixels and the untrained network on unseen characters.

The default network is a single linear layer; `--model cnn` trains a small
CNN, which loses held-out recall on this data set (it fits the six training
classes).

Runs offline (the digits ship with scikit-learn) in well under a minute on 2
CPU cores:

    python examples/digits_demo.py
    python examples/digits_demo.py --epochs 20 --order 2
"""

from __future__ import annotations

import argparse
import time

import keras

import tfdml

# XLA under TensorFlow and JAX. On PyTorch, jit_compile=True runs torch.compile, whose
# compilation costs more than this small model's training (benchmarks/torch_compile.py):
# run eagerly there.
JIT_COMPILE = keras.backend.backend() != "torch"


def build_model(kind, embedding_dim):
    if kind == "linear":
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(embedding_dim),
        ], name="digits_embedding")
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(embedding_dim),
    ], name="digits_embedding")


def add_training_options(parser):
    """The options of the digits examples' training: epochs, P x K batches, embedding size,
    learning rate and seed (checked by :func:`check_sizes`)."""
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps-per-epoch", type=int, default=40)
    parser.add_argument("--classes-per-batch", type=int, default=6)
    parser.add_argument("--samples-per-class", type=int, default=8)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)


def check_sizes(parser, args):
    """Sizes and the learning rate must be positive (an argparse error otherwise)."""
    for name in ("epochs", "steps_per_epoch", "classes_per_batch", "samples_per_class",
                 "embedding_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")


def report(title, recalls):
    cells = "  ".join(f"R@{k} {100 * v:5.1f}" for k, v in recalls.items())
    print(f"{title:<16} {cells}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("linear", "cnn"), default="linear")
    add_training_options(parser)
    parser.add_argument("--order", type=int, default=2, choices=(1, 2))
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    check_sizes(parser, args)

    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    train = tfdml.datasets.load("digits", "train", dtype="float32")  # digits 0-5
    test = tfdml.datasets.load("digits", "test", dtype="float32")    # digits 6-9
    x_test, y_test = test.images, test.labels
    print(f"tfdml {tfdml.__version__}: digits 0-5 for training ({len(train)} images), "
          f"held-out digits 6-9 for testing ({len(test)} images)")

    ks = (1, 2, 4, 8)
    # The baseline of no learning at all: cosine on the 64 pixel values.
    raw = tfdml.metrics.recall_at_k(x_test.reshape(len(x_test), -1), y_test, ks=ks)
    model = build_model(args.model, args.embedding_dim)
    before = tfdml.metrics.recall_at_k(model.predict(x_test, verbose=0), y_test, ks=ks)

    loss = tfdml.losses.TripletNCALoss(
        order=args.order,
        temperature=args.temperature,
        miner=tfdml.miners.TripletMiner("easy", "hard"),
    )
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss=loss,
                  jit_compile=JIT_COMPILE)
    dataset = tfdml.data.PKDataset(train, args.classes_per_batch, args.samples_per_class,
                                   seed=args.seed)
    print(f"Training a {args.model} {args.embedding_dim}-d embedding: TripletNCALoss(order={args.order}, temperature={args.temperature}) "
          f"with EPHN mining, batches of {args.classes_per_batch} classes x "
          f"{args.samples_per_class} images, {args.epochs} epochs x "
          f"{args.steps_per_epoch} steps")
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, shuffle=False,
              verbose=2)

    after = tfdml.metrics.recall_at_k(model.predict(x_test, verbose=0), y_test, ks=ks)
    print("\nRecall@K on the held-out digits 6-9 (cosine, query excluded):")
    report("raw pixels", raw)
    report("before training", before)
    report("after training", after)
    print(f"Recall@1 {100 * before[1]:.1f} -> {100 * after[1]:.1f}; raw pixels "
          f"{100 * raw[1]:.1f} ({time.perf_counter() - start:.0f} s)")
    if raw[1] >= after[1]:
        print("The raw pixels retrieve the unseen digits at least as well as the trained "
              "embedding: this script shows the API, not that training helps (see "
              "examples/glyphs/demo.py).")
    return raw, before, after


if __name__ == "__main__":
    main()
