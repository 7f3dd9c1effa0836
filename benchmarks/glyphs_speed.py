"""How long `tfdml.datasets.load("glyphs", ...)` takes to draw its images, and its memory.

Draws each configuration `--rounds` times in this process (the best and the median wall
time, and the images per second) and reports the peak resident memory of the process after
all of them. The configurations: the benchmark's two splits at their defaults (600 + 400
characters, 20 drawings, 28 x 28), all 1,000 characters at once, an Omniglot-sized set
(1,623 characters x 20 drawings), and larger images (64 x 64).

    python benchmarks/glyphs_speed.py                 # writes benchmarks/results/glyphs_speed.md
    python benchmarks/glyphs_speed.py --rounds 5 --output ''

Needs only NumPy and tfdml (no TensorFlow is used by the drawing itself).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np
from workers import write_report  # benchmarks/workers.py

CONFIGS = (
    ("train split (defaults)", dict(split="train")),
    ("test split (defaults)", dict(split="test")),
    ("all 1,000 characters", dict(split="all")),
    ("Omniglot-sized: 1,623 x 20", dict(split="all", num_classes=1623)),
    ("64 x 64, 1,000 characters", dict(split="all", image_size=64)),
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "glyphs_speed.md"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    from tfdml.datasets import load_glyphs

    rows = []
    for title, config in CONFIGS:
        config = dict(config)
        split = config.pop("split")
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            ds = load_glyphs(split, **config)
            times.append(time.perf_counter() - start)
        n = len(ds)
        assert np.isfinite(ds.images).all()
        rows.append((title, n, ds.images.shape[1], min(times), statistics.median(times),
                     n / min(times)))
        print(f"{title}: {n} images in {min(times):.2f} s (best of {args.rounds})", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        "# `benchmarks/glyphs_speed.py`: drawing the glyphs data set",
        "",
        f"Command: `python benchmarks/glyphs_speed.py --rounds {args.rounds}`",
        "",
        f"NumPy {np.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs "
        f"({platform.machine()}); best and median of {args.rounds} rounds in one process; "
        f"peak resident memory of the process {peak:.0f} MiB. A shared machine: compare "
        "ratios, not times.",
        "",
        "| configuration | images | size | best s | median s | images / s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {t} | {n:,} | {s} x {s} | {b:.2f} | {m:.2f} | {r:,.0f} |"
              for t, n, s, b, m, r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        write_report(text, args.output)
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
