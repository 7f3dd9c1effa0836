"""One training step under MirroredStrategy on R logical CPUs vs one device (run as a script).

    python tests/distribute_check.py --replicas 2 --losses nca-ephn ms loop-triplet

Prints one JSON line: per loss, the loss reported by ``fit`` and the updated weights on one
device, and under the strategy with (``cross``) and without (``local``) cross-replica
gathering.
Logical devices must be configured before TensorFlow initializes, hence a process of
its own (``tests/test_distribute.py`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def split_cpu(replicas):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])


def make_loss(name):
    import tfdml

    if name == "nca-ephn":
        return tfdml.losses.TripletNCALoss(order=2, miner=tfdml.miners.TripletMiner("easy", "hard"))
    if name == "nca1-ephn":
        return tfdml.losses.TripletNCALoss(order=1, miner=tfdml.miners.TripletMiner("easy", "hard"))
    if name == "ms":
        return tfdml.losses.MultiSimilarityLoss()
    if name == "supcon-graded":
        return tfdml.losses.SupConLoss(graded=True)
    if name == "loop-triplet":
        return tfdml.losses.LoOpLoss("triplet", margin=0.2)
    if name == "margin-semihard-sum":
        return tfdml.losses.TripletMarginLoss(
            miner=tfdml.miners.TripletMiner("all", "semihard"), reduction="sum")
    raise ValueError(name)


def make_model(weights=None):
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(6)])
    if weights is not None:
        model.set_weights(weights)
    return model


def batch(batch_size, classes, seed, multi_label=False):
    import numpy as np

    rng = np.random.default_rng(seed)
    # P x K with the classes' samples consecutive (as tfdml.data.pk_batches gives them).
    labels = np.repeat(rng.permutation(100)[:classes], batch_size // classes).astype("int64")
    x = rng.normal(size=(batch_size, 8)).astype("float32")
    if multi_label:  # [B, 6] label sets: the class's label (mod 5) and, for some, label 5
        hot = np.eye(6, dtype="int64")[labels % 5]
        hot[rng.random(batch_size) < 0.4, 5] = 1
        return x, hot
    return x, labels


def train_step(model, loss, x, y):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, jit_compile=False)
    ds = tf.data.Dataset.from_tensors((x, y))
    history = model.fit(ds, epochs=1, verbose=0, shuffle=False)
    return float(history.history["loss"][0]), [w.tolist() for w in model.get_weights()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--losses", nargs="+", default=["nca-ephn", "ms", "loop-triplet"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multi-label", action="store_true",
                        help="[B, L] multi-hot label sets instead of class ids")
    parser.add_argument("--modes", nargs="+", default=["cross", "local"],
                        help="cross: gather across replicas (default); local: cross_replica=False")
    args = parser.parse_args()
    split_cpu(args.replicas)
    import keras

    keras.utils.set_random_seed(args.seed)
    x, y = batch(args.batch_size, args.classes, args.seed, args.multi_label)
    initial = make_model().get_weights()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][: args.replicas]
    strategy = tf.distribute.MirroredStrategy(devices)
    out = {"replicas": strategy.num_replicas_in_sync, "runs": {}}
    for name in args.losses:
        one_loss, one_weights = train_step(make_model(initial), make_loss(name), x, y)
        run = {"one_loss": one_loss, "one_weights": one_weights}
        for mode in args.modes:
            with strategy.scope():
                model = make_model(initial)
                loss = make_loss(name)
                loss.cross_replica = None if mode == "cross" else False
                run[f"{mode}_loss"], run[f"{mode}_weights"] = train_step(model, loss, x, y)
        out["runs"][name] = run
    # Evaluation of a model built under the strategy: the callback and the metrics.
    import numpy as np

    import tfdml

    with strategy.scope():
        model = make_model(initial)
        model.compile(optimizer="sgd", loss=make_loss("nca-ephn"), jit_compile=False)
    recall = tfdml.callbacks.RecallAtK((x, y), ks=(1, 2), verbose=0)
    recall.set_model(model)
    emb = make_model(initial).predict(x, verbose=0)
    out["recall_callback"] = recall.evaluate()
    out["recall_one_device"] = {f"val_recall@{k}": v for k, v in
                                tfdml.metrics.recall_at_k(emb, y, (1, 2)).items()}
    out["recall_predict_matches"] = bool(np.allclose(model.predict(x, verbose=0), emb,
                                                     atol=1e-6))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
