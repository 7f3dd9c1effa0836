"""A loss table on the glyphs benchmark, tfdml next to pytorch-metric-learning 2.9.

In the spirit of Musgrave et al., "A Metric Learning Reality Check" (2020): every loss
trains the same network with the same sampler, optimizer and step budget (the recipe of
`examples/glyphs/glyph_recipe.py`: the three-block CNN, P x K = 16 x 4 batches from
`tfdml.data.PKDataset`, Adam 1e-3 for the network and the loss's own vectors, 1,000 steps),
and is scored by Recall@1 and MAP@R (cosine) on the 400 characters never seen in training,
over seeds 0, 1, 2 (mean ± sample std), next to the raw pixels and the untrained network.

Each loss uses the hyperparameters of pytorch-metric-learning 2.9's defaults, in both
libraries (`PARAMS`; tfdml's equivalents from docs/losses.md, "Coming from
pytorch-metric-learning"). `benchmarks/glyph_losses_pml.py` trains the same losses with
pytorch-metric-learning, in PyTorch, on the same arrays: `--export PATH` writes what it
needs into one `.npz` (the images and labels, for each seed the P x K batch indices that
`PKDataset` draws and the Keras CNN's initial weights, the initial class vectors of each
loss that has them, the untrained network's test embeddings and each loss's value on the
first batch with, under TensorFlow, its gradient with respect to the embeddings), so both
libraries start from the same weights and see the same batches.

    python benchmarks/glyph_losses.py --export /tmp/glyph_losses.npz    # about 50 min on 2 cores
    /tmp/pml_env/bin/python benchmarks/glyph_losses_pml.py --data /tmp/glyph_losses.npz
    python benchmarks/glyph_losses.py --report       # the side-by-side table from both JSON files

Results: `benchmarks/results/glyph_losses_tfdml.json` (this script),
`benchmarks/results/glyph_losses_pml.json` (the PyTorch script) and the side-by-side
`benchmarks/results/glyph_losses.md`, written between two marker lines so that the text
around them stays. Each run is written as soon as it ends; runs of other losses and seeds
with the same recipe are kept, so `--losses` can add to or redo part of the table.

`--smoke` checks that everything runs in about a minute: a small glyph set (100
characters, 60 to train on), 20 steps, seed 0, two losses, no results file unless
`--output` names one.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdml  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "glyphs"))
import glyph_recipe as recipe  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
OUTPUT = RESULTS / "glyph_losses_tfdml.json"
PML_OUTPUT = RESULTS / "glyph_losses_pml.json"
PML_OWN_INIT_OUTPUT = RESULTS / "glyph_losses_pml_own_init.json"
MARKDOWN = RESULTS / "glyph_losses.md"
MARK_BEGIN = "<!-- glyph_losses.py --report: generated from here -->"
MARK_END = "<!-- glyph_losses.py --report: generated up to here -->"

#: The hyperparameters of each loss, in both libraries: pytorch-metric-learning 2.9's
#: defaults (the miners' too). `glyph_losses_pml.py` holds the same table and checks it
#: against the copy in the exported `.npz`.
PARAMS = {
    "contrastive": {"pos_margin": 0.0, "neg_margin": 1.0},
    "triplet_semihard": {"margin": 0.2, "miner_margin": 0.2},
    "multi_similarity": {"alpha": 2.0, "beta": 50.0, "base": 0.5, "epsilon": 0.1},
    "circle": {"m": 0.4, "gamma": 80.0},
    "supcon": {"temperature": 0.1},
    "nca": {"softmax_scale": 1.0},
    "proxy_nca": {"softmax_scale": 1.0},
    "proxy_anchor": {"margin": 0.1, "alpha": 32.0},
    "arcface": {"margin_degrees": 28.6, "scale": 64.0},
    "cosface": {"margin": 0.35, "scale": 64.0},
    "soft_triple": {"centers_per_class": 10, "la": 20.0, "gamma": 0.1, "margin": 0.01},
    "fast_ap": {"num_bins": 10},
}


def _contrastive(p, num_classes):
    # pml averages the positive and the negative pairs separately, each over its non-zero
    # terms, and adds the two means: average="halves". Euclidean distance of unit vectors.
    return tfdml.losses.ContrastiveLoss(p["pos_margin"], p["neg_margin"], distance="l2",
                                        miner=tfdml.miners.AllPairsMiner(), average="halves")


def _triplet(p, num_classes):
    # pml's TripletMarginLoss (Euclidean distance, the mean over the non-zero triplets) on
    # the triplets of its TripletMarginMiner(type_of_triplets="semihard").
    miner = tfdml.miners.TripletMarginMiner(p["miner_margin"], "semihard")
    return tfdml.losses.TripletMarginLoss(p["margin"], distance="l2", miner=miner,
                                          average="nonzero")


def _multi_similarity(p, num_classes):
    miner = tfdml.miners.MultiSimilarityMiner(epsilon=p["epsilon"])
    return tfdml.losses.MultiSimilarityLoss(p["alpha"], p["beta"], p["base"], miner=miner)


#: name -> (label, builds the tfdml loss from `PARAMS[name]` and the number of classes,
#: how it is written, whether it has class vectors)
LOSSES = {
    "contrastive": ("Contrastive", _contrastive,
                    "ContrastiveLoss(0.0, 1.0, distance='l2', average='halves')", False),
    "triplet_semihard": ("Triplet, semi-hard", _triplet,
                         "TripletMarginLoss(0.2, distance='l2', average='nonzero', "
                         "miner=TripletMarginMiner(0.2, 'semihard'))", False),
    "multi_similarity": ("Multi-similarity + miner", _multi_similarity,
                         "MultiSimilarityLoss(2, 50, 0.5, "
                         "miner=MultiSimilarityMiner(epsilon=0.1))", False),
    "circle": ("Circle", lambda p, c: tfdml.losses.CircleLoss(margin=p["m"], gamma=p["gamma"]),
               "CircleLoss(margin=0.4, gamma=80)", False),
    "supcon": ("SupCon", lambda p, c: tfdml.losses.SupConLoss(temperature=p["temperature"]),
               "SupConLoss(temperature=0.1)", False),
    "nca": ("NCA", lambda p, c: tfdml.losses.SoftNearestNeighborLoss(
        temperature=1.0 / p["softmax_scale"], distance="squared_l2", normalize=True),
            "SoftNearestNeighborLoss(temperature=1, distance='squared_l2', normalize=True)",
            False),
    "proxy_nca": ("Proxy-NCA", lambda p, c: tfdml.losses.ProxyNCALoss(
        c, scale=p["softmax_scale"]), "ProxyNCALoss(C, scale=1)", True),
    "proxy_anchor": ("Proxy-Anchor", lambda p, c: tfdml.losses.ProxyAnchorLoss(
        c, margin=p["margin"], alpha=p["alpha"]), "ProxyAnchorLoss(C, margin=0.1, alpha=32)",
                     True),
    "arcface": ("ArcFace", lambda p, c: tfdml.losses.ArcFaceLoss(
        c, margin=math.radians(p["margin_degrees"]), scale=p["scale"]),
                "ArcFaceLoss(C, margin=radians(28.6), scale=64)", True),
    "cosface": ("CosFace", lambda p, c: tfdml.losses.CosFaceLoss(
        c, margin=p["margin"], scale=p["scale"]), "CosFaceLoss(C, margin=0.35, scale=64)",
                True),
    "soft_triple": ("SoftTriple", lambda p, c: tfdml.losses.SoftTripleLoss(
        c, centers_per_class=p["centers_per_class"], la=p["la"], gamma=p["gamma"],
        margin=p["margin"]), "SoftTripleLoss(C, centers_per_class=10, la=20, gamma=0.1, "
                             "margin=0.01)", True),
    "fast_ap": ("FastAP", lambda p, c: tfdml.losses.FastAPLoss(num_bins=p["num_bins"]),
                "FastAPLoss(num_bins=10)", False),
}

#: pytorch-metric-learning's side, for the table (`glyph_losses_pml.py` builds them).
PML_WRITTEN = {
    "contrastive": "ContrastiveLoss(pos_margin=0, neg_margin=1)",
    "triplet_semihard": "TripletMarginLoss(margin=0.2) + "
                        "TripletMarginMiner(margin=0.2, type_of_triplets='semihard')",
    "multi_similarity": "MultiSimilarityLoss(alpha=2, beta=50, base=0.5) + "
                        "MultiSimilarityMiner(epsilon=0.1)",
    "circle": "CircleLoss(m=0.4, gamma=80)",
    "supcon": "SupConLoss(temperature=0.1)",
    "nca": "NCALoss(softmax_scale=1)",
    "proxy_nca": "ProxyNCALoss(C, D, softmax_scale=1)",
    "proxy_anchor": "ProxyAnchorLoss(C, D, margin=0.1, alpha=32)",
    "arcface": "ArcFaceLoss(C, D, margin=28.6, scale=64)",
    "cosface": "CosFaceLoss(C, D, margin=0.35, scale=64)",
    "soft_triple": "SoftTripleLoss(C, D, centers_per_class=10, la=20, gamma=0.1, margin=0.01)",
    "fast_ap": "FastAPLoss(num_bins=10)",
}

#: How pml 2.9 draws the class vectors by default (`glyph_losses_pml.py --own-init`).
PML_INIT = {
    "proxy_nca": "normal, std 1",
    "proxy_anchor": "kaiming_normal_(mode='fan_out'): std sqrt(2/C)",
    "arcface": "normal, std 1",
    "cosface": "normal, std 1",
    "soft_triple": "kaiming_uniform_(a=sqrt(5)) of [D, C k]: bound 1/sqrt(C k)",
}

SMOKE_DATA = {"num_classes": 100}
SMOKE_STEPS = 20
SMOKE_LOSSES = ("contrastive", "arcface")


def fingerprint(arrays):
    """A short hash of arrays' values and shapes (the same weights give the same string)."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(np.asarray(array))
        digest.update(str((array.shape, array.dtype.str)).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def build_loss(name, num_classes, embedding_dim):
    """The tfdml loss `name` with its state (class vectors) built, as `MetricModel` would."""
    loss = LOSSES[name][1](PARAMS[name], num_classes)
    if LOSSES[name][3]:
        loss.build_state(embedding_dim)
    return loss


def class_vectors(loss):
    return keras.ops.convert_to_numpy(loss.class_vectors)


def train_one(name, seed, data, steps, captured):
    """One training run through `glyph_recipe.train_and_evaluate`; `captured` receives the
    fingerprints of the initial network and class vectors that the run started from."""

    def model_fn(image_size, embedding_dim):
        model = recipe.build_cnn(image_size, embedding_dim)
        captured["cnn"] = fingerprint(model.get_weights())
        return model

    def make_loss(num_classes, embedding_dim):
        loss = build_loss(name, num_classes, embedding_dim)
        if LOSSES[name][3]:
            captured["vectors"] = fingerprint([class_vectors(loss)])
        return loss

    return recipe.train_and_evaluate(make_loss, seed=seed, data=data, steps=steps,
                                     model_fn=model_fn)


def pk_indices(train, seed, steps):
    """The `[steps, P*K]` indices of the batches that the recipe's `PKDataset` gives `fit`,
    in order (its stream starts at sampler epoch 0)."""
    dataset = tfdml.data.PKDataset(train, recipe.RECIPE["classes_per_batch"],
                                   recipe.RECIPE["samples_per_class"], seed=seed)
    stream = dataset.sampler.iter_batches(0)
    return np.stack([next(stream)[0] for _ in range(steps)]).astype(np.int32)


def initial_state(seed, names, train, test, steps):
    """What the PyTorch side needs of seed `seed`: the batches, the network's initial
    weights and untrained test embeddings, each loss's initial class vectors and its value
    on the first batch. The random draws are made in the order of `train_and_evaluate`
    (seed, network, loss), so they are the ones the training runs start from."""
    dim = recipe.RECIPE["embedding_dim"]
    num_classes = int(train.labels.max()) + 1
    batches = pk_indices(train, seed, steps)
    keras.utils.set_random_seed(seed)
    embedder = recipe.build_cnn(train.images.shape[1], dim)
    weights = embedder.get_weights()
    state = {"batches": batches, "weights": weights,
             "weight_names": [w.path for w in embedder.weights],
             "untrained": recipe.embed(embedder, test).astype(np.float32),
             "fingerprints": {"cnn": fingerprint(weights)}, "vectors": {}, "first_loss": {},
             "first_grad": {}}
    first = batches[0]
    # A training step's forward pass: batch statistics in the batch norms (this call also
    # moves their moving averages, which is why `weights` were copied before).
    first_embeddings = embedder(train.images[first], training=True)
    for name in names:
        keras.utils.set_random_seed(seed)
        recipe.build_cnn(train.images.shape[1], dim)  # the same draws as the network's
        loss = build_loss(name, num_classes, dim)
        if LOSSES[name][3]:
            vectors = class_vectors(loss)
            state["vectors"][name] = vectors
            state["fingerprints"][name] = fingerprint([vectors])
        value, gradient = value_and_gradient(loss, train.labels[first], first_embeddings)
        state["first_loss"][name] = value
        if gradient is not None:
            state["first_grad"][name] = gradient
    return state


def value_and_gradient(loss, labels, embeddings):
    """The loss's value on a batch and (under TensorFlow) its gradient with respect to the
    embeddings; the gradient is None under the other backends."""
    if keras.backend.backend() != "tensorflow":
        value = loss(labels, embeddings)
        return float(keras.ops.convert_to_numpy(value)), None
    import tensorflow as tf

    x = tf.convert_to_tensor(embeddings)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(labels, x)
    return float(value.numpy()), tape.gradient(value, x).numpy().astype(np.float32)


def export(path, names, seeds, train, test, steps, data_knobs, raw):
    """Writes the `.npz` that `glyph_losses_pml.py` trains from; returns the fingerprints
    `{seed: {"cnn": ..., loss name: ...}}` of what it wrote."""
    arrays = {
        # uint8 pixels (the data set's own values); float32 = uint8 / 255, as tfdml loads them
        "train_images": np.round(train.images[..., 0] * 255.0).astype(np.uint8),
        "train_labels": train.labels.astype(np.int64),
        "test_images": np.round(test.images[..., 0] * 255.0).astype(np.uint8),
        "test_labels": test.labels.astype(np.int64),
    }
    for key in ("train", "test"):
        restored = arrays[f"{key}_images"].astype(np.float32) / 255.0
        if not np.array_equal(restored, (train if key == "train" else test).images[..., 0]):
            raise AssertionError(f"the {key} images are not uint8 / 255")
    fingerprints, first_loss, weight_names = {}, {}, None
    for seed in seeds:
        state = initial_state(seed, names, train, test, steps)
        weight_names = state["weight_names"]
        arrays[f"seed{seed}/batches"] = state["batches"]
        arrays[f"seed{seed}/untrained"] = state["untrained"]
        for i, w in enumerate(state["weights"]):
            arrays[f"seed{seed}/cnn/{i}"] = np.asarray(w, np.float32)
        for name, vectors in state["vectors"].items():
            arrays[f"seed{seed}/vectors/{name}"] = vectors.astype(np.float32)
        for name, gradient in state["first_grad"].items():
            arrays[f"seed{seed}/first_grad/{name}"] = gradient
        fingerprints[seed] = state["fingerprints"]
        first_loss[seed] = state["first_loss"]
    meta = {
        "recipe": {**recipe.RECIPE, "steps": steps}, "data": {**recipe.DATA, **data_knobs},
        "seeds": list(seeds), "losses": list(names),
        "params": {name: PARAMS[name] for name in names},
        "class_vectors": {name: LOSSES[name][3] for name in names},
        "weight_names": weight_names, "keras_layout": "NHWC; conv kernels HWIO; dense [in, out]",
        "batch_norm": {"momentum": 0.99, "epsilon": 1e-3},
        "adam": {"learning_rate": recipe.RECIPE["learning_rate"], "beta_1": 0.9,
                 "beta_2": 0.999, "epsilon": 1e-7},
        "first_loss": {str(s): v for s, v in first_loss.items()},
        "raw_pixels": raw, "fingerprints": {str(s): v for s, v in fingerprints.items()},
        "tfdml": tfdml.__version__, "keras": keras.__version__,
        "backend": keras.backend.backend(),
    }
    arrays["meta"] = np.array(json.dumps(meta))
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    try:
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"exported {path} ({os.path.getsize(path) / 2**20:.1f} MiB): seeds {list(seeds)}, "
          f"{steps} batches each, losses {', '.join(names)}", flush=True)
    return fingerprints


def load_results(path, steps, data_knobs):
    """The runs already in `path` with the same recipe, or a fresh record."""
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("recipe", {}).get("steps") == steps and old.get("data") == {
                **recipe.DATA, **data_knobs}:
            return old
    return {"library": "tfdml", "recipe": {**recipe.RECIPE, "steps": steps},
            "data": {**recipe.DATA, **data_knobs}, "runs": {}, "baselines": {}}


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return recipe.mean_std(values)


def summary(runs, seeds=None):
    """`{metric: (mean, std)}` over the runs (`"trained"` numbers) and the seconds."""
    runs = [r for r in runs if seeds is None or r["seed"] in seeds]
    if not runs:
        return None
    out = recipe.summarize(runs, "trained")
    out["seconds"] = mean_std([r["seconds"] for r in runs])
    out["n"] = len(runs)
    return out


def _cell(stats, digits=3):
    return "n/a" if stats is None else recipe.cell(stats, digits)


def _seconds(stats):
    return "n/a" if stats is None else f"{stats[0]:.0f} ± {stats[1]:.0f}"


def _difference(a, b, na, nb):
    """`tfdml - pml` of the means and that difference over its standard error (seeds)."""
    if a is None or b is None:
        return "n/a"
    (ma, sa), (mb, sb) = a, b
    se = math.sqrt(sa ** 2 / na + sb ** 2 / nb)
    ratio = "" if se == 0 else f" ({abs(ma - mb) / se:.1f} SE)"
    return f"{ma - mb:+.3f}{ratio}"


def _runs_of(results, name):
    return list(results.get("runs", {}).get(name, {}).values())


def markdown(ours, pml, own=None):
    """The side-by-side tables (a string) from the two results records (`pml` may be None),
    and `own`: pml's runs with its own initialization of the class vectors, if any."""
    pml = pml or {"runs": {}, "baselines": {}}
    lines = [MARK_BEGIN, ""]
    lines.append(f"- tfdml: `{' '.join(ours.get('command', []))}` on {ours.get('machine')}, "
                 f"{ours.get('date')}")
    if pml.get("machine"):
        lines.append(f"- pytorch-metric-learning: `{' '.join(pml.get('command', []))}` on "
                     f"{pml.get('machine')}, {pml.get('date')}")
    rec = ours["recipe"]
    lines.append(f"- recipe (both): the glyph CNN, {rec['embedding_dim']}-d, P x K = "
                 f"{rec['classes_per_batch']} x {rec['samples_per_class']}, Adam "
                 f"{rec['learning_rate']:g} for the network and the loss's vectors, "
                 f"{rec['steps']} steps; the same batches and initial weights per seed; "
                 "test: the 400 unseen characters (8,000 drawings), cosine, query excluded")
    lines.append("- cells: mean ± sample std over the seeds (n = seeds); Δ: tfdml − PML of "
                 "the means, and how many standard errors of that difference it is "
                 "(sqrt(s₁²/n + s₂²/n))")
    lines.append("- seconds: training wall time per run (1,000 steps; tfdml: `fit`, "
                 "XLA compilation included; PML: the PyTorch loop, eager), CPU only")
    lines.append("")
    lines.append("| loss | R@1 tfdml | R@1 PML | Δ R@1 | MAP@R tfdml | MAP@R PML | Δ MAP@R "
                 "| s/run tfdml | s/run PML | n | first batch: loss tfdml / PML |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    raw = ours.get("baselines", {}).get("raw_pixels")
    raw_pml = pml.get("baselines", {}).get("raw_pixels")
    if raw:
        lines.append(f"| raw pixels | {raw['recall@1']:.3f} | "
                     f"{'n/a' if not raw_pml else format(raw_pml['recall@1'], '.3f')} | | "
                     f"{raw['map@r']:.3f} | "
                     f"{'n/a' if not raw_pml else format(raw_pml['map@r'], '.3f')} | | | | | |")
    untrained = list(ours.get("baselines", {}).get("untrained", {}).values())
    untrained_pml = list(pml.get("baselines", {}).get("untrained", {}).values())
    if untrained:
        a = {m: mean_std([u[m] for u in untrained]) for m in ("recall@1", "map@r")}
        b = ({m: mean_std([u[m] for u in untrained_pml]) for m in ("recall@1", "map@r")}
             if untrained_pml else {"recall@1": None, "map@r": None})
        lines.append(f"| untrained network | {_cell(a['recall@1'])} | {_cell(b['recall@1'])} | "
                     f"| {_cell(a['map@r'])} | {_cell(b['map@r'])} | | | | "
                     f"{len(untrained)} / {len(untrained_pml)} | |")
    for name, (label, *_rest) in LOSSES.items():
        runs, pml_runs = _runs_of(ours, name), _runs_of(pml, name)
        if not runs and not pml_runs:
            continue
        a, b = summary(runs), summary(pml_runs)
        na, nb = len(runs), len(pml_runs)
        ga = (a or {}).get("recall@1"), (a or {}).get("map@r")
        gb = (b or {}).get("recall@1"), (b or {}).get("map@r")
        first = []
        for run in sorted(pml_runs, key=lambda r: r["seed"]):
            if run.get("first_loss_tfdml") is not None:
                grad = run.get("first_grad_difference")
                first.append(f"{run['first_loss_tfdml']:.5g} / {run['first_loss']:.5g}"
                             + ("" if grad is None else f"; gradient {grad:.0e}"))
        lines.append(
            f"| {label} | {_cell(ga[0])} | {_cell(gb[0])} | {_difference(ga[0], gb[0], na, nb)} | "
            f"{_cell(ga[1])} | {_cell(gb[1])} | {_difference(ga[1], gb[1], na, nb)} | "
            f"{_seconds((a or {}).get('seconds'))} | {_seconds((b or {}).get('seconds'))} | "
            f"{len(runs)} / {len(pml_runs)} | {first[0] if first else 'n/a'} |")
    lines.append("")
    lines.append("First batch: each library's loss on the first seed's first batch, at the "
                 "shared initial weights (training-mode batch norm), before any update; "
                 "gradient: the largest absolute difference of the two gradients with respect "
                 "to the embeddings, over the largest absolute entry of tfdml's.")
    lines.append("")
    if pml.get("port"):
        port = pml["port"]
        lines.append(f"Weight port: the PyTorch network with the exported Keras weights gives "
                     f"the Keras network's untrained test embeddings to "
                     f"{port['max_abs_difference']:.1e} (largest absolute difference over "
                     f"the seeds; the embeddings' largest magnitude "
                     f"{port['max_abs_embedding']:.2g}); untrained Recall@1 Keras "
                     f"{port['recall_keras']} vs PyTorch {port['recall_torch']}. NumPy "
                     f"metrics (the PyTorch side) against tfdml's on the raw pixels: Recall@1 "
                     f"{raw_pml['recall@1']:.4f} vs {raw['recall@1']:.4f}, MAP@R "
                     f"{raw_pml['map@r']:.4f} vs {raw['map@r']:.4f}."
                     if raw and raw_pml else "")
        lines.append("")
    if own and own.get("runs"):
        lines.append("The losses with class vectors, pml's own initialization of the vectors "
                     "(`glyph_losses_pml.py --own-init`: the network from the same exported "
                     "weights and the same batches, the vectors as pml 2.9 draws them) next "
                     "to both libraries from tfdml's (normal, std 1/sqrt(D): rows of norm "
                     "about 1):")
        lines.append("")
        lines.append("| loss | pml's initialization | R@1 PML, own init | R@1 PML, tfdml's "
                     "init | R@1 tfdml | MAP@R PML, own init | MAP@R PML, tfdml's init | "
                     "MAP@R tfdml | n |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for name, (label, _make, _written, vectors) in LOSSES.items():
            runs = _runs_of(own, name)
            if not vectors or not runs:
                continue
            c, b, a = summary(runs), summary(_runs_of(pml, name)), summary(_runs_of(ours, name))
            lines.append(
                f"| {label} | {PML_INIT.get(name, '')} | {_cell(c['recall@1'])} | "
                f"{_cell((b or {}).get('recall@1'))} | {_cell((a or {}).get('recall@1'))} | "
                f"{_cell(c['map@r'])} | {_cell((b or {}).get('map@r'))} | "
                f"{_cell((a or {}).get('map@r'))} | {len(runs)} |")
        lines.append("")
    lines.append("| loss | hyperparameters (both) | tfdml | pytorch-metric-learning 2.9 |")
    lines.append("|---|---|---|---|")
    for name, (label, _make, written, _vectors) in LOSSES.items():
        if _runs_of(ours, name) or _runs_of(pml, name):
            params = ", ".join(f"{k}={v:g}" for k, v in PARAMS[name].items())
            lines.append(f"| {label} | {params} | `{written}` | `{PML_WRITTEN[name]}` |")
    lines.append("")
    lines.append(MARK_END)
    return "\n".join(lines) + "\n"


def write_markdown(path, ours, pml, own=None):
    """Writes the generated tables between the markers of `path`, keeping the rest."""
    table = markdown(ours, pml, own)
    text = None
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if text and MARK_BEGIN in text and MARK_END in text:
        head, rest = text.split(MARK_BEGIN, 1)
        tail = rest.split(MARK_END, 1)[1]
        text = head + table.rstrip("\n") + tail
    else:
        text = ("# Losses on the glyphs benchmark: tfdml and pytorch-metric-learning 2.9\n\n"
                "Written by `benchmarks/glyph_losses.py --report`.\n\n" + table)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print(f"wrote {path}")


def read_json(path):
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--losses", nargs="+", choices=list(LOSSES), default=None,
                        help="losses to train (default: all; --smoke: two)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="training seeds (default 0 1 2; --smoke: 0)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps (default {recipe.RECIPE['steps']}; a multiple of "
                             f"{recipe.STEPS_PER_EPOCH}, or fewer than that)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a quick check: {SMOKE_DATA['num_classes']} characters, "
                             f"{SMOKE_STEPS} steps, seed 0, {' and '.join(SMOKE_LOSSES)}")
    parser.add_argument("--export", default=None, metavar="PATH",
                        help="write the .npz for glyph_losses_pml.py (e.g. "
                             "/tmp/glyph_losses.npz)")
    parser.add_argument("--export-only", action="store_true",
                        help="write the --export file and train nothing")
    parser.add_argument("--output", default=None,
                        help=f"results JSON (default {OUTPUT.relative_to(ROOT)}; --smoke: "
                             "none); '' for none")
    parser.add_argument("--pml-results", default=str(PML_OUTPUT),
                        help="the PyTorch side's JSON, for the markdown table")
    parser.add_argument("--pml-own-init-results", default=str(PML_OWN_INIT_OUTPUT),
                        help="the PyTorch side's JSON of `--own-init`, for the markdown table")
    parser.add_argument("--markdown", default=None,
                        help=f"side-by-side table (default {MARKDOWN.relative_to(ROOT)}; "
                             "--smoke: none); '' for none")
    parser.add_argument("--report", action="store_true",
                        help="only rewrite --markdown from the two JSON files")
    args = parser.parse_args(argv)
    if args.steps is not None and (args.steps < 1 or (
            args.steps > recipe.STEPS_PER_EPOCH and args.steps % recipe.STEPS_PER_EPOCH)):
        parser.error(f"--steps must be >= 1 and, above {recipe.STEPS_PER_EPOCH}, a multiple "
                     f"of it; got {args.steps}")
    if args.seeds is not None and any(s < 0 for s in args.seeds):
        parser.error(f"--seeds must be >= 0, got {args.seeds}")
    if args.export_only and not args.export:
        parser.error("--export-only needs --export PATH")
    args.losses = args.losses or list(SMOKE_LOSSES if args.smoke else LOSSES)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.smoke else
                                                            list(recipe.SEEDS))
    args.steps = args.steps or (SMOKE_STEPS if args.smoke else recipe.RECIPE["steps"])
    default_out, default_md = ("", "") if args.smoke else (str(OUTPUT), str(MARKDOWN))
    args.output = default_out if args.output is None else args.output
    args.markdown = default_md if args.markdown is None else args.markdown
    args.data = dict(SMOKE_DATA) if args.smoke else {}
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        ours = read_json(args.output)
        if ours is None:
            raise SystemExit(f"no tfdml results at {args.output!r}")
        write_markdown(args.markdown or str(MARKDOWN), ours, read_json(args.pml_results),
                       read_json(args.pml_own_init_results))
        return ours

    start = time.perf_counter()
    train, test = recipe.load_data(**args.data)
    raw = recipe.raw_pixels(test)
    print(f"glyphs: {train.num_classes} training characters ({len(train)} drawings), "
          f"{test.num_classes} unseen ({len(test)}); raw pixels R@1 {raw['recall@1']:.3f} "
          f"MAP@R {raw['map@r']:.3f}; {recipe.machine()}", flush=True)

    exported = None
    if args.export:
        exported = export(args.export, args.losses, args.seeds, train, test, args.steps,
                          args.data, raw)
        if args.export_only:
            return exported

    results = load_results(args.output, args.steps, args.data)
    results.update(machine=recipe.machine(), command=["python", *sys.argv] if argv is None
                   else ["python", "benchmarks/glyph_losses.py", *argv],
                   date=datetime.datetime.now(datetime.timezone.utc).strftime(
                       "%Y-%m-%d %H:%M UTC"))
    results["baselines"]["raw_pixels"] = raw
    results["baselines"].setdefault("untrained", {})
    for name in args.losses:
        print(f"{name}: tfdml.losses.{LOSSES[name][2]}", flush=True)
        for seed in args.seeds:
            captured = {}
            run = train_one(name, seed, (train, test), args.steps, captured)
            run["fingerprints"] = captured
            if exported is not None:
                expected = {k: v for k, v in exported[seed].items()
                            if k in ("cnn", name)}
                got = {"cnn": captured["cnn"], **({name: captured["vectors"]}
                                                  if "vectors" in captured else {})}
                if got != expected:
                    raise AssertionError(f"{name}, seed {seed}: the run started from other "
                                         f"weights than the export ({got} != {expected})")
            results["runs"].setdefault(name, {})[str(seed)] = run
            results["baselines"]["untrained"][str(seed)] = run["untrained"]
            if args.output:
                recipe.write_json(args.output, results)

    print("\n| loss | R@1 | MAP@R | s/run |\n|---|---:|---:|---:|")
    print(f"| raw pixels | {raw['recall@1']:.3f} | {raw['map@r']:.3f} | |")
    for name in args.losses:
        stats = summary(_runs_of(results, name), set(args.seeds))
        print(f"| {LOSSES[name][0]} | {_cell(stats['recall@1'])} | {_cell(stats['map@r'])} | "
              f"{_seconds(stats['seconds'])} |")
    print(f"all: {time.perf_counter() - start:.0f} s")
    if args.markdown:
        write_markdown(args.markdown, results, read_json(args.pml_results),
                       read_json(args.pml_own_init_results))
    return results


if __name__ == "__main__":
    main()
