"""One training step under ``keras.distribution.DataParallel`` on 2 JAX devices equals one
step on a single device with the same global batch.

Run as a script (``tests/test_backends.py`` does, in a subprocess): the device count
must be set before JAX starts. Prints one JSON line per loss: the largest difference between the
two weight updates, the largest update, both loss values and, for contrast, the mean of the
loss computed on each device's half of the batch (what mining per device would give).
"""

import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2").strip()

import json  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdml  # noqa: E402

LOSSES = {
    "ephn_nca2": lambda: tfdml.losses.TripletNCALoss(order=2),
    "multi_similarity": lambda: tfdml.losses.MultiSimilarityLoss(),
    "triplet_semihard_all": lambda: tfdml.losses.TripletMarginLoss(
        miner=tfdml.miners.TripletMiner("all", "semihard")),
}


def one_step(make_loss, x, y, distributed):
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices()) if distributed else None)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(16)])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=make_loss(), jit_compile=True)
    initial = [np.asarray(w) for w in model.get_weights()]
    # A class's samples are spread over both halves of the global batch, so per-device
    # mining would see different positives and negatives.
    history = model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    after = [np.asarray(w) for w in model.get_weights()]
    return [a - b for a, b in zip(after, initial, strict=True)], history.history["loss"][0]


def xbm_steps(x, y, distributed):
    """Two steps of a MetricModel with a CrossBatchMemory: the bank and the weights."""
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices()) if distributed else None)
    keras.utils.set_random_seed(0)
    loss = tfdml.losses.CrossBatchMemory(tfdml.losses.ContrastiveLoss(), memory_size=len(x))
    model = tfdml.models.MetricModel(
        keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(16)]), loss)
    model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=True)
    model.fit(x, y, batch_size=len(x) // 2, epochs=1, shuffle=False, verbose=0)
    bank = loss.bank
    return (np.asarray(bank.labels).tolist(), np.asarray(bank.embeddings),
            [np.asarray(w) for w in model.get_weights()])


def contrastive_steps(algorithm, x, distributed):
    """Two steps of a ContrastiveModel (SimCLR's negatives, MoCo's momentum target and
    queue) on two views: its weights (the target's included) and its loss state."""
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices()) if distributed else None)
    keras.utils.set_random_seed(0)
    loss = tfdml.losses.MoCoLoss(queue_size=64, seed=0) if algorithm == "moco" else None
    model = tfdml.models.ContrastiveModel(
        keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(16)]),
        keras.Sequential([keras.layers.Dense(8)]), algorithm=algorithm, loss=loss)
    model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=True)
    views = (x, x[::-1] * 0.5 + 0.1)
    model.fit(x=views, batch_size=len(x) // 2, epochs=1, shuffle=False, verbose=0)
    return [np.asarray(v) for v in model.weights]


def main():
    assert len(jax.devices()) == 2, jax.devices()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 12)).astype("float32")
    y = np.tile(np.arange(8), 4).astype("int32")  # 8 classes x 4, interleaved
    for name, make_loss in LOSSES.items():
        single, loss_single = one_step(make_loss, x, y, distributed=False)
        multi, loss_multi = one_step(make_loss, x, y, distributed=True)
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(single, multi, strict=True))
        moved = max(float(np.max(np.abs(a))) for a in single)
        # What per-device mining would give: the mean of the loss on each half.
        keras.distribution.set_distribution(None)
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(16)])
        halves = [float(make_loss()(y[i::2], model(x[i::2]))) for i in (0, 1)]
        print(json.dumps({"loss": name, "max_update_diff": diff, "max_update": moved,
                          "loss_single": loss_single, "loss_distributed": loss_multi,
                          "loss_per_device_mean": float(np.mean(halves))}))
    labels, bank, weights = xbm_steps(x, y, distributed=False)
    labels_dp, bank_dp, weights_dp = xbm_steps(x, y, distributed=True)
    print(json.dumps({"xbm_labels": labels, "xbm_labels_distributed": labels_dp,
                      "xbm_bank_diff": float(np.max(np.abs(bank - bank_dp))),
                      "xbm_weight_diff": max(float(np.max(np.abs(a - b)))
                                             for a, b in zip(weights, weights_dp, strict=True)),
                      "labels": y.tolist()}))
    row = {}
    for algorithm in ("simclr", "moco"):
        single = contrastive_steps(algorithm, x, distributed=False)
        multi = contrastive_steps(algorithm, x, distributed=True)
        row[algorithm] = max(float(np.max(np.abs(a - b))) for a, b in zip(single, multi,
                                                                         strict=True))
    print(json.dumps({"contrastive_weight_diff": row}))


if __name__ == "__main__":
    main()
