"""What the benchmark scripts share: one configuration per worker process, and the machine line.

A script runs every configuration in a fresh process (itself, started again with
``--worker`` and the configuration's arguments), so that peak memory (``ru_maxrss``) and
compiled programs belong to that configuration alone. The worker prints one line, a prefix
and a JSON object; :func:`run_worker` returns that object, or ``{"error": ...}``.

A worker builds its batch with :func:`make_inputs` and reads its memory with
:func:`peak_rss_kib`; the driver logs with :func:`log` and writes its report with
:func:`write_report`.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys


def run_worker(script, args, prefix, timeout_s):
    """Runs ``script --worker *args`` and returns the JSON object after ``prefix`` on its stdout."""
    cmd = [sys.executable, os.path.abspath(script), "--worker", *map(str, args)]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout_s} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"worker exited with {proc.returncode}: " + " | ".join(tail)}


def cpu_name():
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform.processor`` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_info(results, memory=False):
    """The report's machine line: CPUs, model, (RAM), TensorFlow, Keras, Python, platform.

    ``results`` are ``(config, result)`` pairs; the versions come from a worker's result
    (``result["versions"]``), or from the installed packages when every worker failed.
    """
    versions = next((r["versions"] for _, r in results if "versions" in r), None)
    if versions is None:
        import keras
        import tensorflow as tf

        versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    ram = ""
    if memory:
        try:
            with open("/proc/meminfo") as f:
                ram = f", {int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
        except (OSError, ValueError, IndexError):
            pass
    return (
        f"{os.cpu_count()} CPUs ({usable} usable){ram}, {cpu_name()}; "
        f"TensorFlow {versions['tensorflow']}, Keras {versions['keras']}, "
        f"Python {platform.python_version()}; {platform.platform()}"
    )


def log(msg):
    """Prints ``msg`` to stderr at once (the report goes to stdout)."""
    print(msg, file=sys.stderr, flush=True)


def mib(kib):
    return kib / 1024.0


def peak_rss_kib() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def make_inputs(batch, dim, seed, samples_per_class):
    """``(labels [batch] int32, embeddings [batch, dim] float32)``: ``samples_per_class``
    samples of each of ``ceil(batch / samples_per_class)`` classes, shuffled, and
    standard-normal embeddings, drawn from ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    classes = -(-batch // samples_per_class)
    labels = np.repeat(np.arange(classes, dtype=np.int32), samples_per_class)[:batch]
    rng.shuffle(labels)
    embeddings = rng.standard_normal((batch, dim)).astype(np.float32)
    return labels, embeddings


def write_report(report, path):
    """Writes ``report`` to ``path`` (its folder created), whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(report)
    os.replace(tmp, path)
