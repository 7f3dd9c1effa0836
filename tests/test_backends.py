"""The core under other Keras backends: importing without TensorFlow, JAX data parallelism."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # subprocesses or several processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code_or_path, env_extra, timeout=600):
    env = dict(os.environ, **env_extra)
    env.pop("XLA_FLAGS", None)
    args = [sys.executable, code_or_path] if code_or_path.endswith(".py") else [
        sys.executable, "-c", code_or_path]
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_core_imports_and_trains_under_jax_without_tensorflow():
    """`import tfdml.losses` (and the rest of the core) with KERAS_BACKEND=jax and no TensorFlow.

    TensorFlow is made unimportable in the child process (``sys.modules["tensorflow"] =
    None``), as in an environment where it is not installed.
    """
    pytest.importorskip("jax")
    code = textwrap.dedent("""
        import sys
        sys.modules["tensorflow"] = None  # any `import tensorflow` now fails
        import numpy as np
        import tfdml.losses, tfdml.miners, tfdml.metrics, tfdml.layers
        import tfdml.geometry, tfdml.analysis, tfdml.models, tfdml.callbacks
        import keras
        import tfdml
        x = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
        y = np.repeat(np.arange(4), 4)
        value = float(tfdml.losses.TripletNCALoss(order=2)(y, x))
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                                  tfdml.layers.L2Normalization()])
        model.compile("sgd", tfdml.losses.MultiSimilarityLoss(), jit_compile=True)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        recall = tfdml.metrics.recall_at_k(x, y, ks=(1,))
        index = tfdml.search.Index()
        index.add(x, labels=y)
        assert index.lookup(x[:2], k=1).indices[:, 0].tolist() == [0, 1]
        errors = []
        for name in ("export", "compat"):
            try:
                getattr(tfdml, name)  # first use of a TensorFlow module
            except ImportError as err:
                errors.append(str(err))
        for name in ("pk_batches", "eval_batches", "augment"):
            try:
                getattr(tfdml.data, name)  # the tf.data parts of tfdml.data
            except ImportError as err:
                errors.append(str(err))
        try:
            import tfdml.export  # a direct import says the same
        except ImportError as err:
            errors.append(str(err))
        try:
            tfdml.datasets.load("cub200", "train", source="tfds")
        except ImportError as err:
            errors.append(str(err))
        batches = tfdml.data.PKDataset((x, y), 2, 2, seed=0)  # no TensorFlow needed
        model.fit(batches, epochs=1, steps_per_epoch=2, verbose=0)
        clear = len(errors) == 7 and all('pip install ".[cpu]"' in e for e in errors)
        print(keras.backend.backend(), value > 0, recall, clear)
    """)
    result = _run(code, {"KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    backend, positive, _, names_tf = result.stdout.split()[:2] + result.stdout.split()[-2:]
    assert backend == "jax" and positive == "True"
    assert names_tf == "True", result.stdout


def test_jax_data_parallel_step_equals_single_device_on_the_global_batch():
    """keras.distribution.DataParallel on 2 (host) devices: the loss sees the global batch."""
    pytest.importorskip("jax")
    result = _run(os.path.join(ROOT, "tests", "jax_data_parallel_check.py"), {})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 5, result.stdout
    # ContrastiveModel: SimCLR's negatives over the global batch; MoCo's target and queue.
    contrastive = rows.pop()["contrastive_weight_diff"]
    assert set(contrastive) == {"simclr", "moco"} and max(contrastive.values()) < 1e-5, (
        contrastive)
    xbm = rows.pop()
    # A CrossBatchMemory's bank holds the global batches, as on one device.
    assert xbm["xbm_labels"] == xbm["xbm_labels_distributed"] == xbm["labels"], xbm
    assert xbm["xbm_bank_diff"] < 1e-5 and xbm["xbm_weight_diff"] < 1e-5, xbm
    for row in rows:
        assert row["max_update"] > 1e-3, row  # the step did move the weights
        assert row["max_update_diff"] < 1e-5 * max(1.0, row["max_update"]), row
        assert abs(row["loss_single"] - row["loss_distributed"]) < 1e-5, row
        # Mining within each device's half would have given another loss.
        assert abs(row["loss_single"] - row["loss_per_device_mean"]) > 1e-3, row
