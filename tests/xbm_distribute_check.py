"""CrossBatchMemory under MirroredStrategy vs one device (run as a script).

    python tests/xbm_distribute_check.py --replicas 2

Trains ``MetricModel(model, CrossBatchMemory(ContrastiveLoss(), memory_size=2 B))`` for
four global batches of ``B`` on one device and under the strategy (each replica a slice),
and prints one JSON line: the bank (labels, embeddings, counters) and the weights of both.
Logical devices must be configured before TensorFlow initializes, hence a process of its
own (``tests/test_distribute.py`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from distribute_check import batch, make_model, split_cpu  # noqa: E402

BATCH, STEPS = 8, 4


def train(weights, data, strategy=None):
    import keras

    import tfdml

    with strategy.scope() if strategy else tf.name_scope("one"):
        loss = tfdml.losses.CrossBatchMemory(tfdml.losses.ContrastiveLoss(),
                                             memory_size=2 * BATCH)
        model = tfdml.models.MetricModel(make_model(weights), loss)
        model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=False)
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    bank = loss.bank
    return {
        "labels": np.asarray(bank.labels.numpy()).tolist(),
        "embeddings": np.asarray(bank.embeddings.numpy()).tolist(),
        "counters": [int(bank.position.numpy()), int(bank.filled.numpy()),
                     int(bank.steps.numpy())],
        "weights": [w.tolist() for w in model.embedder.get_weights()],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    split_cpu(args.replicas)
    weights = make_model().get_weights()
    batches = [batch(BATCH, 4, seed) for seed in range(STEPS)]
    data = tf.data.Dataset.from_tensor_slices(
        (np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])))
    data = data.batch(BATCH)
    one = train(weights, data)
    mirrored = train(weights, data, tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(args.replicas)]))
    labels = np.concatenate([y for _, y in batches[-2:]]).tolist()
    print(json.dumps({"one": one, "mirrored": mirrored, "last_labels": labels}))


if __name__ == "__main__":
    main()
