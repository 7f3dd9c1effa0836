"""Training a run: the model, optimizer, learning-rate schedule and ``tf.distribute``
strategy, the multi-worker loop, :func:`run`, a driver over the phases of a run, and
:func:`baselines`, what a run starts from (the raw pixels and the untrained network)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import numbers
import os
import re
import sys
import time
from collections.abc import Callable

import keras

from experiments.data import (
    BACKBONE_TINY,
    ExperimentData,
    backbone_preprocess,
    load_data,
    transforms,
)
from experiments.flags import apply_smoke
from experiments.report import (
    EvaluateCallback,
    Evaluation,
    atomic_write_json,
    best_epoch,
    describe_machine,
    evaluate,
    plot_history,
    write_results,
)
from experiments.resume import ResumeState, best_checkpoint, handle_sigterm, resume_config
from tfdml._files import atomic_path, remove_temporaries
from tfdml._tensorflow import tf
from tfdml.data import pk_batches
from tfdml.layers import L2Normalization
from tfdml.models import MetricModel, is_stateful_loss, plus_model_losses, unwrap

__all__ = ["baselines", "build_model", "fit_multi_worker", "learning_rate_schedule", "make_strategy",
           "run"]


# -- model and optimizer -----------------------------------------------------------------------


def _tiny_model(embedding_dim, input_shape, normalize=True):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(embedding_dim, dtype="float32")(x)
    if normalize:
        outputs = L2Normalization(dtype="float32")(outputs)
    model = keras.Model(inputs, outputs, name="tiny_embedding")
    model.preprocess = "tiny"
    return model


def build_model(args) -> keras.Model:
    """The embedding model for ``args``: a Keras Applications backbone with an embedding head.

    The embeddings are L2-normalized unless ``args.normalize`` is false (a flag
    scripts may add, e.g. for LoOp's comparison without normalization).
    """
    shape = (args.image_size, args.image_size, 3)
    normalize = bool(getattr(args, "normalize", True))
    if args.backbone == BACKBONE_TINY:
        return _tiny_model(args.embedding_dim, shape, normalize)
    from tfdml.models import build_embedding_model

    weights = None if args.weights in (None, "none") else args.weights
    return build_embedding_model(args.backbone, args.embedding_dim, input_shape=shape,
                                 weights=weights, freeze_batchnorm=args.freeze_batchnorm,
                                 normalize=normalize)


def learning_rate_schedule(base, milestones=(), gamma=0.1):
    """``epoch -> learning rate``: ``base * gamma ** (number of milestones <= epoch)``.

    ``epoch`` counts from 0, so milestones ``(20, 30)`` divide the rate by 10
    after 20 and after 30 finished epochs (the extreme-triplet paper's schedule).
    """
    milestones = sorted(int(m) for m in milestones)

    def schedule(epoch, lr=None):
        return float(base * gamma ** sum(epoch >= m for m in milestones))

    return schedule


def _optimizer(args):
    lr = args.learning_rate
    wd = args.weight_decay or None
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(lr, momentum=args.momentum, weight_decay=wd)
    if args.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(lr, momentum=args.momentum, weight_decay=wd)
    return keras.optimizers.Adam(lr, weight_decay=wd)


def make_strategy(args):
    """The ``tf.distribute`` strategy for ``--strategy`` (call before any other TF work).

    ``"mirrored"`` replicates over all GPUs, or over ``--logical-cpus`` logical CPU
    devices when there is no GPU; ``"multiworker"`` is
    ``MultiWorkerMirroredStrategy``, whose cluster comes from the ``TF_CONFIG``
    environment variable; ``"default"`` is the no-op default strategy.
    """
    if args.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)
        except RuntimeError as e:  # devices already initialized in this process
            raise RuntimeError("--logical-cpus must be set before TensorFlow initializes its "
                               "devices (start a new process).") from e
    if args.strategy == "mirrored":
        devices = None
        if not tf.config.list_logical_devices("GPU"):
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if args.strategy == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


# -- training --------------------------------------------------------------------------------


def fit_multi_worker(model, strategy, dataset, epochs, initial_epoch=0, callbacks=(),
                     verbose=1):
    """``model.fit`` for ``MultiWorkerMirroredStrategy``: a plain loop driving the callbacks.

    Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy`` when it reduces
    its scalar logs across workers ("Invalid reduction dimension 0 for input with
    0 dimensions", tensorflow/tensorflow#72388). This loop runs the same step (the
    compiled loss, ``model.losses``, ``optimizer.apply_gradients`` in each
    replica, which sums the gradients over replicas), reports the global loss
    (the replicas' values summed: each is the global loss divided by the number
    of replicas) and calls the callbacks as ``fit`` does. Each pass over
    ``dataset`` is one epoch.

    Raises:
        ValueError: for a :class:`tfdml.models.MetricModel` with ``chunk_size``
            (gradient caching runs in ``model.fit``'s step only).
    """
    if getattr(model, "chunk_size", None) is not None:
        raise ValueError(
            "fit_multi_worker trains with one step per replica and no chunks; a MetricModel "
            "with `chunk_size` would be trained without them. Train it with one worker "
            "(model.fit, which runs the chunked step) or without `chunk_size`. Received: "
            f"chunk_size={model.chunk_size!r}")
    dist = strategy.experimental_distribute_dataset(dataset)
    loss_fn = model.metric_loss if isinstance(model, MetricModel) else model.loss
    optimizer = model.optimizer
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        if not optimizer.built:
            optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                value = plus_model_losses(loss_fn(y, model(x, training=True)), model.losses,
                                          scale=1.0 / replicas)
            grads = tape.gradient(value, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return value

        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    steps = dataset.cardinality().numpy()
    steps = int(steps) if steps > 0 else None
    cb = keras.callbacks.CallbackList(list(callbacks), model=model, add_history=False,
                                      add_progbar=verbose != 0, verbose=verbose, epochs=epochs,
                                      steps=steps)
    model.stop_training = False
    cb.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        cb.on_epoch_begin(epoch)
        total, count = 0.0, 0
        for step, batch in enumerate(dist):
            cb.on_train_batch_begin(step)
            total += float(train_step(batch))
            count += 1
            cb.on_train_batch_end(step, {"loss": total / count})
        logs = {"loss": total / max(count, 1)}
        cb.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    cb.on_train_end()


def _is_factory(loss):
    """A function of no arguments that returns the loss (built inside the strategy scope)."""
    if isinstance(loss, keras.losses.Loss) or not callable(loss):
        return False
    import inspect

    try:
        params = inspect.signature(loss).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.default is inspect.Parameter.empty and p.kind in (
        p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


# -- the run -----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Experiment:
    """A prepared run, its model compiled: what the phases of :func:`run` share.

    Attributes:
        args: the parsed flags (``--smoke`` applied).
        name: the method's name.
        out: the output directory.
        strategy: the ``tf.distribute`` strategy.
        config: the settings a resumed run must share (``config.json``).
        start_time: ``time.perf_counter()`` when the run started.
        data: the training and evaluation splits.
        train_fn: the training transform.
        eval_fn: the evaluation transform.
        model: the compiled model (a ``MetricModel`` when it owns the loss's state).
    """

    args: argparse.Namespace
    name: str
    out: str
    strategy: tf.distribute.Strategy
    config: dict
    start_time: float
    data: ExperimentData
    train_fn: Callable
    eval_fn: Callable
    model: keras.Model

    @property
    def monitor(self):
        """The metric the best epoch is chosen by (maximized)."""
        return "val_small_top1" if self.data.name == "vehicleid" else "val_recall@1"

    @property
    def best_path(self):
        """The best epoch's weights."""
        return os.path.join(self.out, "best.weights.h5")


def _start(args, name):
    """``--smoke``, the output directory, SIGTERM, the strategy, the random seed, determinism,
    the precision policy and ``config.json``: what comes before the data and the model.

    Returns:
        ``(output directory, strategy, config, start time)``.
    """
    if args.smoke:
        apply_smoke(args)
    script = os.path.splitext(os.path.basename(sys.argv[0] or "run"))[0]
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out = args.output_dir or os.path.join("runs", f"{script}-{args.dataset}-{slug}")
    os.makedirs(out, exist_ok=True)
    handle_sigterm()
    strategy = make_strategy(args)
    replicas = strategy.num_replicas_in_sync
    if (args.classes_per_batch * args.samples_per_class) % replicas:
        raise ValueError(f"The batch of P x K = {args.classes_per_batch} x "
                         f"{args.samples_per_class} images cannot be split over {replicas} "
                         "replicas: make P * K a multiple of the number of replicas.")
    keras.utils.set_random_seed(args.seed)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    if args.mixed_precision != "off":
        keras.mixed_precision.set_global_policy(f"mixed_{args.mixed_precision}")
    start_time = time.perf_counter()
    config = resume_config(args, name)
    atomic_write_json(os.path.join(out, "config.json"), config)
    return out, strategy, config, start_time


def _compile(args, loss, strategy, own_state):
    """The model, compiled with the loss (or wrapped in a ``MetricModel`` that owns the loss's
    state) and the optimizer, inside the strategy's scope."""
    with strategy.scope():  # model, loss and optimizer variables belong to the strategy
        model = build_model(args)
        if _is_factory(loss):
            loss = loss()
        if own_state or (own_state is None and is_stateful_loss(loss)):
            model = MetricModel(model, loss)
            model.compile(optimizer=_optimizer(args), jit_compile=args.jit_compile)
        else:
            model.compile(optimizer=_optimizer(args), loss=loss, jit_compile=args.jit_compile)
    return model


def _prepare(args, loss, name, own_state, data) -> _Experiment:
    """The first phase of :func:`run`: settings, output directory, data, transforms and the
    compiled model."""
    out, strategy, config, start_time = _start(args, name)
    if data is None:
        data = load_data(args)
    train_fn, eval_fn = transforms(args)
    model = _compile(args, loss, strategy, own_state)
    return _Experiment(args=args, name=name, out=out, strategy=strategy, config=config,
                       start_time=start_time, data=data, train_fn=train_fn, eval_fn=eval_fn,
                       model=model)


def _resume(exp: _Experiment):
    """The best-weights callback and the :class:`ResumeState`, restored from the last finished
    epoch of an unfinished run in the output directory.

    Returns:
        ``(best-weights callback, resume state, finished epochs)``.
    """
    checkpoint = best_checkpoint(exp.best_path, exp.monitor)
    resume = ResumeState(os.path.join(exp.out, "backup"), config=exp.config,
                         checkpoint=checkpoint, history_csv=os.path.join(exp.out, "history.csv"))
    # The temporary files that a run killed during a save left behind (never read).
    for folder in (exp.out, resume.directory, os.path.join(exp.out, "figures")):
        remove_temporaries(folder)
    with exp.strategy.scope():  # a restored optimizer is built inside the scope
        initial_epoch = resume.restore(exp.model)
    if initial_epoch:
        print(f"Resuming {exp.out} after epoch {initial_epoch} of {exp.args.epochs}.",
              flush=True)
    return checkpoint, resume, initial_epoch


def _train_batches(exp: _Experiment, initial_epoch):
    """The P x K training batches from ``initial_epoch`` on, sharded over the replicas."""
    args = exp.args
    train = pk_batches(exp.data.train, args.classes_per_batch, args.samples_per_class,
                       steps_per_epoch=args.steps_per_epoch, repeat=False, seed=args.seed,
                       map_fn=exp.train_fn, initial_epoch=initial_epoch)
    if exp.strategy.num_replicas_in_sync > 1:
        # Every worker draws the same global P x K batches (same seed); each replica takes
        # its contiguous slice of each batch (sharding by data, not by file).
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        train = train.with_options(options)
    return train


def _fit(exp: _Experiment, callbacks, checkpoint, resume, initial_epoch):
    """Trains the epochs after ``initial_epoch``, evaluating every ``--eval-every`` epochs and
    saving the best weights and the resume state; returns the history of every epoch."""
    args, model = exp.args, exp.model
    train = _train_batches(exp, initial_epoch)
    extra_callbacks = list(callbacks(model, exp.data, exp.eval_fn, exp.out) if callable(callbacks)
                           else callbacks)
    cbs = [
        EvaluateCallback(lambda: evaluate(model, exp.data, exp.eval_fn, args.eval_batch_size),
                         args.eval_every),
        keras.callbacks.LearningRateScheduler(
            learning_rate_schedule(args.learning_rate, args.lr_milestones, args.lr_gamma)),
        *extra_callbacks,
        checkpoint,
        resume,
    ]
    if initial_epoch < args.epochs:
        if isinstance(exp.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            fit_multi_worker(model, exp.strategy, train, args.epochs, initial_epoch, cbs,
                             args.verbose)
        else:
            model.fit(train, epochs=args.epochs, initial_epoch=initial_epoch, callbacks=cbs,
                      verbose=args.verbose, shuffle=False)
    return resume.history


def _evaluate_best(exp: _Experiment, history):
    """The best epoch's weights, evaluated once more with the final metrics.

    Returns:
        ``(the final Evaluation, the best epoch)``.
    """
    if os.path.exists(exp.best_path):
        exp.model.load_weights(exp.best_path)
    final = evaluate(exp.model, exp.data, exp.eval_fn, exp.args.eval_batch_size, final=True)
    return final, best_epoch(history, exp.monitor)


def _figures(exp: _Experiment, history, final: Evaluation, figures):
    """Plots the history of the first metrics (``figures/metrics.png``) and the script's
    ``figures``; returns their paths relative to the output directory."""
    fig_dir = os.path.join(exp.out, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    keys = [k for k in final.values if k.startswith("val_") and "nmi" not in k][:4]
    plot_history(history, keys, os.path.join(fig_dir, "metrics.png"),
                 f"{exp.name} on {exp.data.name}")
    paths = ["figures/metrics.png"]
    if figures is not None:
        paths += [os.path.relpath(p, exp.out)
                  for p in figures(exp.model, exp.data, exp.eval_fn, exp.out, history)]
    return paths


def _export(exp: _Experiment):
    """Exports the embedding model (the best weights) as a SavedModel; returns its path
    relative to the output directory."""
    from tfdml.export import export_embedding_model

    with atomic_path(os.path.join(exp.out, "saved_model"), directory=True) as export_dir:
        export_embedding_model(unwrap(exp.model), export_dir,
                               preprocess=backbone_preprocess(exp.args.backbone), image_size=None,
                               normalize=bool(getattr(exp.args, "normalize", True)))
    return "saved_model"


def _report(exp: _Experiment, history, final: Evaluation, best, figures, extra_results):
    """The results dict, the figures, the SavedModel, ``results.json`` and ``results.md``;
    returns the results."""
    args = exp.args
    replicas = exp.strategy.num_replicas_in_sync
    results = {
        "name": exp.name,
        "dataset": exp.data.name,
        "smoke": bool(args.smoke),
        "config": exp.config,
        "best_epoch": best,
        "metrics": final.values,
        "history": history,
        "epochs_run": [h["epoch"] for h in history],
        "machine": describe_machine(),
        "strategy": f"{args.strategy} ({replicas} replica{'s' if replicas > 1 else ''})",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "seconds_this_process": round(time.perf_counter() - exp.start_time, 1),
    }
    extra = ({} if extra_results is None
             else dict(extra_results(exp.model, exp.data, exp.eval_fn)))
    results["metrics"].update(extra.pop("metrics", {}))
    results.update(extra)
    results["figures"] = _figures(exp, history, final, figures)
    if args.export:
        results["saved_model"] = _export(exp)
    write_results(exp.out, results, extra, title=f"{exp.name} on {exp.data.name}",
                  smoke=args.smoke, best=best, epochs=args.epochs, monitor=exp.monitor)
    return results


def run(args, loss, *, name, callbacks=(), own_state=None, figures=None, extra_results=None,
        data=None):
    """Trains, evaluates and reports one experiment; resumes an unfinished one.

    Args:
        args: the parsed flags of :func:`make_parser` (``--smoke`` applied here).
        loss: a Keras loss object (a tfdml loss), or a function of no arguments that
            returns one: it is then built inside the ``--strategy`` scope, which a loss
            with variables (``MarginLoss``'s β) or a random miner needs.
        name: a short name of the method, written into the results.
        callbacks: further Keras callbacks (after the evaluation, so they see
            its metrics), or a callable ``(model, data, eval_fn, out_dir) -> list``.
        own_state: train ``tfdml.models.MetricModel(model, loss)``, which owns the
            loss's state (``MarginLoss``'s β, proxies, a random miner's seed), so
            that it is trained, updated, checkpointed and restored with the model.
            Defaults to `None`: when the loss has state. The exported SavedModel
            is the embedding model either way.
        figures: ``fn(model, data, eval_fn, out_dir, history) -> list of paths``
            for the paper's figures, called at the end.
        extra_results: ``fn(model, data, eval_fn) -> dict`` added to the
            results (e.g. a CMC curve) and listed in ``results.md``, called at the end;
            a ``"metrics"`` entry (a dict of numbers) is merged into the metrics.
        data: the :class:`ExperimentData`, if the script needed it before building
            the loss (e.g. for the number of classes); loaded with
            :func:`load_data` otherwise. With ``--smoke``, call :func:`apply_smoke`
            before :func:`load_data`.

    Returns:
        The results dict (also written to ``<output-dir>/results.json``).
    """
    exp = _prepare(args, loss, name, own_state, data)
    checkpoint, resume, initial_epoch = _resume(exp)
    history = _fit(exp, callbacks, checkpoint, resume, initial_epoch)
    final, best = _evaluate_best(exp, history)
    return _report(exp, history, final, best, figures, extra_results)


# -- baselines ---------------------------------------------------------------------------------


def _check_seeds(seeds):
    """``seeds`` as a list of distinct integers >= 0, or a ``ValueError`` naming them."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("`seeds` is empty: give at least one seed, e.g. seeds=[0].")
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in seeds):
        raise ValueError(f"`seeds` must be integers >= 0. Received: seeds={seeds!r}")
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"`seeds` has a seed twice. Received: seeds={seeds!r}")
    return [int(s) for s in seeds]


def baselines(args, seeds, batch_size=None) -> dict:
    """The baselines of a run on its own evaluation split: raw pixels and untrained network.

    Evaluates two embeddings that no training step has touched, for the data and model flags
    of ``args``, with the metrics of a run's best epoch (:func:`evaluate` with
    ``final=True``: Recall@K, MAP@R, NMI and F1, cosine):

    * the raw pixels: the images that the evaluation transform gives the network, flattened
      (``keras.Sequential([keras.Input(shape), keras.layers.Flatten()])``, so that the same
      metric code runs on them);
    * the untrained network of each seed: :func:`build_model` right after
      ``keras.utils.set_random_seed(seed)``, as :func:`run` seeds, loads the data and builds
      its model (loading the data and making the transforms draw no random numbers), that is
      the initial weights of a run with ``--seed seed``.

    Only the flags that shape the data, the evaluation transform and the model matter
    (``--dataset``, ``--data-dir``, ``--image-size``, ``--resize-size``, ``--backbone``,
    ``--weights``, ``--embedding-dim``, ``normalize`` where a script adds it); the loss,
    batch and optimizer flags do not change an untrained network. ``--smoke`` is applied as
    :func:`run` applies it; its synthetic data depend on the seed, so each seed is evaluated
    on its own data and the raw pixels on those of the first seed. ``--strategy`` and
    ``--mixed-precision`` are not applied: one device, the global dtype policy.

    Args:
        args: the parsed flags of :func:`make_parser` (not changed; ``seed`` is overridden
            per seed on a copy).
        seeds: the seeds of the untrained networks, distinct integers >= 0.
        batch_size: images per evaluation batch; defaults to `None`: ``--eval-batch-size``.

    Returns:
        ``{"raw pixels": values, "untrained (seed s)": values, ...}``, one entry per seed in
        the order given, where ``values`` is :attr:`Evaluation.values`
        (``{"val_recall@1": ..., "val_map@r": ..., "val_nmi": ..., "val_f1": ...}``).

    Raises:
        ValueError: ``seeds`` is empty, holds a negative number, a non-integer or a seed
            twice.

    Example:

    >>> args = experiments.make_parser("digits").parse_args(
    ...     "--dataset digits --backbone tiny --weights none --image-size 8 --resize-size 8 "
    ...     "--transform none --embedding-dim 64".split())
    >>> rows = experiments.baselines(args, seeds=[0, 1])
    >>> list(rows)
    ['raw pixels', 'untrained (seed 0)', 'untrained (seed 1)']
    >>> raw = rows["raw pixels"]   # cosine on the 64 pixels of the digits 6-9
    >>> round(raw["val_recall@1"], 3)
    0.994
    """
    seeds = _check_seeds(seeds)
    args = copy.copy(args)
    if args.smoke:
        apply_smoke(args)
    batch_size = batch_size or args.eval_batch_size
    rows, data = {}, None
    for seed in seeds:
        args.seed = seed
        keras.utils.set_random_seed(seed)  # then the data and the model, as run does
        if data is None or args.smoke:
            data = load_data(args)
        _, eval_fn = transforms(args)
        model = build_model(args)
        if not rows:
            shape = (args.image_size, args.image_size, 3)
            pixels = keras.Sequential([keras.Input(shape), keras.layers.Flatten()])
            rows["raw pixels"] = evaluate(pixels, data, eval_fn, batch_size, final=True).values
        rows[f"untrained (seed {seed})"] = evaluate(model, data, eval_fn, batch_size,
                                                    final=True).values
    return rows
