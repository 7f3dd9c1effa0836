"""Cross-replica mining: a MirroredStrategy step equals one device on the global batch."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # subprocesses or several processes

HERE = pathlib.Path(__file__).resolve().parent


def _script_result(script, *args):
    """The JSON of the last line that the check script ``tests/<script>`` prints, run with
    ``args`` on the CPU (its error output shown if it fails)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(HERE / script), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(replicas, losses, modes=("cross", "local"), extra=()):
    result = _script_result("distribute_check.py", "--replicas", str(replicas),
                            "--losses", *losses, "--modes", *modes, *extra)
    assert result["replicas"] == replicas
    return result


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(u) - np.asarray(v)).max()) for u, v in zip(a, b,
                                                                                    strict=True))


# The gathering across replicas is one wrapper for every loss (what differs between losses
# is how they mine the gathered batch): each loss runs once, under 2 or under 4 replicas.
@pytest.mark.parametrize("replicas,losses,extra", [
    (2, ["nca-ephn", "margin-semihard-sum"], ()),
    (4, ["ms", "loop-triplet"], ()),
    (2, ["supcon-graded", "ms"], ("--multi-label",)),  # [B, L] label sets gathered too
])
def test_mirrored_step_equals_one_device_on_the_global_batch(replicas, losses, extra):
    result = _run(replicas, losses, extra=extra)
    for name, run in result["runs"].items():
        # Gathering across replicas: the same loss and the same updated weights.
        assert run["cross_loss"] == pytest.approx(run["one_loss"], rel=1e-5, abs=1e-6), name
        assert _max_diff(run["cross_weights"], run["one_weights"]) < 1e-5, name
        # Without it each replica mines in its own slice: the step differs, so the check
        # above can fail.
        assert _max_diff(run["local_weights"], run["one_weights"]) > 1e-3, name

    # RecallAtK and predict on a model built under the strategy scope.
    assert result["recall_predict_matches"]
    for key, value in result["recall_one_device"].items():
        assert result["recall_callback"][key] == pytest.approx(value)


def test_cross_replica_setting_round_trips_and_is_checked():
    import keras

    import tfdml

    loss = tfdml.losses.MultiSimilarityLoss()
    assert loss.cross_replica is None and "cross_replica" not in loss.get_config()
    loss.cross_replica = False
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert again.cross_replica is False
    # Without a strategy the setting changes nothing.
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.repeat(np.arange(4), 2)
    np.testing.assert_allclose(float(loss(y, x)), float(tfdml.losses.MultiSimilarityLoss()(y, x)))
    loss.cross_replica = "yes"
    with pytest.raises(ValueError, match="cross_replica"):
        loss(y, x)


def test_cross_batch_memory_holds_the_global_batches_under_mirrored_strategy():
    """Four steps of a MetricModel with a CrossBatchMemory on 2 replicas: the bank holds
    the last two *global* batches, as on one device, and the weights agree."""
    result = _script_result("xbm_distribute_check.py", "--replicas", "2")
    one, mirrored = result["one"], result["mirrored"]
    assert one["labels"] == mirrored["labels"] == result["last_labels"]
    assert one["counters"] == mirrored["counters"] == [0, 16, 4]
    np.testing.assert_allclose(mirrored["embeddings"], one["embeddings"], atol=1e-5)
    assert _max_diff(mirrored["weights"], one["weights"]) < 1e-5


def test_simclr_gathers_the_views_of_every_replica():
    """A SimCLR step of a ContrastiveModel on 2 replicas equals the step on one device with
    the global batch (TensorFlow Similarity's SimCLR loss gathers across replicas only in
    part, its issue #258); the per-replica loss differs, so the check can fail. Two BYOL
    steps (the momentum update) equal one device's; MoCo raises."""
    result = _script_result("simclr_distribute_check.py", "--replicas", "2")
    assert result["replicas"] == 2
    np.testing.assert_allclose(result["mirrored_loss"], result["one_loss"], rtol=1e-5)
    assert abs(result["per_replica_loss"] - result["one_loss"]) > 0.1
    assert _max_diff(result["mirrored_weights"], result["one_weights"]) < 1e-5
    # BYOL: its momentum update under the strategy equals one device's; MoCo refuses it.
    assert _max_diff(result["byol_mirrored_weights"], result["byol_one_weights"]) < 1e-5
    assert "tf.distribute" in (result["moco_error"] or ""), result["moco_error"]
