"""The glyph loss table's other half: pytorch-metric-learning 2.9, in PyTorch, on tfdml's arrays.

`benchmarks/glyph_losses.py --export PATH` writes one `.npz` with everything a run needs
from the tfdml side: the glyph images and labels, and for each seed the P x K batch indices
that tfdml's `PKDataset` gives `fit`, the Keras CNN's initial weights, each loss's initial
class vectors (proxies, class weights, SoftTriple centres), the untrained network's test
embeddings and each loss's tfdml value on the first batch and its gradient with respect
to the embeddings. This script builds the same CNN
in PyTorch, loads those weights into it (layout conversions below), and trains it with the
pytorch-metric-learning loss of the same hyperparameters (`PARAMS`, checked against the
copy in the `.npz`) on the same batches: torch.optim.Adam, learning rate 1e-3, over the
network's and the loss's parameters, the same number of steps. Recall@1 and MAP@R on the
unseen characters are computed in NumPy (`retrieval`: cosine, query excluded, ties to the
lower index; MAP@R of Musgrave et al.), which give tfdml's numbers on the same embeddings
(`tests/test_glyph_losses_bench.py`).

It imports neither tfdml nor Keras: run it in an environment with PyTorch and
pytorch-metric-learning (torch and pytorch_metric_learning are imported in `main`, so the
NumPy parts import anywhere):

    python3 -m venv /tmp/pml_env
    /tmp/pml_env/bin/pip install torch==2.13.0 pytorch-metric-learning==2.9.0 numpy
    /tmp/pml_env/bin/python benchmarks/glyph_losses_pml.py --data /tmp/glyph_losses.npz

Keras -> PyTorch:
- Conv2D kernels `[3, 3, in, out]` (HWIO) -> `Conv2d.weight` `[out, in, 3, 3]` (OIHW);
  `padding="same"` with a 3 x 3 kernel is `padding=1`; no bias.
- BatchNormalization(momentum=0.99, epsilon=1e-3) -> BatchNorm2d(momentum=0.01, eps=1e-3):
  gamma, beta, moving mean and variance -> weight, bias, running mean and variance.
  (PyTorch updates its running variance with the unbiased batch variance, Keras with the
  biased one: a factor n / (n - 1), n >= 576 values per channel here.)
- Flatten of NHWC `[3, 3, 128]` -> the Dense kernel's rows are in (h, w, c) order;
  PyTorch flattens NCHW in (c, h, w) order, so the kernel `[1152, 64]` is reordered to
  (c, h, w) rows and transposed to `Linear.weight` `[64, 1152]`.
- Class vectors: tfdml `[C, D]` -> pml `proxies` `[C, D]` (Proxy-NCA, Proxy-Anchor) or
  `W` `[D, C]` (ArcFace, CosFace); SoftTriple's `[C, k, D]` -> `fc` `[D, C k]` (column
  `c k + j`).
- Adam: Keras' epsilon 1e-7 (added to sqrt(v) before the bias correction) -> torch's
  `eps=1e-7` (added after it); the two differ only while sqrt(v) is near 1e-7.

Writes `benchmarks/results/glyph_losses_pml.json` (runs kept across invocations with the
same recipe, as the tfdml side); `python benchmarks/glyph_losses.py --report` (in the
tfdml environment) puts both sides into `benchmarks/results/glyph_losses.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "glyph_losses_pml.json"
OWN_INIT_OUTPUT = ROOT / "benchmarks" / "results" / "glyph_losses_pml_own_init.json"
DATA = "/tmp/glyph_losses.npz"

#: The same table as `glyph_losses.py`'s (pytorch-metric-learning 2.9's defaults).
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


def build_loss(name, num_classes, dim):
    """`(loss, miner or None)` of pytorch-metric-learning for `name`, with `PARAMS[name]`."""
    from pytorch_metric_learning import losses, miners

    p = PARAMS[name]
    if name == "contrastive":
        return losses.ContrastiveLoss(pos_margin=p["pos_margin"], neg_margin=p["neg_margin"]), None
    if name == "triplet_semihard":
        return (losses.TripletMarginLoss(margin=p["margin"]),
                miners.TripletMarginMiner(margin=p["miner_margin"], type_of_triplets="semihard"))
    if name == "multi_similarity":
        return (losses.MultiSimilarityLoss(alpha=p["alpha"], beta=p["beta"], base=p["base"]),
                miners.MultiSimilarityMiner(epsilon=p["epsilon"]))
    if name == "circle":
        return losses.CircleLoss(m=p["m"], gamma=p["gamma"]), None
    if name == "supcon":
        return losses.SupConLoss(temperature=p["temperature"]), None
    if name == "nca":
        return losses.NCALoss(softmax_scale=p["softmax_scale"]), None
    if name == "proxy_nca":
        return losses.ProxyNCALoss(num_classes, dim, softmax_scale=p["softmax_scale"]), None
    if name == "proxy_anchor":
        return losses.ProxyAnchorLoss(num_classes, dim, margin=p["margin"],
                                      alpha=p["alpha"]), None
    if name == "arcface":
        return losses.ArcFaceLoss(num_classes, dim, margin=p["margin_degrees"],
                                  scale=p["scale"]), None
    if name == "cosface":
        return losses.CosFaceLoss(num_classes, dim, margin=p["margin"], scale=p["scale"]), None
    if name == "soft_triple":
        return losses.SoftTripleLoss(num_classes, dim, centers_per_class=p["centers_per_class"],
                                     la=p["la"], gamma=p["gamma"], margin=p["margin"]), None
    if name == "fast_ap":
        return losses.FastAPLoss(num_bins=p["num_bins"]), None
    raise ValueError(f"unknown loss {name!r}")


def class_vectors_to_pml(name, vectors):
    """`(attribute, array)`: tfdml's class vectors in the layout of the pml loss's parameter."""
    if name in ("proxy_nca", "proxy_anchor"):
        return "proxies", vectors                                   # [C, D]
    if name in ("arcface", "cosface"):
        return "W", vectors.T                                       # [D, C]
    if name == "soft_triple":
        c, k, d = vectors.shape
        return "fc", vectors.reshape(c * k, d).T                    # [D, C k], column c k + j
    raise ValueError(f"{name!r} has no class vectors")


def keras_to_torch(weights):
    """The glyph CNN's Keras weights (in `model.weights` order: per block the conv kernel,
    then gamma, beta, moving mean, moving variance; then the dense kernel and bias) as a
    `state_dict` of `GlyphCNN` (NumPy arrays)."""
    weights = [np.asarray(w, np.float32) for w in weights]
    if len(weights) != 17:
        raise ValueError(f"expected the 17 weights of the glyph CNN, got {len(weights)}")
    state = {}
    for block in range(3):
        kernel, gamma, beta, mean, var = weights[5 * block:5 * block + 5]
        state[f"features.{4 * block}.weight"] = kernel.transpose(3, 2, 0, 1)   # HWIO -> OIHW
        state[f"features.{4 * block + 1}.weight"] = gamma
        state[f"features.{4 * block + 1}.bias"] = beta
        state[f"features.{4 * block + 1}.running_mean"] = mean
        state[f"features.{4 * block + 1}.running_var"] = var
    kernel, bias = weights[15], weights[16]
    channels = weights[10].shape[-1]
    side = math.isqrt(kernel.shape[0] // channels)
    # rows (h, w, c) -> (c, h, w), then [in, out] -> [out, in]
    kernel = kernel.reshape(side, side, channels, -1).transpose(2, 0, 1, 3)
    state["head.weight"] = np.ascontiguousarray(kernel.reshape(side * side * channels, -1).T)
    state["head.bias"] = bias
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


def build_cnn(embedding_dim=64, image_size=28):
    """The glyph CNN in PyTorch: 3 x [conv 3x3 (no bias) -> BN -> ReLU -> max-pool 2],
    32/64/128 channels, flatten, linear `embedding_dim`."""
    import torch

    layers, channels = [], 1
    for filters in (32, 64, 128):
        layers += [torch.nn.Conv2d(channels, filters, 3, padding=1, bias=False),
                   torch.nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01),
                   torch.nn.ReLU(),
                   torch.nn.MaxPool2d(2)]
        channels = filters
    side = image_size
    for _ in range(3):
        side //= 2

    class GlyphCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Sequential(*layers)
            self.head = torch.nn.Linear(channels * side * side, embedding_dim)

        def forward(self, x):
            return self.head(torch.flatten(self.features(x), 1))

    return GlyphCNN()


def load_keras_weights(model, weights):
    import torch

    state = {k: torch.from_numpy(v) for k, v in keras_to_torch(weights).items()}
    missing = set(model.state_dict()) - set(state) - {
        k for k in model.state_dict() if k.endswith("num_batches_tracked")}
    if missing:
        raise ValueError(f"no Keras weight for {sorted(missing)}")
    model.load_state_dict(state, strict=False)


def retrieval(embeddings, labels, chunk_size=1000):
    """`{"recall@1", "map@r"}` of every item against all the others: cosine similarity,
    the query itself excluded, ties to the lower index; MAP@R as Musgrave et al. (2020):
    `(1/R) sum_{i<=R} P(i) rel(i)` with `R` the query's same-class items, the mean over
    the queries that have one."""
    x = np.asarray(embeddings, np.float32).reshape(len(labels), -1)
    labels = np.asarray(labels)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.where(norms > 0, norms, 1.0)
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    relevant = counts[inverse.reshape(-1)] - 1                      # R of each query
    max_r = int(relevant.max())
    hits_at_1, precisions = [], []
    for start in range(0, len(x), chunk_size):
        stop = min(start + chunk_size, len(x))
        sims = x[start:stop] @ x.T
        sims[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        order = np.argsort(-sims, axis=1, kind="stable")[:, :max(max_r, 1)]
        hits = labels[order] == labels[start:stop, None]
        hits_at_1.append(hits[:, 0])
        r = relevant[start:stop]
        ranks = np.arange(1, hits.shape[1] + 1)
        within = ranks[None, :] <= r[:, None]
        precision = np.cumsum(hits, axis=1) / ranks
        ap = np.sum(precision * hits * within, axis=1) / np.maximum(r, 1)
        precisions.append(np.where(r > 0, ap, np.nan))
    map_r = np.concatenate(precisions)
    return {"recall@1": float(np.mean(np.concatenate(hits_at_1))),
            "map@r": float(np.nanmean(map_r))}


def mean_std(values):
    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def load_export(path):
    data = np.load(path)
    meta = json.loads(str(data["meta"]))
    return data, meta


def to_nchw(images_uint8):
    """uint8 `[N, H, W]` -> float32 `[N, 1, H, W]` in [0, 1] (tfdml's values: uint8 / 255)."""
    return (images_uint8.astype(np.float32) / 255.0)[:, None]


def embed(model, images, batch_size=1000, device="cpu"):
    import torch

    model.eval()
    with torch.no_grad():
        out = [model(torch.from_numpy(images[i:i + batch_size]).to(device)).cpu().numpy()
               for i in range(0, len(images), batch_size)]
    return np.concatenate(out)


def train_and_evaluate(name, seed, data, meta, train_x, test_x, steps, log=print,
                       device="cpu", own_init=False):
    """One run: the ported network and loss, the exported batches, Adam; test numbers.
    `own_init`: the loss's class vectors keep pml's initialization (drawn after
    `torch.manual_seed(seed)`) instead of tfdml's exported ones."""
    import torch

    device = torch.device(device)
    torch.manual_seed(seed)
    dim = meta["recipe"]["embedding_dim"]
    num_classes = int(data["train_labels"].max()) + 1
    weights = [data[f"seed{seed}/cnn/{i}"] for i in range(len(meta["weight_names"]))]
    model = build_cnn(dim, train_x.shape[-1])
    load_keras_weights(model, weights)
    model.to(device)
    untrained = retrieval(embed(model, test_x, device=device), data["test_labels"])
    loss_fn, miner = build_loss(name, num_classes, dim)
    if meta["class_vectors"].get(name) and not own_init:
        attribute, vectors = class_vectors_to_pml(name, data[f"seed{seed}/vectors/{name}"])
        parameter = getattr(loss_fn, attribute)
        if tuple(parameter.shape) != vectors.shape:
            raise ValueError(f"{name}: {attribute} is {tuple(parameter.shape)}, the exported "
                             f"vectors {vectors.shape}")
        with torch.no_grad():
            parameter.copy_(torch.from_numpy(np.ascontiguousarray(vectors)))
    loss_fn.to(device)
    adam = meta["adam"]
    optimizer = torch.optim.Adam(list(model.parameters()) + list(loss_fn.parameters()),
                                 lr=adam["learning_rate"], betas=(adam["beta_1"], adam["beta_2"]),
                                 eps=adam["epsilon"])
    batches = data[f"seed{seed}/batches"][:steps]
    labels = torch.from_numpy(data["train_labels"])
    model.train()
    first_loss = first_grad = None
    start = time.perf_counter()
    for step, index in enumerate(batches):
        x = torch.from_numpy(train_x[index]).to(device)
        y = labels[index].to(device)
        embeddings = model(x)
        if step == 0:
            embeddings.retain_grad()
        mined = miner(embeddings, y) if miner is not None else None
        loss = loss_fn(embeddings, y, mined)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 0:
            first_loss = float(loss.detach())
            first_grad = embeddings.grad.cpu().numpy()
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"{name}, seed {seed}: loss {float(loss)} at step {step}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    grad_key = f"seed{seed}/first_grad/{name}"
    other_start = own_init and meta["class_vectors"].get(name)  # not tfdml's first step
    grad_difference = None
    if grad_key in data and not other_start:
        reference = data[grad_key]
        grad_difference = float(np.max(np.abs(first_grad - reference))
                                / max(float(np.max(np.abs(reference))), 1e-30))
    final_loss = float(loss.detach())
    trained = retrieval(embed(model, test_x, device=device), data["test_labels"])
    if log is not None:
        log(f"  seed {seed}: untrained R@1 {untrained['recall@1']:.3f}, trained R@1 "
            f"{trained['recall@1']:.3f} MAP@R {trained['map@r']:.3f} "
            f"(loss {final_loss:.4g}; first batch: loss {first_loss:.6g}, tfdml "
            f"{'n/a' if other_start else format(meta['first_loss'][str(seed)][name], '.6g')}"
            f", gradient difference "
            f"{'n/a' if grad_difference is None else format(grad_difference, '.1e')}; "
            f"{seconds:.0f} s)", flush=True)
    return {"untrained": untrained, "trained": trained, "seconds": seconds,
            "final_loss": final_loss, "first_loss": first_loss,
            "first_loss_tfdml": None if other_start else meta["first_loss"][str(seed)].get(name),
            "first_grad_difference": grad_difference, "seed": seed,
            "class_vectors": ("pml" if own_init else "tfdml")
            if meta["class_vectors"].get(name) else None,
            "steps": steps}


def machine(device="cpu"):
    import pytorch_metric_learning
    import torch

    where = (f"{torch.cuda.get_device_name(device)}" if str(device).startswith("cuda")
             else f"CPU, {torch.get_num_threads()} threads")
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, torch {torch.__version__} ({where}), "
            f"pytorch-metric-learning {pytorch_metric_learning.__version__}")


def write_json(path, obj):
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def check_port(data, meta, test_x, seeds, device="cpu"):
    """The ported untrained networks against Keras' test embeddings of each seed."""
    worst, scale, recalls = 0.0, 0.0, {}
    for seed in seeds:
        weights = [data[f"seed{seed}/cnn/{i}"] for i in range(len(meta["weight_names"]))]
        model = build_cnn(meta["recipe"]["embedding_dim"], test_x.shape[-1])
        load_keras_weights(model, weights)
        model.to(device)
        ours, theirs = embed(model, test_x, device=device), data[f"seed{seed}/untrained"]
        worst = max(worst, float(np.max(np.abs(ours - theirs))))
        scale = max(scale, float(np.max(np.abs(theirs))))
        a, b = retrieval(theirs, data["test_labels"]), retrieval(ours, data["test_labels"])
        recalls[seed] = (a, b)
        print(f"port, seed {seed}: max |torch - keras| {worst:.2e} (embeddings up to "
              f"{scale:.2f}); untrained R@1 keras {a['recall@1']:.4f} torch "
              f"{b['recall@1']:.4f}, MAP@R keras {a['map@r']:.4f} torch {b['map@r']:.4f}",
              flush=True)
    return {"max_abs_difference": worst, "max_abs_embedding": scale,
            "recall_keras": ", ".join(f"{recalls[s][0]['recall@1']:.4f}" for s in seeds),
            "recall_torch": ", ".join(f"{recalls[s][1]['recall@1']:.4f}" for s in seeds),
            "untrained_torch": {str(s): recalls[s][1] for s in seeds}}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DATA, help=f"the exported .npz (default {DATA})")
    parser.add_argument("--losses", nargs="+", choices=list(PARAMS), default=None,
                        help="losses to train (default: those in the export)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="seeds (default: those in the export)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the export's, at most that)")
    parser.add_argument("--smoke", action="store_true",
                        help="a quick check: the first exported seed, no results file "
                             "unless --output names one (export with glyph_losses.py --smoke "
                             "for a small one)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the network and the loss (default cpu; "
                             "e.g. cuda)")
    parser.add_argument("--own-init", action="store_true",
                        help="the losses with class vectors keep pml's own initialization of "
                             "them (the network still starts from the exported weights); "
                             f"results to {OWN_INIT_OUTPUT.relative_to(ROOT)}")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: PyTorch's choice)")
    parser.add_argument("--output", default=None,
                        help=f"results JSON (default {OUTPUT.relative_to(ROOT)}; --smoke: none)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    data, meta = load_export(args.data)
    names = args.losses or [name for name in meta["losses"]
                            if meta["class_vectors"][name] or not args.own_init]
    for name in names:
        if name not in meta["losses"]:
            raise SystemExit(f"{name!r} is not in {args.data} (exported: {meta['losses']})")
        if meta["params"][name] != PARAMS[name]:
            raise SystemExit(f"{name}: hyperparameters differ from the export: "
                             f"{PARAMS[name]} != {meta['params'][name]}")
    seeds = args.seeds if args.seeds is not None else meta["seeds"][:1 if args.smoke else None]
    for seed in seeds:
        if seed not in meta["seeds"]:
            raise SystemExit(f"seed {seed} is not in {args.data} (exported: {meta['seeds']})")
    exported_steps = meta["recipe"]["steps"]
    steps = args.steps or exported_steps
    if not 1 <= steps <= exported_steps:
        raise SystemExit(f"--steps must be in [1, {exported_steps}] (the batches exported)")
    default_output = OWN_INIT_OUTPUT if args.own_init else OUTPUT
    output = ("" if args.smoke else str(default_output)) if args.output is None else args.output

    train_x, test_x = to_nchw(data["train_images"]), to_nchw(data["test_images"])
    raw = retrieval(data["test_images"].reshape(len(test_x), -1).astype(np.float32) / 255.0,
                    data["test_labels"])
    print(f"{machine(args.device)}\nraw pixels: R@1 {raw['recall@1']:.4f} MAP@R "
          f"{raw['map@r']:.4f} (NumPy); tfdml: R@1 {meta['raw_pixels']['recall@1']:.4f} MAP@R "
          f"{meta['raw_pixels']['map@r']:.4f}", flush=True)
    port = check_port(data, meta, test_x, seeds, args.device)

    results = None
    if output and os.path.exists(output):
        with open(output) as f:
            results = json.load(f)
        if results.get("recipe", {}).get("steps") != steps or results.get("data") != meta["data"]:
            results = None
    if results is None:
        results = {"library": "pytorch-metric-learning", "own_init": args.own_init,
                   "recipe": {**meta["recipe"], "steps": steps}, "data": meta["data"],
                   "runs": {}, "baselines": {}}
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results.update(machine=machine(args.device), date=date,
                   command=["/tmp/pml_env/bin/python", "benchmarks/glyph_losses_pml.py",
                            *(sys.argv[1:] if argv is None else argv)],
                   port=port, exported_by={"tfdml": meta["tfdml"], "keras": meta["keras"]})
    results["baselines"]["raw_pixels"] = raw
    results["baselines"].setdefault("untrained", {}).update(port["untrained_torch"])
    for name in names:
        print(f"{name}: pytorch_metric_learning {PARAMS[name]}", flush=True)
        for seed in seeds:
            run = train_and_evaluate(name, seed, data, meta, train_x, test_x, steps,
                                     device=args.device, own_init=args.own_init)
            results["runs"].setdefault(name, {})[str(seed)] = run
            if output:
                write_json(output, results)
    print("\n| loss | R@1 | MAP@R | s/run | first-batch loss pml / tfdml |\n"
          "|---|---:|---:|---:|---|")
    for name in names:
        runs = [results["runs"][name][str(s)] for s in seeds]
        r1 = mean_std([r["trained"]["recall@1"] for r in runs])
        mr = mean_std([r["trained"]["map@r"] for r in runs])
        sec = mean_std([r["seconds"] for r in runs])
        tfdml_first = runs[0]["first_loss_tfdml"]
        print(f"| {name} | {r1[0]:.3f} ± {r1[1]:.3f} | {mr[0]:.3f} ± {mr[1]:.3f} | "
              f"{sec[0]:.0f} | {runs[0]['first_loss']:.5g} / "
              f"{'n/a' if tfdml_first is None else format(tfdml_first, '.5g')} |")
    return results


if __name__ == "__main__":
    main()
