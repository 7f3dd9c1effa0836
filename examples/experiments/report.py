"""What a run reports: the evaluation (Recall@K, MAP@R, NMI, F1, VehicleID's match rates),
the best epoch, the results files (written whole or not at all), figures, and sweeps of
runs."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time

import keras
import numpy as np

from experiments.data import ExperimentData
from tfdml import metrics as _metrics
from tfdml._files import atomic_path, write_json, write_text
from tfdml._tensorflow import tf
from tfdml.data import eval_batches

__all__ = ["RECALL_KS", "Evaluation", "best_epoch", "evaluate", "markdown_table",
           "saved_arrays", "sweep"]

#: Recall@K values reported per data set (the papers' columns).
RECALL_KS = {
    "cub200": (1, 2, 4, 8, 16, 32),
    "cars196": (1, 2, 4, 8, 16, 32),
    "sop": (1, 10, 100, 1000),
    "inshop": (1, 10, 20, 30, 40, 50),
    "omniglot": (1, 2, 4, 8),
    "digits": (1, 2, 4, 8),
}


# -- evaluation --------------------------------------------------------------------------------


@dataclasses.dataclass
class Evaluation:
    """Metrics of one evaluation: ``values`` (``{"val_recall@1": ..., ...}``) and the
    monitored key (``monitor``, maximized)."""

    values: dict
    monitor: str


def _embed(model, split, eval_fn, batch_size):
    ds = eval_batches(split, batch_size, map_fn=eval_fn)
    chunks = [model(x, training=False) for x, _ in ds]
    return tf.concat(chunks, axis=0).numpy().astype(np.float32), split.labels


def _clamp_ks(ks, gallery_size):
    kept = tuple(k for k in ks if k <= gallery_size)
    return kept or (1,)


def evaluate(model, data: ExperimentData, eval_fn, batch_size=128, final=False) -> Evaluation:
    """Embeds the evaluation splits and computes the data set's metrics.

    Recall@K (self-retrieval on ``"test"``, query against gallery for
    In-shop), plus MAP@R and, at the end of training (``final=True``), NMI and
    the clustering F1 (k-means with k = the number of test classes);
    VehicleID: the top-1 and top-5 match rates of each test size (10 draws of
    the gallery; top-5 only for a test set of at least 5 identities). Retrieval
    uses cosine similarity.
    """
    values = {}
    if data.name == "vehicleid":
        for name, split in data.evaluation.items():
            emb, labels = _embed(model, split, eval_fn, batch_size)
            ks = _clamp_ks((1, 5), len(np.unique(labels)))  # top-k needs k identities
            rates = _nan_unless_finite((emb,), dict.fromkeys(ks),
                                       _metrics.vehicleid_match_rate, emb, labels, ks=ks)
            size = name.replace("test_", "")
            values.update({f"val_{size}_top{k}": rates[k] for k in ks})
        return Evaluation(values, "val_small_top1")
    if data.name == "inshop":
        q, ql = _embed(model, data.evaluation["query"], eval_fn, batch_size)
        g, gl = _embed(model, data.evaluation["gallery"], eval_fn, batch_size)
        ks = _clamp_ks(RECALL_KS["inshop"], len(gl))
        recall = _nan_unless_finite((q, g), dict.fromkeys(ks), _metrics.recall_at_k, q, ql, ks,
                                    gallery_embeddings=g, gallery_labels=gl)
        values.update({f"val_recall@{k}": v for k, v in recall.items()})
        values["val_map@r"] = _nan_unless_finite((q, g), None, _metrics.map_at_r, q, ql,
                                                 gallery_embeddings=g, gallery_labels=gl)
        return Evaluation(values, "val_recall@1")
    emb, labels = _embed(model, data.evaluation["test"], eval_fn, batch_size)
    ks = _clamp_ks(RECALL_KS.get(data.name, (1, 2, 4, 8)), len(labels) - 1)
    recall = _nan_unless_finite((emb,), dict.fromkeys(ks), _metrics.recall_at_k, emb, labels, ks)
    values.update({f"val_recall@{k}": v for k, v in recall.items()})
    values["val_map@r"] = _nan_unless_finite((emb,), None, _metrics.map_at_r, emb, labels)
    if final:
        values["val_nmi"] = _nan_unless_finite((emb,), None, _metrics.nmi, emb, labels)
        values["val_f1"] = _nan_unless_finite((emb,), None, _metrics.f1_clustering, emb, labels)
    return Evaluation(values, "val_recall@1")


def _nan_unless_finite(embeddings, keys, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or NaN (a dict of NaN over ``keys``) for non-finite embeddings.

    A diverged model's evaluation is logged as NaN, never picked as the best epoch, and
    does not stop the run (the metrics themselves raise on non-finite embeddings).
    """
    if all(np.isfinite(e).all() for e in embeddings):
        return fn(*args, **kwargs)
    print("Evaluation: the model gives non-finite embeddings (NaN or Inf); metrics are NaN.")
    return float("nan") if keys is None else {k: float("nan") for k in keys}


class EvaluateCallback(keras.callbacks.Callback):
    """Puts the evaluation metrics into the epoch logs (before the callbacks that read them)."""

    def __init__(self, fn, every):
        super().__init__()
        self.fn = fn
        self.every = every

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every and epoch > 0:
            return
        start = time.perf_counter()
        result = self.fn()
        if logs is not None:  # Keras prints them with the epoch's line
            logs.update(result.values)
            logs["eval_seconds"] = time.perf_counter() - start


def best_epoch(history, monitor):
    """The epoch with the largest ``monitor`` value in ``history``, NaN values ignored.

    A NaN compares false with every number, so ``max(history, key=...)`` may
    return a NaN entry or not depending on where it is; here entries whose
    value is missing, ``None`` or NaN are left out. Among equal values the
    earliest epoch wins, the one ``ModelCheckpoint(save_best_only=True)``
    keeps (it saves on a strict improvement only).

    Args:
        history: a sequence of per-epoch dicts with an ``"epoch"`` key, as
            ``ResumeState.history``.
        monitor: the key to maximize, e.g. ``"val_recall@1"``.

    Returns:
        The ``"epoch"`` value of the best entry, or ``None`` when no entry has
        a value that is not NaN.

    Examples:

    >>> history = [{"epoch": 1, "val_recall@1": float("nan")}, {"epoch": 2, "val_recall@1": 0.4}]
    >>> experiments.best_epoch(history, "val_recall@1")
    2
    """
    best = None
    for entry in history:
        value = entry.get(monitor)
        if value is None or np.isnan(value):
            continue
        if best is None or value > best[monitor]:
            best = entry
    return None if best is None else best["epoch"]


# -- files -------------------------------------------------------------------------------------


def atomic_write_json(path, obj):
    """Writes ``obj`` to ``path`` as JSON (NumPy scalars and arrays as numbers and lists),
    whole or not at all."""
    write_json(path, obj, default=_json_default)


_atomic_write_text = write_text


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def write_csv(path, rows):
    """Writes dicts as CSV rows (the columns: every key, in order of first appearance; an
    empty cell for a missing or None value), whole or not at all."""
    columns = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(",".join(columns) + "\n")
        for row in rows:
            f.write(",".join("" if row.get(c) is None else repr(row[c]) for c in columns) + "\n")


def saved_arrays(path) -> dict:
    """Every array in a Keras ``.weights.h5`` file (model and optimizer), by its path in the
    file: for comparing the weights that two runs saved. The class names that loss states are
    saved with (``tfdml.losses.LossState``) are not weights and are left out."""
    import h5py

    from tfdml.losses.state import LossState

    marker = "/" + LossState.LOSS_CLASS_KEY
    arrays = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) and not name.endswith(marker) else None)
    return arrays


def markdown_table(rows, columns=None, digits=4):
    """A Markdown table of dicts (one row each); numbers rounded to ``digits`` decimals."""
    rows = list(rows)
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k in row if k not in columns]

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def describe_machine():
    """The machine a run ran on, in one line (CPUs, GPUs, TensorFlow, Keras and Python)."""
    return (f"{os.cpu_count()} CPUs, {len(tf.config.list_physical_devices('GPU'))} GPUs; "
            f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
            f"Python {platform.python_version()}")


def plot_history(history, keys, path, title):
    """Draws the ``keys`` of ``history`` (per-epoch dicts) by epoch into the image ``path``,
    written whole or not at all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in keys:
        points = [(h["epoch"], h[key]) for h in history if key in h]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def write_results(out, results, extra, *, title, smoke, best, epochs, monitor):
    """Writes ``results.json`` and ``results.md`` to ``out`` and prints the metrics table.

    Args:
        out: the output directory.
        results: the results dict (``results.json``).
        extra: the entries that ``extra_results`` added, listed in ``results.md``.
        title: ``"<method> on <data set>"``.
        smoke: a ``--smoke`` run (said in the title).
        best: the best epoch.
        epochs: the epochs of the run (``--epochs``).
        monitor: the metric the best epoch is chosen by.
    """
    atomic_write_json(os.path.join(out, "results.json"), results)
    rows = [{"metric": k, "value": v} for k, v in results["metrics"].items()]
    text = f"# {title}{' (smoke run, synthetic data)' if smoke else ''}\n\n"
    text += f"Best epoch {best} of {epochs} (by {monitor}).\n\n"
    text += markdown_table(rows)
    for key, value in extra.items():
        text += f"\n{key}: `{json.dumps(value, default=_json_default)}`\n"
    text += f"\nCommand: `{results['command']}`\n\nMachine: {results['machine']}\n"
    _atomic_write_text(os.path.join(out, "results.md"), text)
    print(markdown_table(rows), flush=True)
    print(f"Results in {out}", flush=True)


# -- sweeps ------------------------------------------------------------------------------------


def sweep(main, argv, runs, output_dir, metric="val_recall@1", title="sweep", x_label=None,
          log_x=False, check=None):
    """Runs a script's ``main`` once per setting and tabulates the results.

    Each run writes to ``<output_dir>/<run name>`` and is resumable on its own;
    a run whose ``results.json`` exists is not run again. The runs happen one
    after the other in this process (``keras.backend.clear_session()`` between).

    Args:
        main: the script's ``main(argv) -> results dict``.
        argv: flags common to every run (e.g. ``["--dataset", "cub200"]``).
        runs: ``{run name: [extra flags]}``, e.g.
            ``{"n2": ["--group-size", "2"], "n4": ["--group-size", "4"]}``.
        output_dir: the folder of the sweep.
        metric: the metric tabulated and plotted. Defaults to `"val_recall@1"`.
        title: title of the table and plot.
        x_label: for a plot of ``metric`` against a number: ``{run name: x}``
            is taken from ``runs`` by this flag's value (e.g. ``"--group-size"``).
        log_x: a log2 x axis (group sizes, batch sizes).
        check: ``fn(flags)`` called with every run's flags (``argv`` and the run's) before
            the first run, e.g. the script's flag check (``parser.error`` on flags that
            conflict or that a run would ignore), so that a bad flag stops the sweep before
            any training. Defaults to `None` (no check).

    Returns:
        ``[{"run": name, **metrics}]``; also written to ``sweep.json`` and
        ``sweep.md`` (and ``sweep.png`` with ``x_label``) in ``output_dir``.
    """
    if check is not None:
        for run_name, extra in runs.items():
            try:
                check([*argv, *extra])
            except SystemExit:
                print(f"{title}: run {run_name!r} refuses its flags {[*argv, *extra]}",
                      file=sys.stderr, flush=True)
                raise
    os.makedirs(output_dir, exist_ok=True)
    rows = []
    for run_name, extra in runs.items():
        out = os.path.join(output_dir, run_name)
        path = os.path.join(out, "results.json")
        if os.path.exists(path):
            with open(path) as f:
                results = json.load(f)
            print(f"{run_name}: done already ({path})", flush=True)
        else:
            print(f"== {title}: {run_name} ==", flush=True)
            keras.backend.clear_session()
            results = main([*argv, *extra, "--output-dir", out])
        row = {"run": run_name, "method": results.get("name"), "best_epoch": results.get("best_epoch")}
        row.update(results["metrics"])
        rows.append(row)
    atomic_write_json(os.path.join(output_dir, "sweep.json"), rows)
    _atomic_write_text(os.path.join(output_dir, "sweep.md"), f"# {title}\n\n" + markdown_table(rows))
    if x_label is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [float(extra[extra.index(x_label) + 1]) for extra in runs.values()]
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        ax.plot(xs, [r.get(metric) for r in rows], marker="o")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(x_label.lstrip("-"))
        ax.set_ylabel(metric)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        with atomic_path(os.path.join(output_dir, "sweep.png")) as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
    print(markdown_table(rows), flush=True)
    return rows
