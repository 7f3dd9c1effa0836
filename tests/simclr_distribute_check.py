"""One SimCLR step of a ContrastiveModel under MirroredStrategy on R logical CPUs vs one
device (run as a script by tests/test_distribute.py).

    python tests/simclr_distribute_check.py --replicas 2

Prints one JSON line: the loss ``fit`` reports and the updated weights on one device and
under the strategy (where the SimCLR loss gathers every replica's views, so that each row's
negatives are the other ``2 N_global - 2`` rows), and, for contrast, the loss each replica
would compute from its own views alone (the mean over the replicas' halves, on one device).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def split_cpu(replicas):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])


def make_model(weights=None, algorithm="simclr"):
    import keras

    import tfdml

    backbone = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                                 keras.layers.Dense(6)])
    projector = keras.Sequential([keras.layers.Dense(5)])
    predictor = None if algorithm == "simclr" else keras.Sequential([keras.layers.Dense(5)])
    model = tfdml.models.ContrastiveModel(backbone, projector, predictor, algorithm=algorithm,
                                          momentum=None if algorithm == "simclr" else 0.5)
    if weights is not None:
        model.set_weights(weights)
    return model


def train_step(model, views):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=False)
    history = model.fit(tf.data.Dataset.from_tensors((views,)), epochs=1, verbose=0,
                        shuffle=False)
    return float(history.history["loss"][0]), [w.tolist() for w in model.get_weights()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    split_cpu(args.replicas)
    import keras
    import numpy as np

    import tfdml

    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    first = rng.normal(size=(args.batch_size, 8)).astype("float32")
    views = (first, first + 0.3 * rng.normal(size=first.shape).astype("float32"))
    initial = make_model().get_weights()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][: args.replicas]
    strategy = tf.distribute.MirroredStrategy(devices)
    out = {"replicas": strategy.num_replicas_in_sync}
    out["one_loss"], out["one_weights"] = train_step(make_model(initial), views)
    with strategy.scope():
        out["mirrored_loss"], out["mirrored_weights"] = train_step(make_model(initial), views)
    # Each replica's own views only: the mean of the losses of the halves, on one device.
    model = make_model(initial)
    half = args.batch_size // args.replicas
    z = [model.projector(model.backbone(v)) for v in views]
    loss = tfdml.losses.SelfSupervisedLoss(tfdml.losses.NTXentLoss(temperature=0.1))
    parts = [float(loss(None, tf.concat([z[0][k * half:(k + 1) * half],
                                         z[1][k * half:(k + 1) * half]], 0)))
             for k in range(args.replicas)]
    out["per_replica_loss"] = float(np.mean(parts))
    # BYOL: the momentum update under the strategy, two steps.
    keras.utils.set_random_seed(args.seed)
    initial = make_model(algorithm="byol").get_weights()
    halves = tf.data.Dataset.from_tensor_slices(views).batch(args.batch_size // 2).map(
        lambda a, b: ((a, b),))
    for where in ("one", "mirrored"):
        scope = strategy.scope() if where == "mirrored" else contextlib.nullcontext()
        with scope:
            model = make_model(initial, "byol")
            model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=False)
        model.fit(halves, epochs=1, verbose=0, shuffle=False)
        out[f"byol_{where}_weights"] = [w.tolist() for w in model.get_weights()]
    # MoCo refuses the strategy (it does not gather the replicas' keys).
    with strategy.scope():
        model = tfdml.models.ContrastiveModel(
            make_model().backbone, keras.Sequential([keras.layers.Dense(5)]), algorithm="moco",
            loss=tfdml.losses.MoCoLoss(queue_size=64))
        model.compile(optimizer="sgd", jit_compile=False)
    try:
        model.fit(halves, epochs=1, verbose=0, shuffle=False)
        out["moco_error"] = None
    except ValueError as error:
        out["moco_error"] = str(error)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
