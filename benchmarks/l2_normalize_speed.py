"""What the exact rule of `tfdml.ops.l2_normalize` costs against `tf.math.l2_normalize`'s.

`tfdml.ops.l2_normalize(x)` gives every non-zero finite row unit norm, rows of subnormal
entries included (read from their bits, since XLA and TensorFlow's CPU kernels treat
subnormal numbers as 0). `tfdml.ops.l2_normalize(x, epsilon=1e-12)` is the former rule
(`x / sqrt(max(|x|^2, epsilon))`, the same max-abs scaling, no bits). This times both on
the same `[B, D]` float32 input, in the same process and alternating rounds (the best round
and the medians, results fetched to NumPy), for

* `normalize`: the function alone, forward;
* `normalize+grad`: `sum(l2_normalize(x) * w)` and its gradient;
* `triplet_nca+grad`: `TripletNCALoss()` (all pairs, its default) and its gradient, with
  the loss's normalization swapped for each rule (what a training step sees);

not compiled (TensorFlow: `normalize` eagerly, the gradients in a `tf.function`; JAX: only
`normalize`, eagerly; PyTorch: eagerly) and compiled (`tf.function(jit_compile=True)`,
`jax.jit`; not on PyTorch).
Run it once per backend:

    KERAS_BACKEND=tensorflow python benchmarks/l2_normalize_speed.py
    KERAS_BACKEND=jax python benchmarks/l2_normalize_speed.py --output benchmarks/results/...

Options: `--sizes B:D [B:D ...]` (default 256:128 4096:512), `--rounds N` (default 30),
`--output FILE` (default `benchmarks/results/l2_normalize_speed_<backend>.md`; `''` none).
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))


def _timer(fn, args, to_numpy):
    """A function timing ``calls`` calls of ``fn`` (the last result fetched), per call;
    ``calls`` chosen so that a round takes about 20 ms."""
    def run(calls):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        to_numpy(out)
        return (time.perf_counter() - start) / calls

    run(1)
    once = run(1)  # tracing / compiling, then a warm call
    calls = max(1, min(200, int(0.02 / max(once, 1e-6))))
    return lambda: run(calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["256:128", "4096:512"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--output", default=None)
    options = parser.parse_args()

    import keras
    import numpy as np
    from backends import BACKEND, CAN_COMPILE, compiled, to_numpy, value_and_grad_function
    from keras import ops

    import tfdml
    from tfdml import ops as dml

    exact = dml.l2_normalize
    former = functools.partial(exact, epsilon=1e-12)
    rules = {"exact": exact, "epsilon=1e-12": former}

    def build(case, rule, jit, x, w, labels, loss):
        """The timed function of ``case`` with normalization ``rule``."""
        if case == "normalize":
            return compiled(rule) if jit else rule

        def objective(v):
            if case == "normalize+grad":
                return ops.sum(rule(v) * w)
            dml.l2_normalize = rule  # the loss's normalization, while it is traced
            try:
                return loss(labels, v)
            finally:
                dml.l2_normalize = exact

        return value_and_grad_function(objective, jit_compile=jit)

    load_before = os.getloadavg()[0]
    rows = []
    rng = np.random.default_rng(0)
    for size in options.sizes:
        batch, dim = (int(v) for v in size.split(":"))
        x = ops.convert_to_tensor(rng.normal(size=(batch, dim)).astype("float32"))
        w = ops.convert_to_tensor(rng.normal(size=(batch, dim)).astype("float32"))
        labels = ops.convert_to_tensor(np.repeat(np.arange(batch // 4), 4).astype("int32"))
        loss = tfdml.losses.TripletNCALoss()
        modes = ["not compiled", "compiled"] if CAN_COMPILE else ["not compiled"]
        for case in ("normalize", "normalize+grad", "triplet_nca+grad"):
            if batch > 1024 and case == "triplet_nca+grad":
                continue
            for mode in modes:
                if mode == "not compiled" and BACKEND == "jax" and case != "normalize":
                    continue  # eager JAX compiles every op once: not a training step
                timers = {
                    name: _timer(build(case, rule, mode == "compiled", x, w, labels, loss),
                                 (x,), to_numpy)
                    for name, rule in rules.items()}
                times = {name: [] for name in rules}
                for i in range(options.rounds):
                    order = list(rules) if i % 2 == 0 else list(reversed(rules))
                    for name in order:
                        times[name].append(timers[name]())
                best = {name: min(t) * 1e3 for name, t in times.items()}
                medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                rows.append((f"{batch}x{dim}", case, mode, best["exact"], best["epsilon=1e-12"],
                             best["exact"] / best["epsilon=1e-12"],
                             medians["exact"] / medians["epsilon=1e-12"]))
                print(rows[-1], file=sys.stderr)

    module = __import__(BACKEND)
    lines = [
        f"# `benchmarks/l2_normalize_speed.py`: the exact rule vs `epsilon=1e-12` ({BACKEND}, "
        "CPU)",
        "",
        f"Command: `KERAS_BACKEND={BACKEND} python benchmarks/l2_normalize_speed.py "
        f"--sizes {' '.join(options.sizes)} --rounds {options.rounds}`",
        "",
        f"{BACKEND} {module.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs "
        f"({platform.machine()}), float32; {options.rounds} alternating rounds of about 20 ms "
        "each; the times are the best round's, per call. "
        f"Load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after: "
        "on a shared machine compare the ratios, not the times.",
        "",
        "| B x D | timed | mode | exact ms | epsilon=1e-12 ms | ratio (best) | ratio (median) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {b} | {case} | {mode} | {new:.3f} | {old:.3f} | {ratio:.2f} | {mid:.2f} |"
              for b, case, mode, new, old, ratio, mid in rows]
    report = "\n".join(lines) + "\n"
    print(report)
    output = options.output
    if output is None:
        output = str(ROOT / "benchmarks" / "results" / f"l2_normalize_speed_{BACKEND}.md")
    if output:
        pathlib.Path(output).write_text(report)


if __name__ == "__main__":
    main()
