"""What query batches of varying sizes cost tfdml.search.Index under JAX, with and without buckets.

JAX compiles each operation again for each new input shape, so a search with a new number
of queries used to compile the whole search again (about 1.5 s on a CPU). With query
buckets (``Index(query_buckets=True)``, the default under JAX) each chunk of queries is
padded to one of a few sizes (powers of two from 16 to ``chunk_size``), so varying sizes
compile a handful of shapes once.

Each run is a fresh worker process (this script started again with ``--worker``): it
builds the same seeded gallery (``--num`` x ``--dim`` standard-normal float32, cosine by
default), adds it to an index (not timed), then times ``--searches`` searches (top
``--k``) one after the other, compilation included, as a service started afresh sees them:

* ``varying``: sizes drawn uniformly from 1 to ``--max-size`` (seeded);
* ``same``: every search of one size, the varying sizes' mean rounded, so both scenarios
  make the same number of searches and (to within ``--searches / 2`` queries) the same
  total number of queries.

Variants: ``head``, the search of the last commit (``git show HEAD:tfdml/search.py``,
imported from a temporary file; the code before the buckets when run before committing
them), ``off`` (``query_buckets=False``) and ``on`` (``query_buckets=True``). The report
gives the seconds of all searches, of the first, the median of the others, the ratio of
varying to same, and checks that every variant returns the same neighbours as ``head``.

    KERAS_BACKEND=jax python benchmarks/search_query_sizes.py      # about 11 minutes on 2 cores
    KERAS_BACKEND=jax python benchmarks/search_query_sizes.py --num 2000 --searches 10 --output ''
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

from workers import cpu_name, write_report  # benchmarks/workers.py

VARIANTS = ("head", "off", "on")
SCENARIOS = ("varying", "same")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sizes_of(args):
    """``(varying, same)``: the query counts of the searches of each scenario."""
    import numpy as np

    varying = np.random.default_rng(args.seed).integers(1, args.max_size + 1, args.searches)
    same = np.full(args.searches, int(round(varying.mean())))
    return varying.tolist(), same.tolist()


def _search_module(variant, tmp):
    """``tfdml.search``, or for ``head`` the file of the last commit imported on its own."""
    if variant != "head":
        import tfdml.search

        return tfdml.search
    source = subprocess.run(["git", "show", "HEAD:tfdml/search.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = os.path.join(tmp, "search_head.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("search_head", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(args):
    import numpy as np

    sizes = sizes_of(args)[SCENARIOS.index(args.scenario)]
    with tempfile.TemporaryDirectory() as tmp:
        search = _search_module(args.worker, tmp)
        kwargs = {} if args.worker == "head" else {"query_buckets": args.worker == "on"}
        rng = np.random.default_rng(args.seed + 1)
        gallery = rng.standard_normal((args.num, args.dim), dtype=np.float32)
        index = search.Index(args.metric, **kwargs)
        start = time.perf_counter()
        index.add(gallery)
        add_seconds = time.perf_counter() - start
        queries = [rng.standard_normal((n, args.dim), dtype=np.float32) for n in sizes]
        seconds, found = [], []
        for q in queries:
            start = time.perf_counter()
            _, idx = index.search(q, args.k)
            seconds.append(time.perf_counter() - start)
            found.append(idx)
    np.save(args.save, np.concatenate(found))
    print(json.dumps({"variant": args.worker, "scenario": args.scenario, "seconds": seconds,
                      "add_seconds": add_seconds, "queries": int(sum(sizes)),
                      "distinct_sizes": len(set(sizes))}))


def _versions():
    import numpy as np

    parts = [f"Python {platform.python_version()}", f"NumPy {np.__version__}"]
    for name, module in [("Keras", "keras"), ("JAX", "jax"), ("jaxlib", "jaxlib")]:
        found = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                               capture_output=True, text=True)
        lines = found.stdout.strip().splitlines()
        parts.append(f"{name} {lines[-1] if found.returncode == 0 and lines else 'not installed'}")
    return ", ".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=20000, help="gallery size")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--metric", default="cosine")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--searches", type=int, default=100)
    parser.add_argument("--max-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=["head", "on"], choices=VARIANTS)
    parser.add_argument("--output", default="benchmarks/results/search_query_sizes.md")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    cli = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    import numpy as np

    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    started = time.time()
    load_start = os.getloadavg()[0]
    varying, same = sizes_of(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            for scenario in SCENARIOS:
                print(f"running {variant} {scenario} ...", file=sys.stderr, flush=True)
                save = os.path.join(tmp, f"{variant}_{scenario}.npy")
                cmd = [sys.executable, __file__, "--worker", variant, "--scenario", scenario,
                       "--save", save, "--num", str(args.num), "--dim", str(args.dim),
                       "--metric", args.metric, "--k", str(args.k), "--searches",
                       str(args.searches), "--max-size", str(args.max_size), "--seed",
                       str(args.seed)]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode != 0 or not lines:
                    error = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                    results[variant, scenario] = {"error": f"exit {proc.returncode}: {error}"}
                else:
                    results[variant, scenario] = json.loads(lines[-1])
                    results[variant, scenario]["indices"] = np.load(save)
                summary = {key: value for key, value in results[variant, scenario].items()
                           if key not in ("seconds", "indices")}
                print(f"  {summary}", file=sys.stderr, flush=True)

    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    lines = [
        "# tfdml.search.Index: query batches of varying sizes (`benchmarks/search_query_sizes.py`)",
        "",
        f"- command: `{shlex.join(['KERAS_BACKEND=' + backend, 'python', 'benchmarks/search_query_sizes.py', *cli])}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
        f"- machine: {cpus} CPUs ({usable} usable), {cpu_name()}; {_versions()}; "
        f"{platform.platform()}",
        f"- gallery: {args.num} x {args.dim} standard-normal float32, metric {args.metric!r}, "
        f"top-{args.k}, default chunk sizes; seed {args.seed}",
        f"- varying: {args.searches} searches of sizes uniform in 1..{args.max_size} "
        f"({len(set(varying))} distinct, {sum(varying)} queries); same: {args.searches} "
        f"searches of {same[0]} queries ({sum(same)} queries): the same count of searches",
        f"- total run time: {time.time() - started:.0f} s; 1-minute load average "
        f"{load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        "",
        "| variant | scenario | all searches s | first s | median of the others s | "
        "varying / same | same neighbours as head |",
        "|---|---|---:|---:|---:|---:|:---:|",
    ]
    for variant in args.variants:
        totals = {}
        for scenario in SCENARIOS:
            r = results[variant, scenario]
            if "error" in r:
                lines.append(f"| {variant} | {scenario} | FAILED: {r['error']} |")
                continue
            totals[scenario] = sum(r["seconds"])
            ratio = ""
            if scenario == "same" and "varying" in totals:
                ratio = f"{totals['varying'] / totals['same']:.2f}"
            ref = results.get(("head", scenario), {}).get("indices")
            here = r["indices"]
            same_found = "?" if ref is None else (
                f"{(ref == here).all(axis=1).mean():.2%} of rows")
            lines.append(
                f"| {variant} | {scenario} | {totals[scenario]:.1f} | {r['seconds'][0]:.2f} | "
                f"{float(np.median(r['seconds'][1:] or [0.0])):.3f} | {ratio} | {same_found} |")
    lines += [
        "",
        "Seconds: `time.perf_counter` around each `Index.search` in a fresh worker process "
        "per row, compilation included (`Index.add` of the gallery before, not timed). "
        "varying / same: all searches of varying sizes over all searches of one size, same "
        "variant. Same neighbours: the share of query rows whose top-k indices equal those "
        "of `head` (the last commit's search) in the same scenario.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        write_report(text, args.output)
    return None


if __name__ == "__main__":
    main()
