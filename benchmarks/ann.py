"""Approximate search at scale: tfdml.search.Index(approximate=...) against the exact index and
raw faiss, on clustered synthetic embeddings.

For each configuration (``exact`` or a faiss factory string), a fresh worker process builds
the index from a generator of batches, tunes it (``Index.tune``: the cheapest ``nprobe`` /
``efSearch`` whose recall@10 on 1,000 held-out tuning queries reaches ``--target``), and
measures on 1,000 other queries:

* build time (train + add, from the generator) and the worker's peak resident memory
  (``VmHWM``) after the build and at the end;
* recall@10 of the exact neighbours (computed once by a NumPy scan over the generator);
* queries per second in batches of 1,000 and one query at a time (``--singles`` queries;
  a tenth of them for the exact index);
* raw faiss at the same settings: the search of the very faiss structure inside the tfdml
  index, called directly, timed in alternation with ``Index.search`` (same structure, same
  parameters, same load), the fastest of 7 alternating rounds each: the ratio is tfdml's
  overhead. With ``--raw-build`` a second
  worker also builds the structure with faiss alone (its build time and memory).

Data (``batches``): ``--clusters`` clusters in ``--dim`` dimensions, like embeddings of a
trained model: low intrinsic dimension and anisotropic. Centres are N(0, 1); each cluster
spreads in its own random 16-dimensional subspace (``RANK``) with standard deviations that
decay as ``s / sqrt(j)``, ``s`` drawn per cluster in [2, 5] (comparable to the distances
between centres: clusters that touch, as classes do), plus isotropic noise of 0.1 per
coordinate (``NOISE``); cluster sizes follow a Pareto(1.5) weight (a few big
clusters, many small ones); rows are L2-normalized for ``cosine``. Batch ``b`` is drawn
from its own seeded stream, so any worker regenerates the same rows without storing them.
Two earlier generators were unlike embeddings: Gaussian noise of full dimension in each
cluster (neighbours barely nearer than the rest of the cluster: HNSW needed ``efSearch``
4096 for recall@10 0.95 at 1M x 128), and clusters 20 times smaller than the distances
between them (an HNSW graph with few links between clusters: recall@10 stalled at 0.94).

    python benchmarks/ann.py --size 1000000 --dim 128 --structures exact HNSW32 \\
        IVF4096,Flat IVF4096,PQ32 --output benchmarks/results/ann_1m.md
    python benchmarks/ann.py --size 10000000 --dim 96 --structures IVF4096_HNSW32,PQ32 \\
        --rerank 100 --vectors disk --target 0.9 --output benchmarks/results/ann_10m.md
    python benchmarks/ann.py --recall-at-1 --size 1000000 --dim 128 --structures IVF4096,Flat \\
        --parameters '{"nprobe": 16}' --output benchmarks/results/ann_recall_at_1.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import resource
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workers import machine_info, run_worker, write_report  # noqa: E402

PREFIX = "ANN-RESULT "
BATCH = 100_000
K = 10
#: Alternating rounds of tfdml's search and faiss's; the fastest of each is kept.
ROUNDS = 7


#: The intrinsic dimension of a cluster: its rows vary in a subspace of this many directions.
RANK = 16


def _model(dim, clusters, seed):
    rng = np.random.default_rng([seed, 0])
    centres = rng.normal(size=(clusters, dim))
    # Each cluster spreads in its own RANK directions, with decaying standard deviations.
    bases = np.linalg.qr(rng.normal(size=(clusters, dim, RANK)))[0]
    spread = rng.uniform(2.0, 5.0, size=(clusters, 1)) / np.sqrt(np.arange(1, RANK + 1))
    weights = rng.pareto(1.5, clusters) + 1.0
    return centres, bases * spread[:, None, :], weights / weights.sum()


def batches(num, dim, clusters, seed, stream, metric, batch=BATCH):
    """Yields ``(embeddings, labels)``: ``num`` rows in batches, stream 1 the gallery, 2 the
    queries (see the module's docstring)."""
    centres, bases, weights = _model(dim, clusters, seed)
    for number, start in enumerate(range(0, num, batch)):
        rng = np.random.default_rng([seed, stream, number])
        size = min(batch, num - start)
        which = rng.choice(clusters, size, p=weights)
        z = rng.normal(size=(size, RANK))
        x = centres[which] + rng.normal(size=(size, dim)) * NOISE
        order = np.argsort(which, kind="stable")
        bounds = np.flatnonzero(np.diff(which[order])) + 1
        for rows in np.split(order, bounds):  # the rows of one cluster at a time
            x[rows] += z[rows] @ bases[which[rows[0]]].T
        x = x.astype(np.float32)
        if metric == "cosine":
            x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield x, which.astype(np.int64)


#: The standard deviation of the isotropic noise on every coordinate.
NOISE = 0.1


def _queries(args, stream, count):
    x, y = zip(*batches(count, args.dim, args.clusters, args.seed, stream, args.metric),
               strict=True)
    return np.concatenate(x), np.concatenate(y)


def exact_truth(args, queries):
    """The exact top-``K`` gallery positions of ``queries``: a NumPy scan of the generator."""
    best_s = np.full((len(queries), K), -np.inf, np.float32)
    best_i = np.zeros((len(queries), K), np.int64)
    start = 0
    for x, _ in batches(args.size, args.dim, args.clusters, args.seed, 1, args.metric):
        if args.metric == "l2":
            s = -(np.square(x).sum(1)[None, :] - 2 * queries @ x.T)
        else:
            s = queries @ x.T
        s = np.concatenate([best_s, s], axis=1)
        i = np.concatenate([best_i, np.arange(start, start + len(x))[None, :].repeat(
            len(queries), 0)], axis=1)
        top = np.argpartition(-s, K - 1, axis=1)[:, :K]
        best_s, best_i = np.take_along_axis(s, top, 1), np.take_along_axis(i, top, 1)
        start += len(x)
    order = np.argsort(-best_s, axis=1, kind="stable")
    return np.take_along_axis(best_i, order, 1)


def _rss_mib():
    """The process's peak resident memory (MiB): ``VmHWM`` (``ru_maxrss`` on Linux keeps the
    peak of the process that started this one across ``exec``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn, repeats):
    """The smallest of ``repeats`` wall times of ``fn()`` (seconds), and its last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        began = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - began)
    return best, out


def worker(args):
    import tfdml

    structure = args.structures[0]
    queries, _ = _queries(args, 2, args.queries)
    tuning, _ = _queries(args, 3, args.queries)
    truth = np.load(args.truth)
    rss_start = _rss_mib()
    began = time.perf_counter()
    if structure == "exact":
        index = tfdml.search.Index(args.metric, vectors=args.vectors or "memory")
    else:
        index = tfdml.search.Index(args.metric, approximate=structure, rerank=args.rerank,
                                   vectors=args.vectors, train_size=args.train_size)
    index.add(batches(args.size, args.dim, args.clusters, args.seed, 1, args.metric))
    result = {"build_s": time.perf_counter() - began, "rss_build_mib": _rss_mib(),
              "rss_start_mib": rss_start}
    if structure != "exact":
        tuned = index.tune(tuning, K, args.target) if index.vectors else None
        result["parameters"] = index.parameters
        result["tune_recall"] = None if tuned is None else tuned.recall
    batch_s, (_, found) = _timed(lambda: index.search(queries, K), 3)
    result["recall"] = tfdml.search.neighbour_recall(found, truth)
    result["qps_batch"] = len(queries) / batch_s
    singles = queries[: args.singles if structure != "exact" else max(args.singles // 10, 1)]
    single_s, _ = _timed(lambda: [index.search(q[None], K) for q in singles], 2)
    result["qps_single"] = len(singles) / single_s
    if structure != "exact":
        raw = index._structure  # the faiss structure inside, searched directly
        fetch = max(K, args.rerank or 0)
        tf_b, raw_b, tf_1, raw_1 = [], [], [], []
        for _ in range(ROUNDS):  # alternating rounds: both see the same load
            tf_b.append(_timed(lambda: index.search(queries, K), 1)[0])
            raw_b.append(_timed(lambda: raw.search(queries, fetch), 1)[0])
            tf_1.append(_timed(lambda: [index.search(q[None], K) for q in singles], 1)[0])
            raw_1.append(_timed(lambda: [raw.search(q[None], fetch) for q in singles], 1)[0])
        result.update(raw_qps_batch=len(queries) / min(raw_b),
                      ratio_batch=min(tf_b) / min(raw_b),
                      raw_qps_single=len(singles) / min(raw_1),
                      ratio_single=min(tf_1) / min(raw_1))
    result["rss_end_mib"] = _rss_mib()
    import keras
    import tensorflow as tf

    result["versions"] = {"tensorflow": tf.__version__, "keras": keras.__version__}
    print(PREFIX + json.dumps(result), flush=True)


def raw_build_worker(args):
    """faiss alone: the same factory string, trained on the same rows, from the generator."""
    import faiss

    structure = args.structures[0]
    metric = faiss.METRIC_L2 if args.metric == "l2" else faiss.METRIC_INNER_PRODUCT
    began = time.perf_counter()
    index = faiss.index_factory(args.dim, structure, metric)
    pending, trained = [], index.is_trained
    for x, _ in batches(args.size, args.dim, args.clusters, args.seed, 1, args.metric):
        if trained:
            index.add(x)
            continue
        pending.append(x)
        rows = sum(len(p) for p in pending)
        nlist = faiss.extract_index_ivf(index).nlist if "IVF" in structure else 0
        if rows >= (args.train_size or max(64 * nlist, 65536)):
            sample = np.concatenate(pending)
            index.train(sample)
            index.add(sample)
            pending, trained = [], True
    if pending:  # fewer rows than a training sample: train on them all
        sample = np.concatenate(pending)
        index.train(sample)
        index.add(sample)
    print(PREFIX + json.dumps({"build_s": time.perf_counter() - began,
                               "rss_build_mib": _rss_mib()}), flush=True)


def recall_at_1_worker(args):
    """recall@1 of 1M queries in a 1M gallery through an approximate index (tfdml.metrics)."""
    import tfdml

    gallery = _queries(args, 1, args.size)
    queries = _queries(args, 2, args.size)
    index = tfdml.search.Index(args.metric, approximate=args.structures[0],
                               parameters=json.loads(args.parameters), vectors=None)
    began = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, _logged() as log:
        warnings.simplefilter("always")
        recall = tfdml.metrics.recall_at_k(queries[0], queries[1], ks=(1,),
                                           gallery_embeddings=gallery[0],
                                           gallery_labels=gallery[1], metric=args.metric,
                                           index=index)
    print(PREFIX + json.dumps({"seconds": time.perf_counter() - began, "recall@1": recall[1],
                               "rss_mib": _rss_mib(), "log": log.getvalue().strip(),
                               "warnings": [str(w.message) for w in caught]}), flush=True)


@contextlib.contextmanager
def _logged():
    """The ``tfdml`` logger's INFO lines, collected."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tfdml")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--clusters", type=int, default=2000)
    p.add_argument("--metric", default="cosine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--singles", type=int, default=200)
    p.add_argument("--structures", nargs="+", default=["exact", "HNSW32", "IVF4096,Flat",
                                                        "IVF4096,PQ32"])
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--rerank", type=int, default=None)
    p.add_argument("--vectors", default="memory", type=lambda v: None if v == "none" else v)
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--raw-build", action="store_true")
    p.add_argument("--parameters", default="{}", help="JSON search parameters for "
                   "--recall-at-1, e.g. '{\"nprobe\": 16}'")
    p.add_argument("--recall-at-1", action="store_true")
    p.add_argument("--timeout", type=int, default=4 * 3600)
    p.add_argument("--truth", default=None)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--raw-worker", action="store_true")
    p.add_argument("--output", default=None)
    return p.parse_args(argv)


def _forward(args, structure, extra=()):
    out = ["--size", args.size, "--dim", args.dim, "--clusters", args.clusters, "--metric",
           args.metric, "--seed", args.seed, "--queries", args.queries, "--singles",
           args.singles, "--target", args.target, "--vectors", args.vectors or "none",
           "--structures", structure, *extra]
    if args.rerank:
        out += ["--rerank", args.rerank]
    if args.train_size:
        out += ["--train-size", args.train_size]
    return out


def _fmt(value, digits=1):
    return "" if value is None else f"{value:,.{digits}f}"


def main():
    args = _args()
    if args.worker:
        return (raw_build_worker if args.raw_worker else
                recall_at_1_worker if args.recall_at_1 else worker)(args)
    lines = [f"# Approximate search: {args.size:,} x {args.dim} ({args.metric}, "
             f"{args.clusters} clusters)", ""]
    results = []
    if args.recall_at_1:
        for structure in args.structures:
            r = run_worker(__file__, _forward(args, structure, ["--recall-at-1", "--parameters",
                                                                args.parameters]),
                           PREFIX, args.timeout)
            results.append((structure, r))
            lines.append(f"- recall@1, {args.size:,} queries x {args.size:,} gallery through "
                         f"`index={structure!r}`: {json.dumps(r)}")
    else:
        began = time.perf_counter()
        queries, _ = _queries(args, 2, args.queries)
        truth = exact_truth(args, queries)
        truth_s = time.perf_counter() - began
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "truth.npy")
            np.save(path, truth)
            for structure in args.structures:
                r = run_worker(__file__, _forward(args, structure, ["--truth", path]), PREFIX,
                               args.timeout)
                if args.raw_build and structure != "exact":
                    r["raw"] = run_worker(__file__, _forward(args, structure, ["--raw-worker"]),
                                          PREFIX, args.timeout)
                results.append((structure, r))
                print(structure, json.dumps(r), flush=True)
        lines += [f"Exact top-{K} of {args.queries:,} queries by a NumPy scan: {truth_s:.0f} s. "
                  f"Target recall@{K} for `tune`: {args.target}; rerank: {args.rerank}; "
                  f"vectors: {args.vectors}.", "",
                  "| index | build s | peak RSS MiB (build / end) | parameters | recall@10 | "
                  "QPS x1000 | QPS x1 | raw faiss QPS x1000 / x1 | tfdml / raw time x1000, x1 |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
        for structure, r in results:
            if "error" in r:
                lines.append(f"| `{structure}` | FAILED: {r['error']} ||||||||")
                continue
            raw = (f"{_fmt(r.get('raw_qps_batch'), 0)} / {_fmt(r.get('raw_qps_single'), 0)}"
                   if "raw_qps_batch" in r else "")
            ratio = (f"{r['ratio_batch']:.2f}, {r['ratio_single']:.2f}" if "ratio_batch" in r
                     else "")
            lines.append(
                f"| `{structure}` | {_fmt(r['build_s'])} | {_fmt(r['rss_build_mib'], 0)} / "
                f"{_fmt(r['rss_end_mib'], 0)} | {r.get('parameters', '')} | "
                f"{r['recall']:.4f} | {_fmt(r['qps_batch'], 0)} | {_fmt(r['qps_single'], 0)} | "
                f"{raw} | {ratio} |")
            if "raw" in r:
                lines.append(f"|  faiss alone | {_fmt(r['raw'].get('build_s'))} | "
                             f"{_fmt(r['raw'].get('rss_build_mib'), 0)} |||||||")
    lines += ["", f"Machine: {machine_info(results, memory=True)}.",
              f"Command: `python benchmarks/ann.py {' '.join(sys.argv[1:])}`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        write_report(text, args.output)
    return None


if __name__ == "__main__":
    main()
