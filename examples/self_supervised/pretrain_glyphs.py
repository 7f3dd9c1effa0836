"""Self-supervised pretraining on glyphs without labels, evaluated on unseen characters.

Pretrains the glyph benchmark's CNN (``examples/glyphs/glyph_recipe.py``: three conv blocks
with batch norm, 64-d output) with ``tfdml.models.ContrastiveModel`` on the 12,000
drawings of the 600 training characters of ``tfdml.datasets.load("glyphs", ...)``, their
labels unused. Then it embeds the 8,000 drawings of the 400 unseen test characters and
reports Recall@1 and MAP@R (cosine, query excluded), next to two baselines on the same
split: the raw pixels and the same network untrained (same seed). No download. The runs
recorded in ``README.md``::

    python examples/self_supervised/pretrain_glyphs.py --algorithms simclr   # 3 seeds
    python examples/self_supervised/pretrain_glyphs.py --algorithms simclr --epochs 4 \
        --seeds 0 --views glyph glyph+stroke glyph-affine glyph-noise simclr crop \
        --output examples/self_supervised/results_glyphs_views.json   # augmentations compared
    python examples/self_supervised/pretrain_glyphs.py --algorithms barlow simsiam \
        --seeds 0 --output examples/self_supervised/results_glyphs_algorithms.json

and the others::

    python examples/self_supervised/pretrain_glyphs.py        # SimCLR, Barlow Twins, SimSiam; 3 seeds
    python examples/self_supervised/pretrain_glyphs.py --smoke     # seconds
    KERAS_BACKEND=jax python examples/self_supervised/pretrain_glyphs.py --smoke

``--views`` picks the augmentations that make the two views (``VIEWS`` below):

* ``glyph`` (the default): views for small grayscale images, made in the training step by
  random Keras layers (``augmenter=``): a small random affine map (rotation, shear, zoom,
  translation), a random contrast and Gaussian noise;
* ``simclr``: ``tfdml.data.numpy_views.simclr_views(28)`` through
  ``tfdml.data.TwoViewDataset``, SimCLR's ImageNet views (random resized crop of 8-100 %
  of the area, horizontal flip, colour jitter, grayscale, blur);
* the others add or remove one augmentation of these two (``VIEWS`` says which);
  ``glyph+stroke`` adds a random stroke width (``RandomStrokeWidth`` below).

Writes ``results_glyphs.json`` next to this script (``--output`` elsewhere; ``--smoke``
writes to ``runs/self_supervised/``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import keras
import numpy as np
from keras import ops

import tfdml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "glyphs"))
import glyph_recipe  # noqa: E402  (examples/glyphs/, put on the path above)

ALGORITHMS = ("simclr", "barlow", "simsiam")
NAMES = {"simclr": "SimCLR", "barlow": "Barlow Twins", "simsiam": "SimSiam", "byol": "BYOL",
         "vicreg": "VICReg", "moco": "MoCo"}
#: The augmentation sets `--views` chooses from, and what each does.
VIEWS = {
    "glyph": "affine map (rotation 10°, shear 0.15, zoom 15 %, shift 10 %), contrast 30 %, "
             "Gaussian noise 0.1 (Keras layers)",
    "glyph+stroke": "glyph, plus a random stroke width (RandomStrokeWidth)",
    "glyph+flip": "glyph, plus a horizontal flip with probability 1/2",
    "glyph-affine": "glyph without the affine map: contrast and noise only",
    "glyph-noise": "glyph without the contrast and the noise: the affine map only",
    "simclr": "simclr_views(28): crop 8-100 %, flip, colour jitter, grayscale, blur (NumPy)",
    "simclr-colour": "simclr_views(28) without the colour jitter and the grayscale",
    "crop": "simclr_views(28, scale=(0.5, 1)) without flip, colour, grayscale and blur: "
            "a mild crop only",
}
PROJECTION = 128   # projector output (SimSiam's predictor maps it to itself)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=sorted(NAMES))
    parser.add_argument("--views", nargs="+", default=["glyph"], choices=list(VIEWS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(glyph_recipe.SEEDS))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--output", default=None,
                        help="the results JSON (default: results_glyphs.json next to this "
                             "script; runs/self_supervised/results_glyphs_smoke.json with "
                             "--smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="one seed, one epoch, 60 training and 40 test characters")
    parser.add_argument("--verbose", type=int, default=2)
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 2 or min(args.seeds) < 0:
        parser.error("--epochs must be >= 1, --batch-size >= 2 and the seeds >= 0")
    return args


# -- augmentations ----------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tfdml_examples")
class RandomStrokeWidth(keras.layers.Layer):
    """Thickens or thins the bright strokes of a dark image by up to one pixel.

    Each image is blended with its 3 x 3 grey dilation (a max filter: wider strokes) or
    erosion (a min filter: thinner strokes) by a random weight in ``[0, factor]``; which of
    the two, at random. Active in training only.
    """

    def __init__(self, factor=1.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(factor)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=True):
        if not training:
            return images
        weight = keras.random.uniform((ops.shape(images)[0], 1, 1, 1), -self.factor,
                                      self.factor, seed=self.seed_generator)
        wider = ops.max_pool(images, 3, strides=1, padding="same")
        thinner = -ops.max_pool(-images, 3, strides=1, padding="same")
        return (images + ops.maximum(weight, 0.0) * (wider - images)
                + ops.maximum(-weight, 0.0) * (thinner - images))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "factor": self.factor, "seed": self.seed}


def glyph_augmenter(affine=True, noise=True, stroke=False, flip=False):
    """The views for small grayscale images: random Keras layers, run in the training step
    (seeded by `keras.utils.set_random_seed`)."""
    fill = {"fill_mode": "constant", "fill_value": 0.0}  # the glyphs' background is black
    layers = [keras.Input((None, None, 1))]
    if flip:
        layers.append(keras.layers.RandomFlip("horizontal"))
    if affine:
        layers += [keras.layers.RandomRotation(10 / 360, **fill),
                   keras.layers.RandomShear(0.15, 0.15, **fill),
                   keras.layers.RandomZoom(0.15, **fill),
                   keras.layers.RandomTranslation(0.1, 0.1, **fill)]
    if stroke:
        layers.append(RandomStrokeWidth(1.0))
    if noise:
        layers += [keras.layers.RandomContrast(0.3, value_range=(0, 1)),
                   keras.layers.GaussianNoise(0.1)]
    return keras.Sequential(layers, name="augmenter")


def numpy_views(name, size):
    """`(view1, view2)` functions of `tfdml.data.numpy_views` for TwoViewDataset."""
    def to_unit(image):  # the augmenters give [0, 255]; the network reads [0, 1]
        return np.asarray(image, np.float32) / np.float32(255)

    if name == "simclr":
        kwargs = {}
    elif name == "simclr-colour":
        kwargs = {"jitter_probability": 0.0, "grayscale_probability": 0.0}
    else:  # "crop"
        kwargs = {"scale": (0.5, 1.0), "flip": False, "jitter_probability": 0.0,
                  "grayscale_probability": 0.0, "blur_probability": 0.0}
    return tfdml.data.numpy_views.simclr_views(size, preprocess=to_unit, **kwargs)


def make_views(name):
    """The augmentation set `name`: a Keras augmenter, or NumPy views for TwoViewDataset."""
    if name.startswith("glyph"):
        return glyph_augmenter(affine=name != "glyph-affine", noise=name != "glyph-noise",
                               stroke=name == "glyph+stroke", flip=name == "glyph+flip")
    return numpy_views(name, 28)


# -- the model ----------------------------------------------------------------------------------


def make_model(algorithm, seed, views="glyph", image_size=28):
    """The benchmark's CNN in a ContrastiveModel, and the NumPy views (or None).

    The CNN is built first after `keras.utils.set_random_seed(seed)`, as `glyph_recipe`
    builds it: its untrained weights are the untrained baseline's of that seed.
    """
    keras.utils.set_random_seed(seed)
    backbone = glyph_recipe.build_cnn(image_size, glyph_recipe.RECIPE["embedding_dim"])
    projector = tfdml.models.build_projector(PROJECTION, hidden_dim=512, num_layers=2)
    predictor = (tfdml.models.build_predictor(PROJECTION, hidden_dim=PROJECTION // 4)
                 if algorithm in ("simsiam", "byol") else None)
    loss = None
    if algorithm == "simclr":  # T = 0.2 suits batches of a few hundred (SimCLR's appendix)
        loss = tfdml.losses.SelfSupervisedLoss(tfdml.losses.NTXentLoss(temperature=0.2))
    elif algorithm == "moco":
        loss = tfdml.losses.MoCoLoss(queue_size=4096, seed=seed)
    augmenter = make_views(views) if views.startswith("glyph") else None
    model = tfdml.models.ContrastiveModel(backbone, projector, predictor, algorithm=algorithm,
                                          loss=loss, augmenter=augmenter)
    return model, None if augmenter is not None else make_views(views)


def evaluate(model, split):
    embeddings = keras.ops.convert_to_numpy(model.predict(split.images, batch_size=1000,
                                                          verbose=0))
    return glyph_recipe.retrieval(embeddings, split.labels)


def run_one(algorithm, views_name, seed, train, test, args):
    model, views = make_model(algorithm, seed, views_name, train.images.shape[1])
    untrained = evaluate(model, test)
    steps = len(train) // args.batch_size
    schedule = keras.optimizers.schedules.CosineDecay(args.learning_rate,
                                                      decay_steps=steps * args.epochs)
    model.compile(optimizer=keras.optimizers.Adam(schedule))
    start = time.perf_counter()
    if views is None:  # the augmenter makes the views in the step
        history = model.fit(train.images, batch_size=args.batch_size, epochs=args.epochs,
                            shuffle=True, verbose=args.verbose)
    else:
        data = tfdml.data.TwoViewDataset(train.images * 255.0, views, args.batch_size,
                                         seed=seed)
        history = model.fit(data, epochs=args.epochs, verbose=args.verbose)
    seconds = time.perf_counter() - start
    pretrained = evaluate(model, test)
    run = {"algorithm": algorithm, "views": views_name, "seed": seed,
           "untrained": untrained, "pretrained": pretrained,
           "final_loss": float(history.history["loss"][-1]),
           "final_output_std": float(history.history["output_std"][-1]),
           "seconds": round(seconds, 1)}
    print(json.dumps(run), flush=True)
    return run


# -- the report ---------------------------------------------------------------------------------


def summarize(runs):
    """`{"algorithm/views": {"untrained": {...}, "pretrained": {...}, ...}}`: mean and sample
    std over the seeds of each metric."""
    summary = {}
    for key in dict.fromkeys(f"{r['algorithm']}/{r['views']}" for r in runs):
        group = [r for r in runs if f"{r['algorithm']}/{r['views']}" == key]
        summary[key] = {
            "algorithm": group[0]["algorithm"], "views": group[0]["views"],
            "seeds": [r["seed"] for r in group],
            "untrained": glyph_recipe.summarize(group, "untrained"),
            "pretrained": glyph_recipe.summarize(group, "pretrained"),
            "seconds": float(np.mean([r["seconds"] for r in group]))}
    return summary


def table(results):
    """The markdown table of the results."""
    cell = glyph_recipe.cell
    raw = results["raw_pixels"]
    lines = ["| embedding | views | Recall@1 | MAP@R |", "|---|---|---:|---:|",
             f"| raw pixels | - | {raw['recall@1']:.3f} | {raw['map@r']:.3f} |"]
    untrained = {}
    for entry in results["summary"].values():
        untrained.setdefault(tuple(entry["seeds"]), entry["untrained"])
    for seeds, numbers in untrained.items():
        lines.append(f"| untrained CNN (seeds {', '.join(map(str, seeds))}) | - | "
                     f"{cell(numbers['recall@1'])} | {cell(numbers['map@r'])} |")
    for entry in results["summary"].values():
        numbers = entry["pretrained"]
        lines.append(f"| {NAMES[entry['algorithm']]} | {entry['views']} | "
                     f"{cell(numbers['recall@1'])} | {cell(numbers['map@r'])} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        args.seeds, args.epochs = args.seeds[:1], 1
        args.batch_size = min(args.batch_size, 64)
    output = pathlib.Path(args.output) if args.output else (
        pathlib.Path("runs/self_supervised/results_glyphs_smoke.json") if args.smoke
        else HERE / "results_glyphs.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    data = {"num_classes": 100, "samples_per_class": 10} if args.smoke else {}
    train, test = glyph_recipe.load_data(**data)
    results = {"machine": glyph_recipe.machine(), "backend": keras.backend.backend(),
               "smoke": args.smoke, "train": {"characters": train.num_classes,
                                               "images": len(train)},
               "test": {"characters": test.num_classes, "images": len(test)},
               "epochs": args.epochs, "batch_size": args.batch_size,
               "learning_rate": args.learning_rate, "optimizer": "Adam, cosine decay to 0",
               "projector": f"build_projector({PROJECTION}, hidden_dim=512, num_layers=2)",
               "views": {name: VIEWS[name] for name in args.views},
               "raw_pixels": glyph_recipe.raw_pixels(test), "runs": []}
    for views_name in args.views:
        for algorithm in args.algorithms:
            for seed in args.seeds:
                results["runs"].append(run_one(algorithm, views_name, seed, train, test, args))
    results["summary"] = summarize(results["runs"])
    results["seconds"] = round(time.perf_counter() - start, 1)
    glyph_recipe.write_json(output, results)
    print(f"\nUnseen characters ({test.num_classes}; cosine, query excluded), mean ± std over "
          f"seeds {', '.join(map(str, args.seeds))}:\n")
    print(table(results))
    print(f"\n{glyph_recipe.machine()}; {results['seconds']:.0f} s in all. Written to {output}.")
    return results


if __name__ == "__main__":
    main()
