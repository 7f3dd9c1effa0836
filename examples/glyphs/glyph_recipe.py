"""The glyph benchmark's one recipe, shared by the demo, the papers' comparisons and the loss table.

One data set (`tfdml.datasets.load("glyphs", ...)`: 600 training characters, 400 unseen test
characters, 20 drawings each, 28 x 28), one network (a three-block CNN with batch norm, 64-d
output), one sampler (P x K = 16 x 4, `tfdml.data.PKDataset`), one optimizer (Adam 1e-3),
one step budget (1,000 steps), and the same two numbers on the unseen characters for every
run: Recall@1 and MAP@R (cosine, query excluded). Every trained number is reported next to
its baselines on the same split: the raw pixels and the untrained network of the same seed.

Seeds vary the training (the network's initial weights, the batches, a loss's random state);
the data set is the same for every seed (`data_seed=0`).

Scripts import this file from `examples/glyphs/` (the folder is put on `sys.path` by the
scripts elsewhere):

    run = glyph_recipe.train_and_evaluate(lambda: tfdml.losses.MultiSimilarityLoss(), seed=0)
    run["trained"]["recall@1"], run["untrained"]["recall@1"]
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import time

import keras
import numpy as np

import tfdml

#: The data set of the benchmark (the defaults of `tfdml.datasets.load("glyphs", ...)`).
DATA = {"num_classes": 1000, "samples_per_class": 20, "image_size": 28, "difficulty": 1.0}
#: The training recipe every comparison shares.
RECIPE = {"embedding_dim": 64, "classes_per_batch": 16, "samples_per_class": 4,
          "learning_rate": 1e-3, "steps": 1000}
SEEDS = (0, 1, 2)
STEPS_PER_EPOCH = 100  # an epoch is 100 batches (a progress line each with verbose=2)

# XLA under TensorFlow and JAX. Under PyTorch, `jit_compile=True` means torch.compile, whose
# compilation costs more than this small model's training: eager there.
JIT_COMPILE = keras.backend.backend() != "torch"


def load_data(data_seed=0, **data):
    """`(train, test)` glyph splits, float32 images in [0, 1]."""
    knobs = {**DATA, **data}
    train = tfdml.datasets.load("glyphs", "train", seed=data_seed, dtype="float32", **knobs)
    test = tfdml.datasets.load("glyphs", "test", seed=data_seed, dtype="float32", **knobs)
    return train, test


def build_cnn(image_size=28, embedding_dim=64, name="glyph_cnn"):
    """Three blocks of conv 3x3 -> batch norm -> ReLU -> max-pool (32, 64, 128 channels),
    flatten, a linear `embedding_dim` output (the losses normalize it where they use cosine
    similarity; evaluation uses cosine). 167k weights at 28 x 28."""
    layers = [keras.Input((image_size, image_size, 1))]
    for filters in (32, 64, 128):
        layers += [keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(),
                   keras.layers.ReLU(),
                   keras.layers.MaxPooling2D(2)]
    layers += [keras.layers.Flatten(), keras.layers.Dense(embedding_dim)]
    return keras.Sequential(layers, name=name)


def retrieval(embeddings, labels):
    """`{"recall@1": ..., "map@r": ...}` of every item against all the others (cosine)."""
    embeddings = np.asarray(embeddings, np.float32).reshape(len(labels), -1)
    return {"recall@1": float(tfdml.metrics.recall_at_k(embeddings, labels, ks=(1,))[1]),
            "map@r": float(tfdml.metrics.map_at_r(embeddings, labels))}


def mean_cosine(embeddings):
    """The mean cosine similarity between distinct embeddings: 1 when all coincide (the
    whole embedding collapsed to one point)."""
    z = np.asarray(embeddings, np.float64)
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    n = len(z)
    total = np.linalg.norm(z.sum(axis=0)) ** 2  # sum over all ordered pairs, self included
    return float((total - n) / (n * (n - 1)))


def raw_pixels(split):
    """The baseline of no learning at all: cosine on the pixel vectors."""
    return retrieval(split.images.reshape(len(split), -1), split.labels)


def embed(model, split, batch_size=1000):
    return model.predict(split.images, batch_size=batch_size, verbose=0)


def train_and_evaluate(make_loss, seed=0, data=None, steps=None, classes_per_batch=None,
                       samples_per_class=None, learning_rate=None, embedding_dim=None,
                       model_fn=None, measure=None, verbose=0, log=print):
    """Trains one network with one loss under the recipe and evaluates it on the unseen classes.

    Args:
        make_loss: `(num_classes, embedding_dim) -> loss`, or a callable taking no
            argument, building a fresh tfdml loss (called after the seed is set).
        seed: the training seed (weights, batches, the loss's random state).
        data: `(train, test)` from `load_data()`, loaded once by the caller; loaded here if
            None.
        steps, classes_per_batch, samples_per_class, learning_rate, embedding_dim: override
            `RECIPE`.
        model_fn: `(image_size, embedding_dim) -> keras.Model`; `build_cnn` by default.
        measure: `(network) -> value`, taken of the network before and after training
            (for numbers beyond Recall@1 and MAP@R), or None.
        verbose: Keras' `fit` verbosity (`2`: a line per 100 steps).
        log: where progress lines go (`print`), or None.

    Returns:
        `{"untrained": {...}, "trained": {...}, "seconds": training wall time,
        "steps": ...}` with Recall@1 and MAP@R on the test split; with `measure`, also
        `"measured": {"untrained": value, "trained": value}`.
    """
    recipe = dict(RECIPE)
    for key, value in (("steps", steps), ("classes_per_batch", classes_per_batch),
                       ("samples_per_class", samples_per_class),
                       ("learning_rate", learning_rate), ("embedding_dim", embedding_dim)):
        if value is not None:
            recipe[key] = value
    train, test = data if data is not None else load_data()
    keras.utils.set_random_seed(seed)
    embedder = (model_fn or build_cnn)(train.images.shape[1], recipe["embedding_dim"])
    untrained = retrieval(embed(embedder, test), test.labels)
    measured = {} if measure is None else {"untrained": measure(embedder)}
    if inspect.signature(make_loss).parameters:
        loss = make_loss(int(train.labels.max()) + 1, recipe["embedding_dim"])
    else:
        loss = make_loss()
    model = tfdml.models.MetricModel(embedder, loss)
    model.compile(optimizer=keras.optimizers.Adam(recipe["learning_rate"]),
                  jit_compile=JIT_COMPILE)
    batches = tfdml.data.PKDataset(train, recipe["classes_per_batch"],
                                   recipe["samples_per_class"], seed=seed)
    steps_per_epoch = min(STEPS_PER_EPOCH, recipe["steps"])
    if recipe["steps"] % steps_per_epoch:
        raise ValueError(f"`steps` must be a multiple of {steps_per_epoch}. "
                         f"Received: steps={recipe['steps']}")
    start = time.perf_counter()
    history = model.fit(batches, epochs=recipe["steps"] // steps_per_epoch,
                        steps_per_epoch=steps_per_epoch, shuffle=False, verbose=verbose)
    seconds = time.perf_counter() - start
    trained = retrieval(embed(embedder, test), test.labels)
    if measure is not None:
        measured["trained"] = measure(embedder)
    final_loss = float(history.history["loss"][-1])
    if log is not None:
        log(f"  seed {seed}: untrained R@1 {untrained['recall@1']:.3f}, trained R@1 "
            f"{trained['recall@1']:.3f} MAP@R {trained['map@r']:.3f} "
            f"(loss {final_loss:.4g}, {seconds:.0f} s)")
    return {"untrained": untrained, "trained": trained, "seconds": seconds,
            "final_loss": final_loss, "seed": seed, **recipe,
            **({"measured": measured} if measure is not None else {})}


def mean_std(values):
    """`(mean, sample std)` of a list of numbers (std 0 for one value)."""
    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def summarize(runs, key):
    """`{"recall@1": (mean, std), "map@r": (mean, std)}` of `run[key]` over runs."""
    return {metric: mean_std([run[key][metric] for run in runs])
            for metric in ("recall@1", "map@r")}


def cell(mean_and_std, digits=3):
    mean, std = mean_and_std
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def machine():
    """A line saying where the numbers were measured."""
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"Keras {keras.__version__} ({keras.backend.backend()}), tfdml {tfdml.__version__}")


def write_json(path, obj):
    """Writes results to `path`, whole or not at all (a temporary file renamed over it)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
