"""A killed example run resumes from its last finished epoch and ends like an uninterrupted one."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import experiments
import keras
import numpy as np
import pytest
from experiments import saved_arrays
from experiments.resume import best_checkpoint

from tfdml._files import remove_temporaries

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "extreme_triplet" / "train.py"
EPOCHS = 3


def _command(out):
    return [sys.executable, str(SCRIPT), "--smoke", "--deterministic", "--epochs", str(EPOCHS),
            "--steps-per-epoch", "40", "--no-export", "--verbose", "2", "--output-dir", str(out)]


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _state(out):
    try:
        return json.loads((out / "backup" / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@pytest.mark.slow  # a training subprocess, killed and resumed
def test_killed_run_resumes_without_losing_or_repeating_an_epoch(tmp_path):
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight), env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_command(killed), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        state = _state(killed)
        if state is not None and state["epoch"] >= 1:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    saved = _state(killed)
    assert saved is not None and 1 <= saved["epoch"] < EPOCHS, (
        f"the kill did not land between epochs 1 and {EPOCHS}: {saved and saved['epoch']}")
    assert not (killed / "results.json").exists()

    resumed = subprocess.run(_command(killed), env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"after epoch {saved['epoch']} of {EPOCHS}" in resumed.stdout
    # Keras' progress lines: only the epochs after the saved one ran again.
    ran = [int(line.split()[1].split("/")[0]) for line in resumed.stdout.splitlines()
           if line.startswith("Epoch ") and "/" in line.split()[1]]
    assert ran == list(range(saved["epoch"] + 1, EPOCHS + 1))

    results = json.loads((killed / "results.json").read_text())
    assert results["epochs_run"] == list(range(1, EPOCHS + 1))
    rows = (killed / "history.csv").read_text().splitlines()
    assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(1, EPOCHS + 1))
    # Same batches, same steps: the weights of the uninterrupted run.
    want = saved_arrays(straight / "backup" / f"ckpt-{EPOCHS}" / "model.weights.h5")
    got = saved_arrays(killed / "backup" / f"ckpt-{EPOCHS}" / "model.weights.h5")
    assert want.keys() == got.keys() and want
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    straight_results = json.loads((straight / "results.json").read_text())
    for key, value in straight_results["metrics"].items():
        assert results["metrics"][key] == pytest.approx(value, abs=1e-6), key


# -- checkpoints are written whole or not at all ----------------------------------------------

# A process that saves the best weights and a ResumeState checkpoint again and again. Save
# `i` writes weights that are all equal to `i`, so a loaded file tells which save wrote it.
_SAVER = r"""
import sys

out, start, examples = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, examples)

import experiments
import keras
import numpy as np
from experiments.resume import best_checkpoint

model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096),
                          keras.layers.Dense(4096)])  # 21 M parameters: 84 MB a file
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.optimizer.build(model.trainable_variables)
best = best_checkpoint(f"{out}/best.weights.h5", "val_recall@1")
resume = experiments.ResumeState(f"{out}/backup", history_csv=f"{out}/history.csv")
for callback in (best, resume):
    callback.set_model(model)
best.best = start - 1
print("ready", flush=True)
for i in range(start, start + 10_000):
    for v in model.weights:
        v.assign(np.full(v.shape, i, "float32"))
    print("begin best", i, flush=True)
    best.on_epoch_end(i - 1, {"val_recall@1": float(i)})
    print("end best", i, flush=True)
    print("begin resume", i, flush=True)
    resume.on_epoch_end(i - 1, {"val_recall@1": float(i)})
    print("end resume", i, flush=True)
"""


def _saver_model():
    import keras

    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096),
                              keras.layers.Dense(4096)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _weights_value(model):
    """The value all the weights hold (they were saved all equal), or fails."""
    values = {float(v) for w in model.weights for v in np.unique(np.asarray(w))}
    assert len(values) == 1, f"weights of several saves in one file: {sorted(values)[:5]}"
    return int(values.pop())


@pytest.mark.slow
def test_checkpoints_survive_sigkill_during_saves(tmp_path):
    """Kills a process that saves checkpoints at random moments, 20 times; after each kill the
    best weights file and the last ResumeState checkpoint are absent, the old or the new one,
    and load."""
    rng = np.random.default_rng(0)
    out = tmp_path / "run"
    out.mkdir()
    model = _saver_model()
    saved = {"best": 0, "resume": 0}  # the last save that finished, per file
    kills, during = 20, {"best": 0, "resume": 0}
    start, save_seconds, checked = 1, 0.3, 0
    csv_behind = False  # history.csv still lags state.json after an earlier kill
    for _ in range(kills):
        log = tmp_path / "log.txt"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(out), str(start),
                                     str(ROOT / "examples")],
                                    env=_env(), stdout=f, stderr=subprocess.DEVNULL)
            deadline = time.time() + 120
            while "ready" not in log.read_text() and proc.poll() is None:
                assert time.time() < deadline, "the saving process did not start"
                time.sleep(0.01)
            began = time.time()
            time.sleep(rng.uniform(0.0, 6 * save_seconds))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        lines = log.read_text().split("ready\n", 1)[1].splitlines()
        ended = [line.split() for line in lines if line.startswith("end ")]
        for _, which, i in ended:
            saved[which] = int(i)
        if ended:  # the observed time of a save, to aim the next kill
            save_seconds = max(0.05, (time.time() - began) / (2 * len(ended) + 1))
        new = dict(saved)  # what each file may hold now: the last save, or the one killed
        writing = None
        if lines and lines[-1].startswith("begin "):
            _, writing, i = lines[-1].split()
            during[writing] += 1
            new[writing] = int(i)

        best_path = out / "best.weights.h5"
        if saved["best"] == 0 and not best_path.exists():
            pass  # killed during the first save: absent
        else:
            model.load_weights(best_path)
            checked += 1
            assert _weights_value(model) in (saved["best"], new["best"])
            saved["best"] = _weights_value(model)
        state = experiments.ResumeState(str(out / "backup"))
        if saved["resume"] == 0 and state.load_state() is None:
            pass
        else:
            before = saved["resume"]
            epoch = state.restore(model)  # state.json and the checkpoint it names
            checked += 1
            assert epoch in (saved["resume"], new["resume"])
            assert _weights_value(model) == epoch
            saved["resume"] = epoch
            # history.csv, rewritten after state.json: whole, and up to date unless a kill
            # came between the two (the next epoch's save rewrites it).
            # Absent when the first save was killed between the two files.
            may_lag = writing == "resume" or (csv_behind and epoch == before)
            history = out / "history.csv"
            if history.exists():
                rows = [r.split(",") for r in history.read_text().splitlines()]
                assert rows[0][0] == "epoch" and all(len(r) == len(rows[0]) for r in rows)
                last = int(rows[-1][0])
            else:
                last = 0
            assert last == epoch or (may_lag and last < epoch)
            csv_behind = last != epoch
        start = max(saved.values()) + 1
    leftovers = sorted(p.name for p in out.rglob(".*tmp-*"))
    print(f"\n{kills} kills, {sum(during.values())} during a write (best.weights.h5: "
          f"{during['best']}, ResumeState checkpoint: {during['resume']}); "
          f"{checked} checkpoint files checked and loaded; last saves: {saved}; "
          f"{len(leftovers)} temporary files left by kills")
    # What a new run removes before it starts (experiments.run): those and nothing else.
    # (A temporary file in an unfinished backup/ckpt-<n> folder goes with that folder.)
    top = sorted(p.name for folder in (out, out / "backup") for p in folder.glob(".*tmp-*"))
    removed = remove_temporaries(out) + remove_temporaries(out / "backup")
    assert sorted(removed) == top
    assert not list(out.glob(".*tmp-*")) and not list((out / "backup").glob(".*tmp-*"))
    assert (out / "best.weights.h5").exists() and (out / "backup" / "state.json").exists()
    assert sum(during.values()) >= kills // 4, "too few kills landed during a save"


def _dense(value):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    for v in model.weights:
        v.assign(np.full(v.shape, value, "float32"))
    return model


def test_best_weights_are_written_to_a_temporary_file_then_renamed(tmp_path, monkeypatch):
    path = tmp_path / "best.weights.h5"
    model = _dense(1.0)
    checkpoint = best_checkpoint(str(path), "val_recall@1")
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0, {"val_recall@1": 0.5})
    before = path.read_bytes()

    written = []
    save_weights = type(model).save_weights

    def killed_mid_save(self, filepath, *args, **kwargs):
        written.append(str(filepath))
        save_weights(self, filepath, *args, **kwargs)
        with open(filepath, "r+b") as f:  # half a file, as a kill during the write leaves
            f.truncate(os.path.getsize(filepath) // 2)
        raise OSError("killed mid-save")

    monkeypatch.setattr(type(model), "save_weights", killed_mid_save)
    for v in model.weights:
        v.assign(np.full(v.shape, 2.0, "float32"))
    with pytest.raises(OSError, match="killed mid-save"):
        checkpoint.on_epoch_end(1, {"val_recall@1": 0.9})
    monkeypatch.undo()
    (tmp,) = written
    assert os.path.dirname(tmp) == str(tmp_path) and tmp != str(path)
    assert tmp.endswith(".weights.h5")
    assert path.read_bytes() == before  # the old file, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["best.weights.h5"]  # no temporary left
    assert checkpoint.best == 0.5  # the best of the file
    fresh = _dense(0.0)
    fresh.load_weights(path)
    assert _weights_value(fresh) == 1

    checkpoint.on_epoch_end(2, {"val_recall@1": 0.9})  # and the next save goes through
    fresh.load_weights(path)
    assert _weights_value(fresh) == 2 and checkpoint.best == 0.9


def test_a_failed_save_leaves_every_file_of_the_training_loop_intact(tmp_path, monkeypatch):
    """ResumeState's checkpoint, state.json and history.csv: a failure part-way through a
    write leaves the old files, and the state still restores the last finished epoch."""
    import json as json_module

    model = _dense(1.0)
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    state = experiments.ResumeState(str(tmp_path / "backup"),
                                    history_csv=str(tmp_path / "history.csv"))
    state.set_model(model)
    state.on_epoch_end(0, {"loss": 1.0})
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json_module, "dump", fail)
    for v in model.weights:
        v.assign(np.full(v.shape, 2.0, "float32"))
    with pytest.raises(OSError, match="disk full"):
        state.on_epoch_end(1, {"loss": 0.5})
    monkeypatch.undo()
    assert json.loads((tmp_path / "backup" / "state.json").read_text())["epoch"] == 1
    for path, data in files.items():
        assert path.read_bytes() == data, path
    assert not list(tmp_path.rglob(".*tmp-*"))
    fresh = _dense(0.0)
    fresh.compile(optimizer="sgd", loss="mse")
    assert experiments.ResumeState(str(tmp_path / "backup")).restore(fresh) == 1
    assert _weights_value(fresh) == 1


def test_atomic_directory_replaces_the_old_one_whole(tmp_path):
    from tfdml._files import atomic_path

    target = tmp_path / "saved_model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target, directory=True) as tmp:
        os.makedirs(tmp)
        (pathlib.Path(tmp) / "half.txt").write_text("half")
        raise RuntimeError("export failed")
    assert [p.name for p in tmp_path.iterdir()] == ["saved_model"]
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    with atomic_path(target, directory=True) as tmp:
        os.makedirs(tmp)
        (pathlib.Path(tmp) / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["saved_model"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def _compiled_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def test_resume_state_restores_weights_optimizer_history_and_best(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    model = _compiled_model()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.weights.h5"),
                                                 monitor="loss", mode="max",
                                                 save_weights_only=True, save_best_only=True)
    state = experiments.ResumeState(str(tmp_path / "backup"), config={"a": 1},
                                    checkpoint=checkpoint, history_csv=str(tmp_path / "h.csv"))
    model.fit(x, y, epochs=2, batch_size=4, verbose=0, callbacks=[checkpoint, state])
    saved = json.loads((tmp_path / "backup" / "state.json").read_text())
    assert saved["epoch"] == 2 and [h["epoch"] for h in saved["history"]] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "backup").iterdir()) == ["ckpt-2", "state.json"]
    assert (tmp_path / "h.csv").read_text().splitlines()[0].startswith("epoch,")
    arrays = experiments.saved_arrays(tmp_path / "backup" / "ckpt-2" / "model.weights.h5")
    kernel = np.asarray(model.weights[0])
    assert any(a.shape == kernel.shape and np.array_equal(a, kernel) for a in arrays.values())

    fresh = _compiled_model(seed=5)
    fresh_checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "b.weights.h5"),
                                                       monitor="loss", mode="max")
    restored = experiments.ResumeState(str(tmp_path / "backup"), config={"a": 1},
                                       checkpoint=fresh_checkpoint)
    assert restored.restore(fresh) == 2
    for a, b in zip(model.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(model.optimizer.variables, fresh.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # momenta, step count
    assert int(np.asarray(fresh.optimizer.iterations)) == 8
    assert fresh_checkpoint.best == pytest.approx(checkpoint.best)
    assert [h["epoch"] for h in restored.history] == [1, 2]

    other = experiments.ResumeState(str(tmp_path / "backup"), config={"a": 2})
    with pytest.raises(ValueError, match="other settings.*a"):
        other.restore(_compiled_model())
    assert experiments.ResumeState(str(tmp_path / "empty")).restore(_compiled_model()) == 0
