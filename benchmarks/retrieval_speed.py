"""Speed and peak memory of tfdml.metrics.recall_at_k against exact brute-force baselines.

The SOP-sized case: N = 60,000 float32 embeddings of D = 512 in 11,000 classes (5 or 6
samples each), every embedding a query against all the others (itself excluded), cosine
similarity, K = 1, 10, 100, 1000 (the SOP protocol). Every method runs in its own worker
process (this script started again with ``--worker METHOD``), which creates the same
seeded data, reads its peak resident set size (``ru_maxrss``) before and after the search,
and prints one JSON line. Methods:

* ``tfdml``: ``tfdml.metrics.recall_at_k`` with its defaults (1024 queries x 65536 gallery
  items per matrix product, running top-k).
* ``numpy``: chunks of 1024 queries, a full ``[1024, N]`` score matrix per chunk,
  ``np.argpartition`` then a sort of the top K.
* ``sklearn``: ``NearestNeighbors(algorithm="brute", metric="cosine").kneighbors`` with
  K + 1 neighbours (the query itself is dropped).
* ``faiss``: ``faiss.IndexFlatIP`` on L2-normalized embeddings, K + 1 neighbours, if
  ``faiss-cpu`` is installed (it is not a tfdml dependency).

The report checks that every baseline gives the same Recall@K as tfdml.

``--index`` measures ``tfdml.search.Index("dot").search`` instead, top-101 and top-1001 over
the same (L2-normalized) embeddings, every one a query, against faiss's ``IndexFlatIP`` in
the same process (tfdml first, so that its peak RSS increase is its own), and writes
``benchmarks/results/index_speed.md``: seconds, the ratio to faiss, tfdml's peak RSS
increase, and whether both return the same neighbours (up to ties).

    python benchmarks/retrieval_speed.py                    # about 5 minutes on 2 cores
    python benchmarks/retrieval_speed.py --num 6000 --classes 1100 --output ''
    python benchmarks/retrieval_speed.py --index           # about 6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time

from workers import cpu_name  # benchmarks/workers.py

METHODS = ("tfdml", "numpy", "sklearn", "faiss")
KS = (1, 10, 100, 1000)


def make_data(num, dim, classes, sigma, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num) % classes).astype(np.int32)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    x = centres[labels] + np.float32(sigma) * rng.standard_normal((num, dim), dtype=np.float32)
    return x, labels


def _recall_from_neighbours(idx, labels, ks):

    hits = labels[idx] == labels[:, None]
    return {k: float(hits[:, :k].any(axis=1).mean()) for k in ks}


def _drop_self(idx, kmax):
    """Removes each row's own index from a ``[N, kmax + 1]`` neighbour list."""
    import numpy as np

    rows = np.arange(len(idx))[:, None]
    keep = idx != rows
    # Rows where the query did not come back (ties) lose their last neighbour instead.
    keep[keep.all(axis=1), -1] = False
    return idx[keep].reshape(len(idx), kmax)


def run_tfdml(x, labels, ks):
    import tfdml

    return tfdml.metrics.recall_at_k(x, labels, ks)


def run_numpy(x, labels, ks, chunk=1024):
    import numpy as np

    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    kmax = max(ks)
    hits = np.zeros((len(x), len(ks)), dtype=bool)
    for start in range(0, len(x), chunk):
        scores = x[start : start + chunk] @ x.T
        rows = np.arange(len(scores))
        scores[rows, rows + start] = -np.inf
        top = np.argpartition(-scores, kmax - 1, axis=1)[:, :kmax]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        same = labels[top] == labels[start : start + chunk, None]
        for j, k in enumerate(ks):
            hits[start : start + chunk, j] = same[:, :k].any(axis=1)
    return {k: float(v) for k, v in zip(ks, hits.mean(axis=0), strict=True)}


def run_sklearn(x, labels, ks):
    from sklearn.neighbors import NearestNeighbors

    kmax = max(ks)
    nn = NearestNeighbors(n_neighbors=kmax + 1, algorithm="brute", metric="cosine").fit(x)
    _, idx = nn.kneighbors(x)
    return _recall_from_neighbours(_drop_self(idx, kmax), labels, ks)


def run_faiss(x, labels, ks):
    import faiss
    import numpy as np

    kmax = max(ks)
    x = np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, idx = index.search(x, kmax + 1)
    return _recall_from_neighbours(_drop_self(idx, kmax), labels, ks)


def index_vs_faiss(args):
    """Index.search against faiss.IndexFlatIP, top-k for each k of ``args.index_ks``."""
    import faiss
    import numpy as np

    import tfdml

    x, _ = make_data(args.num, args.dim, args.classes, args.sigma, args.seed)
    x = np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)
    rows = []
    for k in args.index_ks:
        before = _max_rss_mib()
        index = tfdml.search.Index("dot")
        index.add(x)
        start = time.perf_counter()
        scores, idx = index.search(x, k)
        ours = time.perf_counter() - start
        rss = _max_rss_mib() - before
        flat = faiss.IndexFlatIP(x.shape[1])
        flat.add(x)
        start = time.perf_counter()
        f_scores, f_idx = flat.search(x, k)
        theirs = time.perf_counter() - start
        # Same neighbours, up to the order of equal scores and rounding at the k-th place.
        same = float(np.mean(np.abs(np.sort(scores, axis=1) - np.sort(f_scores, axis=1))
                             <= 1e-5))
        rows.append(f"| {k} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} | {rss:.0f} | "
                    f"{100 * same:.2f} % |")
        print(rows[-1], file=sys.stderr, flush=True)
        del index, scores, idx, flat, f_scores, f_idx
    return rows


def _max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker(args):
    if args.worker == "tfdml":
        import tfdml  # noqa: F401  (import TensorFlow before the baseline reading)
    elif args.worker == "faiss":
        import faiss  # noqa: F401
    elif args.worker == "sklearn":
        import sklearn.neighbors  # noqa: F401
    x, labels = make_data(args.num, args.dim, args.classes, args.sigma, args.seed)
    before = _max_rss_mib()
    fn = globals()[f"run_{args.worker}"]
    start = time.perf_counter()
    recalls = fn(x, labels, tuple(args.ks))
    seconds = time.perf_counter() - start
    print(json.dumps({"method": args.worker, "seconds": seconds, "rss_before": before,
                      "rss_peak": _max_rss_mib(), "recall": recalls}))


def _versions():
    import numpy as np

    parts = [f"Python {platform.python_version()}", f"NumPy {np.__version__}"]
    for name, module in [("TensorFlow", "tensorflow"), ("Keras", "keras"),
                         ("scikit-learn", "sklearn"), ("faiss-cpu", "faiss")]:
        try:
            found = subprocess.run(
                [sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            version = found.stdout.strip().splitlines()[-1] if found.returncode == 0 else None
        except (OSError, IndexError):
            version = None
        parts.append(f"{name} {version or 'not installed'}")
    return ", ".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=60000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=11000)
    parser.add_argument("--sigma", type=float, default=2.6,
                        help="noise around the class centres (sets how hard retrieval is)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--output", default="benchmarks/results/retrieval_speed.md")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--index", action="store_true",
                        help="tfdml.search.Index against faiss IndexFlatIP (see above)")
    parser.add_argument("--index-ks", type=int, nargs="+", default=[101, 1001])
    cli = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.index:
        started = time.time()
        load_start = os.getloadavg()[0]
        rows = index_vs_faiss(args)
        lines = [
            "# tfdml.search.Index against faiss IndexFlatIP (`benchmarks/retrieval_speed.py`)",
            "",
            f"- command: `python benchmarks/retrieval_speed.py {shlex.join(cli)}`",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- machine: {os.cpu_count()} CPUs, {cpu_name()}; {_versions()}",
            f"- data: N = {args.num} L2-normalized float32 embeddings, D = {args.dim}; every "
            "embedding a query against all of them (itself included), dot product",
            f"- total run time: {time.time() - started:.0f} s; 1-minute load average "
            f"{load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
            "",
            "| k | tfdml s | faiss s | tfdml / faiss | tfdml peak RSS increase MiB | "
            "same scores |",
            "|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Seconds: one `search` of all N queries, `time.perf_counter`, tfdml then faiss in "
            "one process. Same scores: the share of sorted score rows that agree to 1e-5.",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        if args.output:
            out = args.output
            if out == "benchmarks/results/retrieval_speed.md":
                out = "benchmarks/results/index_speed.md"
            with open(out, "w") as f:
                f.write(text)
        return None

    started = time.time()
    load_start = os.getloadavg()[0]
    results = []
    for method in args.methods:
        print(f"running {method} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--worker", method, "--num", str(args.num),
               "--dim", str(args.dim), "--classes", str(args.classes), "--sigma",
               str(args.sigma), "--seed", str(args.seed), "--ks", *map(str, args.ks)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            error = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            results.append({"method": method, "error": f"exit {proc.returncode}: {error}"})
        else:
            results.append(json.loads(lines[-1]))
        print(f"  {results[-1]}", file=sys.stderr, flush=True)

    ks = [str(k) for k in args.ks]
    reference = next((r for r in results if r["method"] == "tfdml" and "error" not in r), None)
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    lines = [
        f"- command: `{shlex.join(['python', 'benchmarks/retrieval_speed.py', *cli])}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
        f"- machine: {cpus} CPUs ({usable} usable), {cpu_name()}; {_versions()}; "
        f"{platform.platform()}",
        f"- data: N = {args.num} float32 embeddings, D = {args.dim}, {args.classes} classes "
        f"(N / classes each, shuffled), class centre + {args.sigma} x standard normal noise, "
        f"seed {args.seed}; every embedding a query against all others (itself excluded), "
        "cosine",
        f"- total run time: {time.time() - started:.0f} s; 1-minute load average "
        f"{load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        "",
        "| method | seconds | peak RSS MiB | RSS increase MiB | "
        + " | ".join(f"R@{k}" for k in ks) + " | same recall as tfdml |",
        "|---|---:|---:|---:|" + "---:|" * len(ks) + ":---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['method']} | FAILED: {r['error']} |")
            continue
        recalls = [r["recall"][k] for k in ks]
        if reference is None:
            same = "?"
        else:
            diff = max(abs(r["recall"][k] - reference["recall"][k]) for k in ks)
            same = "yes" if diff == 0 else f"max diff {diff:.2e}"
        lines.append(
            f"| {r['method']} | {r['seconds']:.1f} | {r['rss_peak']:.0f} | "
            f"{r['rss_peak'] - r['rss_before']:.0f} | "
            + " | ".join(f"{100 * v:.2f}" for v in recalls) + f" | {same} |")
    lines += [
        "",
        "Seconds: the search and Recall@K only (data created before the clock starts), one run, "
        "`time.perf_counter`. Peak RSS: `ru_maxrss` of the worker process after the search "
        f"(includes the interpreter, the imported libraries and the "
        f"{args.num * args.dim * 4 / 2**20:.0f} MiB of embeddings). "
        "RSS increase: that peak minus the peak just before the search.",
    ]
    report = "\n".join(lines)
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write("# Recall@K speed and memory (`benchmarks/retrieval_speed.py`)\n\n")
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
