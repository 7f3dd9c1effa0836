"""What `jit_compile=True` costs and gives on Keras' PyTorch backend (`torch.compile`).

Trains the demo's model (`examples/digits_demo.py`: a 16-d linear embedding of the digits,
`TripletNCALoss(order=2)` with EPHN mining, `PKDataset` batches of 6 x 8) for E epochs of S
steps, eagerly (`jit_compile=False`) and with `jit_compile=True`, each in a fresh process,
and reports the time of the first epoch (which holds the compilation), the median time of
the later epochs, and the total. Run it with the PyTorch backend:

    KERAS_BACKEND=torch python benchmarks/torch_compile.py [--epochs 10] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def worker(jit_compile, epochs, steps):
    import keras

    import tfdml

    sys.path.insert(0, str(ROOT / "examples"))
    from digits_demo import build_model

    keras.utils.set_random_seed(0)
    train = tfdml.datasets.load("digits", "train", dtype="float32")
    model = build_model("linear", 16)
    loss = tfdml.losses.TripletNCALoss(order=2, miner=tfdml.miners.TripletMiner("easy", "hard"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, jit_compile=jit_compile)
    times = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    start = time.perf_counter()
    history = model.fit(tfdml.data.PKDataset(train, 6, 8, seed=0), epochs=epochs,
                        steps_per_epoch=steps, shuffle=False, verbose=0, callbacks=[Clock()])
    total = time.perf_counter() - start
    print(json.dumps({"jit_compile": jit_compile, "first": times[0],
                      "later": statistics.median(times[1:]), "total": total,
                      "loss": history.history["loss"][-1]}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--worker", choices=("eager", "compiled"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker == "compiled", args.epochs, args.steps)
        return
    env = dict(os.environ, KERAS_BACKEND="torch")
    rows = []
    for mode in ("eager", "compiled", "eager", "compiled"):
        out = subprocess.run([sys.executable, __file__, "--worker", mode, "--epochs",
                              str(args.epochs), "--steps", str(args.steps)], env=env,
                             capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    import torch

    print(f"PyTorch {torch.__version__}, {os.cpu_count()} CPUs; {args.epochs} epochs x "
          f"{args.steps} steps of the demo's model\n")
    print("| jit_compile | first epoch s | later epochs s (median) | total s | final loss |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['jit_compile']} | {row['first']:.2f} | {row['later']:.3f} | "
              f"{row['total']:.1f} | {row['loss']:.4f} |")


if __name__ == "__main__":
    main()
