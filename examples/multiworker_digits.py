"""Multi-worker training on one machine: two processes, MultiWorkerMirroredStrategy, digits.

Starts ``--workers`` processes of ``examples/extreme_triplet/train.py`` on scikit-learn's
digits (2nd-order triplet NCA with EPHN mining, the tiny CNN), each with its own
``TF_CONFIG`` naming the same cluster of loopback ports, and ``--strategy multiworker``.
Every worker draws the same global P x K batches; each trains on its slice, the loss
gathers the embeddings of all workers (cross-replica mining) and the gradients are summed
over the workers, so all workers must end with identical weights. The script waits for
them (at most ``--timeout`` seconds), then compares the weights the workers saved after
their last epoch and writes ``report.json`` to ``--output-dir``.

    python examples/multiworker_digits.py                        # 2 workers, 2 epochs x 5 steps
    python examples/multiworker_digits.py --workers 3 --epochs 1 --output-dir /tmp/mw

The same launch by hand, one shell per worker (indexes 0 and 1)::

    export TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                       "task": {"type": "worker", "index": 0}}'
    python examples/extreme_triplet/train.py --dataset digits --strategy multiworker ...

Unless ``--no-single``, the same training also runs in one process on one device, and the
report gives the largest difference between its weights and the workers'. Exit status 0
when every worker finished and all workers' weights agree to 1e-6.

The report's ``recall@1`` (each worker's, on the digits 6-9, never seen in training) stands
next to two baselines on the same test images: ``raw_pixels_recall@1`` (cosine on the pixel
values, no learning) and ``untrained_recall@1`` (the same network with the same seed, before
training). The raw pixels are the best of the three on these digits: the run checks that
the workers train as one device does, not that training helps (the glyph benchmark,
``examples/glyphs/demo.py``, measures that).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np

from tfdml._files import write_json  # whole or not at all

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

HERE = pathlib.Path(__file__).resolve().parent
TRAIN = HERE / "extreme_triplet" / "train.py"
DIGITS = ["--dataset", "digits", "--backbone", "tiny", "--weights", "none", "--image-size", "8",
          "--resize-size", "8", "--transform", "none", "--embedding-dim", "32", "--lr", "0.05",
          "--batch-size", "24", "--group-size", "4", "--no-export", "--verbose", "2"]


def baselines():
    """Recall@1 on the workers' test images without training: the raw pixels and the network
    with the workers' flags and seed, untrained."""
    import keras

    import tfdml

    spec = importlib.util.spec_from_file_location("extreme_triplet_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    args = train.resolve_args(train.make_parser(), DIGITS)
    data = experiments.load_data(args)
    test = data.evaluation["test"]
    raw = tfdml.metrics.recall_at_k(test.images.reshape(len(test), -1).astype("float32"),
                                    test.labels, ks=(1,))[1]
    _, eval_fn = experiments.transforms(args)
    keras.utils.set_random_seed(args.seed)  # as the training scripts do before building it
    untrained = experiments.evaluate(experiments.build_model(args), data, eval_fn,
                                     args.eval_batch_size)
    return {"raw_pixels_recall@1": float(raw),
            "untrained_recall@1": float(untrained.values["val_recall@1"])}


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=5)
    parser.add_argument("--output-dir", default="runs/multiworker-digits")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-single", action="store_true",
                        help="skip the one-process run the workers' weights are compared with")
    args = parser.parse_args(argv)
    for name in ("workers", "epochs", "steps_per_epoch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    out = pathlib.Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cluster = [f"localhost:{p}" for p in free_ports(args.workers)]
    procs, logs = [], []
    start = time.time()
    for index in range(args.workers):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg",
                   CUDA_VISIBLE_DEVICES="", TF_CONFIG=json.dumps(
                       {"cluster": {"worker": cluster},
                        "task": {"type": "worker", "index": index}}))
        cmd = [sys.executable, str(TRAIN), *DIGITS, "--strategy", "multiworker",
               "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps_per_epoch),
               "--output-dir", str(out / f"worker{index}")]
        log = open(out / f"worker{index}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    print(f"{args.workers} workers on {', '.join(cluster)}; logs in {out}/worker*.log",
          flush=True)
    single = None
    if not args.no_single:  # the same training in one process, one device, for comparison
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg",
                   CUDA_VISIBLE_DEVICES="")
        env.pop("TF_CONFIG", None)
        single = subprocess.Popen(
            [sys.executable, str(TRAIN), *DIGITS, "--epochs", str(args.epochs),
             "--steps-per-epoch", str(args.steps_per_epoch), "--output-dir", str(out / "single")],
            env=env, stdout=open(out / "single.log", "w"), stderr=subprocess.STDOUT)
        procs.append(single)
    codes = []
    for proc in procs:
        remaining = max(1.0, args.timeout - (time.time() - start))
        try:
            codes.append(proc.wait(timeout=remaining))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes.append("timeout")
    for log in logs:
        log.close()
    report = {"workers": args.workers, "cluster": cluster, "exit_codes": codes,
              "seconds": round(time.time() - start, 1)}
    ok = all(c == 0 for c in codes)
    if ok:
        ckpt = f"backup/ckpt-{args.epochs}/model.weights.h5"
        weights = [experiments.saved_arrays(out / f"worker{i}" / ckpt) for i in range(args.workers)]
        diffs = {name: max(float(np.abs(w[name] - weights[0][name]).max()) for w in weights)
                 for name in weights[0]}
        report["variables"] = len(diffs)
        report["max_difference_between_workers"] = max(diffs.values())
        if single is not None:  # same batches on one device: the same training
            one = experiments.saved_arrays(out / "single" / ckpt)
            report["max_difference_to_one_device"] = max(
                float(np.abs(one[name] - weights[0][name]).max()) for name in weights[0])
        results = [json.loads((out / f"worker{i}" / "results.json").read_text())
                   for i in range(args.workers)]
        report["recall@1"] = [r["metrics"]["val_recall@1"] for r in results]
        report.update(baselines())
        report["loss_per_epoch"] = [[h["loss"] for h in r["history"]] for r in results]
        ok = bool(diffs) and report["max_difference_between_workers"] <= 1e-6
    report["same_weights"] = ok
    write_json(out / "report.json", report)
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
