"""Resident memory of an approximate index whose embeddings are on disk, phase by phase.

Builds ``Index("cosine", approximate="IVF1024_HNSW32,PQ32", rerank=100, vectors="disk")``
from the clustered generator of ``ann.py`` (``--size`` x 96), then runs an exact search of
1,000 queries (the scan ``tune`` makes) and four approximate searches of 1,000 queries
(each re-ranking 100 candidates per query from the rows on disk), and prints the process's
peak and current resident memory (``VmHWM``, ``VmRSS``) after each phase. The rows file
(``size x 96 x 4`` bytes) is never mapped whole into the process: scans read it block by
block, gathers map a few pages at a time and drop them.

    python benchmarks/disk_rows_memory.py --output benchmarks/results/disk_rows_memory.md
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ann  # noqa: E402
from workers import write_report  # noqa: E402


def _memory():
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values


def main():
    import tfdml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2_000_000)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    rows = []
    index = tfdml.search.Index("cosine", approximate="IVF1024_HNSW32,PQ32", rerank=100,
                               vectors="disk")
    index.add(ann.batches(args.size, 96, 2000, 0, 1, "cosine"))
    rows.append(("built from the generator", _memory()))
    queries = np.concatenate([x for x, _ in ann.batches(1000, 96, 2000, 0, 3, "cosine")])
    index.exact_search(queries, 10)
    rows.append(("exact search of 1,000 queries (a scan of the file)", _memory()))
    index.tune(queries + np.float32(1e-3), 10, 0.9)
    rows.append(("tune to recall@10 0.9", _memory()))
    for _ in range(4):
        index.search(queries, 10)
    rows.append(("4 searches of 1,000 queries, re-ranking 100 each", _memory()))
    file_mib = args.size * 96 * 4 / 2**20
    lines = [f"# Resident memory, {args.size:,} x 96 embeddings on disk ({file_mib:,.0f} MiB "
             "file)", "", "| after | peak (VmHWM) MiB | now (VmRSS) MiB |", "|---|---:|---:|"]
    lines += [f"| {name} | {m['VmHWM']:,.0f} | {m['VmRSS']:,.0f} |" for name, m in rows]
    lines += ["", f"Parameters after `tune`: {index.parameters}.",
              f"Command: `python benchmarks/disk_rows_memory.py --size {args.size}`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        write_report(text, args.output)


if __name__ == "__main__":
    main()
