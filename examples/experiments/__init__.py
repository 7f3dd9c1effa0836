"""The training loop behind the paper example scripts: flags, data, model, resumable runs.

Every script under ``examples/<paper>/`` is a thin layer over this package: it
adds its own flags (loss, miner, ...) to :func:`make_parser`, builds its loss
and calls :func:`run`. The package is part of the examples, not of the installed
library (it builds on ``tfdml`` as the scripts do): a script puts
``examples/`` on ``sys.path`` and imports it as ``experiments``. What :func:`run` does:

* loads the data set (``tfdml.datasets.load``) or, with ``--smoke``, makes a
  tiny synthetic one with the same evaluation protocol (:func:`synthetic_data`);
* builds the embedding model (``tfdml.models.build_embedding_model``, or a small
  CNN with ``--backbone tiny``), the optimizer and the learning-rate schedule;
* trains on P x K batches (``tfdml.data.pk_batches``) with a progress bar,
  evaluating on the test split every ``--eval-every`` epochs (Recall@K; the
  In-shop query/gallery protocol; VehicleID's match rate);
* saves the model and optimizer state after every epoch in
  ``<output-dir>/backup``: a run that is killed resumes from the last finished
  epoch when started again with the same command, with the batches an
  uninterrupted run would have drawn (:class:`ResumeState`);
* keeps the best epoch's weights (``best.weights.h5``, by the monitored metric),
  and writes ``history.csv``, ``results.json``, ``results.md``, figures and a
  SavedModel export (``tfdml.export``) to the output directory;
* writes every one of these files whole or not at all: to a temporary file in
  the same directory, flushed to disk and renamed over the old one, so that a
  kill during a save leaves the old file or the new one, never a truncated one.

The modules:

* ``flags``: :func:`make_parser` and the checks of overlapping or ignored flags
  (:func:`given_flags`, :func:`reject_flags`, :func:`batch_shape`), :func:`apply_smoke`,
  and the flag types of the scripts' own flags (:func:`positive_int`,
  :func:`positive_float`);
* ``data``: the data sets' evaluation splits, :class:`ExperimentData`,
  :func:`synthetic_data`, :func:`load_data`, :func:`transforms`;
* ``train``: :func:`build_model`, :func:`learning_rate_schedule`,
  :func:`make_strategy`, :func:`fit_multi_worker`, :func:`run`, which runs
  the phases of a run in turn (prepare, resume, fit, evaluate the best epoch,
  report), and :func:`baselines`, the raw pixels and the untrained network of a
  run's flags and seeds, evaluated as a run's best epoch (the rows that trained
  numbers stand next to; in ``train`` because it builds the model as :func:`run`
  does);
* ``resume``: :class:`ResumeState`, the best-weights callback, the settings a
  run resumes with, SIGTERM;
* ``report``: :func:`evaluate`, :func:`best_epoch`, :func:`markdown_table`, the
  results files and figures, :func:`saved_arrays`, :func:`sweep`.

Example (a script in ``examples/<paper>/``)::

    import os
    import sys

    from tfdml import losses

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

    def main(argv=None):
        parser = experiments.make_parser("Triplet loss on CUB", dataset="cub200")
        parser.add_argument("--margin", type=float, default=0.2)
        args = parser.parse_args(argv)
        loss = losses.TripletMarginLoss(margin=args.margin)
        return experiments.run(args, loss, name="triplet")
"""

from experiments.data import BACKBONE_TINY as BACKBONE_TINY
from experiments.data import DATASETS as DATASETS
from experiments.data import EVAL_SPLITS as EVAL_SPLITS
from experiments.data import ExperimentData, load_data, synthetic_data, transforms
from experiments.flags import (
    apply_smoke,
    batch_shape,
    given_flags,
    make_parser,
    positive_float,
    positive_int,
    reject_flags,
)
from experiments.report import RECALL_KS as RECALL_KS
from experiments.report import (
    Evaluation,
    best_epoch,
    evaluate,
    markdown_table,
    saved_arrays,
    sweep,
)
from experiments.resume import ResumeState
from experiments.train import (
    baselines,
    build_model,
    fit_multi_worker,
    learning_rate_schedule,
    make_strategy,
    run,
)

__all__ = [
    "Evaluation",
    "ExperimentData",
    "ResumeState",
    "apply_smoke",
    "baselines",
    "batch_shape",
    "best_epoch",
    "build_model",
    "evaluate",
    "fit_multi_worker",
    "given_flags",
    "learning_rate_schedule",
    "load_data",
    "make_parser",
    "make_strategy",
    "markdown_table",
    "positive_float",
    "positive_int",
    "reject_flags",
    "run",
    "saved_arrays",
    "sweep",
    "synthetic_data",
    "transforms",
]
