"""Every file tfdml writes is whole or absent: a full disk or a kill part-way through a save
leaves the previous file, which loads, and the process goes on after a failed save.

A full disk is a write limit here (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored: a write past
it fails with ``OSError`` ``EFBIG``, as on a full file system), set on this process while a
save runs: ``MetricModel.save`` (``.keras``) and ``save_weights``,
``tfdml.models.save_model`` of a plain Keras model, ``tfdml.search.Index.save`` and
``tfdml.export.export_embedding_model`` (TensorFlow). The kill loop (marked slow, as the
experiments' checkpoint loop) kills a process that saves ``.keras`` and ``.weights.h5``
files at random moments and loads what is left after each kill.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import keras
import numpy as np
import pytest
from backends import BACKEND, to_numpy

import tfdml
from tfdml import losses
from tfdml.models import MetricModel

LIMIT = 20_000  # bytes: below every file saved here


@contextlib.contextmanager
def write_limit(limit=LIMIT):
    """Writes past ``limit`` bytes into any file fail with ``OSError`` (errno EFBIG)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can be set from the main thread only")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _model(seed):
    keras.utils.set_random_seed(seed)
    embedder = keras.Sequential([keras.Input((16,)), keras.layers.Dense(256),
                                 keras.layers.Dense(8)])
    model = MetricModel(embedder, losses.MarginLoss())
    model.compile(optimizer="adam")
    return model


def _weights(model):
    return [np.array(to_numpy(v)) for v in model.weights]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def _leftovers(folder):
    return [name for name in os.listdir(folder) if ".tmp-" in name]


@pytest.mark.multibackend
@pytest.mark.parametrize("name", ["run.keras", "run.weights.h5"])
def test_a_save_on_a_full_disk_keeps_the_old_file(tmp_path, name):
    path = tmp_path / name
    old = _model(0)
    save = (lambda m: m.save(path)) if name.endswith(".keras") else (
        lambda m: m.save_weights(path))
    save(old)
    new = _model(1)
    with write_limit(), pytest.raises(OSError):
        save(new)
    assert _leftovers(tmp_path) == []
    if name.endswith(".keras"):
        loaded = tfdml.models.load_model(path)
    else:
        loaded = _model(2)
        loaded.load_weights(path)
    _same(_weights(loaded)[:4], _weights(old)[:4])  # the network: the old file's
    save(new)  # the process goes on, and the next save works
    if name.endswith(".keras"):
        loaded = tfdml.models.load_model(path)
    else:
        loaded.load_weights(path)
    _same(_weights(loaded)[:4], _weights(new)[:4])


@pytest.mark.multibackend
def test_save_model_of_a_plain_keras_model_and_an_index(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(512)])
    path = tmp_path / "embedder.keras"
    tfdml.models.save_model(model, path)
    before = _weights(model)
    model.layers[0].kernel.assign(np.zeros((16, 512), "float32"))
    with write_limit(), pytest.raises(OSError):
        tfdml.models.save_model(model, path)
    _same(_weights(keras.saving.load_model(path)), before)
    # An unzipped save is a directory, replaced whole.
    folder = tmp_path / "embedder_dir"
    tfdml.models.save_model(model, folder, zipped=False)
    assert folder.is_dir() and _leftovers(tmp_path) == []

    index = tfdml.search.Index("cosine")
    index.add(np.random.default_rng(0).normal(size=(2000, 8)).astype("float32"))
    index.save(tmp_path / "index.npz")
    index.add(np.ones((10, 8), "float32"))
    with write_limit(), pytest.raises(OSError):
        index.save(tmp_path / "index.npz")
    assert len(tfdml.search.Index.load(tmp_path / "index.npz")) == 2000
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(BACKEND == "torch", reason="faiss and PyTorch load two OpenMP runtimes")
def test_an_approximate_index_on_a_full_disk_keeps_the_old_file(tmp_path):
    pytest.importorskip("faiss")
    rows = np.random.default_rng(0).normal(size=(3000, 8)).astype("float32")
    index = tfdml.search.Index("l2", approximate="IVF8,Flat", vectors="disk")
    index.add(rows)
    path = tmp_path / "ann.npz"
    index.save(path)
    index.add(rows[:10])
    with write_limit(), pytest.raises(OSError):
        index.save(path)
    loaded = tfdml.search.Index.load(path)
    assert len(loaded) == 3000 and loaded.approximate == "IVF8,Flat"
    assert _leftovers(tmp_path) == []
    index.save(path)
    assert len(tfdml.search.Index.load(path)) == 3010


@pytest.mark.skipif(BACKEND != "tensorflow", reason="SavedModel export needs TensorFlow")
def test_an_export_on_a_full_disk_keeps_the_old_export(tmp_path):
    from tfdml._tensorflow import tf
    from tfdml.export import export_embedding_model

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(300)])
    path = tmp_path / "export"
    export_embedding_model(model, path, preprocess=None)
    images = np.arange(2 * 8 * 8 * 3).reshape(2, 8, 8, 3).astype("uint8") % 255
    before = tf.saved_model.load(str(path)).signatures["serving_default"](
        images=tf.constant(images))["embeddings"].numpy()
    model.layers[-1].kernel.assign(np.zeros((192, 300), "float32"))
    with write_limit(), pytest.raises((OSError, tf.errors.OpError)):  # TF's own error
        export_embedding_model(model, path, preprocess=None)
    assert sorted(os.listdir(tmp_path)) == ["export"]
    after = tf.saved_model.load(str(path)).signatures["serving_default"](
        images=tf.constant(images))["embeddings"].numpy()
    np.testing.assert_array_equal(after, before)


_SAVER = textwrap.dedent("""
    import os, sys
    import keras, numpy as np
    import tfdml
    out = sys.argv[1]
    keras.utils.set_random_seed(0)
    model = tfdml.models.MetricModel(
        keras.Sequential([keras.Input((16,)), keras.layers.Dense(256), keras.layers.Dense(8)]),
        tfdml.losses.MarginLoss())
    model.compile(optimizer="adam")
    print("ready", flush=True)
    i = int(sys.argv[2])
    while True:
        i += 1
        for v in model.embedder.weights:
            v.assign(np.full(v.shape, i, "float32"))
        print("begin", i, flush=True)
        model.save(os.path.join(out, "run.keras"))
        model.save_weights(os.path.join(out, "run.weights.h5"))
        print("end", i, flush=True)
""")


@pytest.mark.slow
def test_saves_survive_sigkill(tmp_path):
    """Kills a process that saves a ``.keras`` and a weights file in a loop at random moments,
    12 times; after each kill both files are the last complete save or the one in progress,
    and load."""
    rng = np.random.default_rng(0)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    reader = _model(0)
    last, checked = 0, 0
    for _ in range(12):
        log = tmp_path / "log.txt"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path), str(last)],
                                    env=env, stdout=f, stderr=subprocess.DEVNULL)
            deadline = time.time() + 120
            while "ready" not in log.read_text() and proc.poll() is None:
                assert time.time() < deadline
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 1.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        lines = log.read_text().split("ready\n", 1)[1].splitlines()
        ends = [int(line.split()[1]) for line in lines if line.startswith("end ")]
        begun = [int(line.split()[1]) for line in lines if line.startswith("begin ")]
        allowed = {last} | ({begun[-1]} if begun else set())
        last = ends[-1] if ends else last
        if (tmp_path / "run.keras").exists():
            values = {float(x) for w in _weights(
                tfdml.models.load_model(tmp_path / "run.keras").embedder) for x in np.unique(w)}
            assert len(values) == 1 and values <= allowed | {last}, (values, allowed)
            checked += 1
        if (tmp_path / "run.weights.h5").exists():
            reader.load_weights(tmp_path / "run.weights.h5")
            values = {float(x) for w in _weights(reader.embedder) for x in np.unique(w)}
            assert len(values) == 1 and values <= allowed | {last}, (values, allowed)
            checked += 1
    assert checked >= 12
