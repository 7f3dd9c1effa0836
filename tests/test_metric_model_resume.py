"""Exact resume: n steps, save, load, n more steps equal 2n steps straight, bit for bit.

For every loss whose state moves during a step, listed from the code so that a new one
cannot be missed: every loss class of ``tfdml.losses`` whose default configuration has
state (learned vectors, beta, a memory bank, a histogram, a random miner's seed), and every
miner of ``tfdml.miners`` that draws at random, each inside a loss. Through the weights file
(``save_weights`` / ``load_weights``, what ``BackupAndRestore`` and the experiments' resume
checkpoint use) for every case (one of each kind of state on every commit, the others in the
slow tier), and through a ``.keras`` file for a few; under every backend. Keras saves a
layer's variables but not its random generators' states; the ``MetricModel`` saves those too
(a ``Dropout`` of the embedder included).
"""

from __future__ import annotations

import inspect
import warnings

import keras
import numpy as np
import pytest
from backends import BACKEND, to_numpy
from harness import pk_arrays, slow_beyond

import tfdml
from tfdml import losses, miners
from tfdml.losses.base import MetricLoss
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

NUM_CLASSES = 8
STEPS = 2

# Required constructor arguments, by name, for the loss classes that have them.
REQUIRED = {
    "num_classes": lambda: NUM_CLASSES,
    "l": lambda: 4,  # ManifoldLoss: the embedding size (the models below embed in 4-d)
    "margin": lambda: 0.4,
    "tn": lambda: 1.0,
    "loss": lambda: losses.TripletMarginLoss(miner=miners.TripletMiner("all", "random",
                                                                         seed=3)),
    "losses": lambda: [losses.TripletMarginLoss(miner=miners.TripletMiner("all", "random",
                                                                            seed=4)),
                       losses.ProxyAnchorLoss(NUM_CLASSES)],
}
ABSTRACT = {"MetricLoss", "ClassVectorLoss"}


def _loss_classes():
    return [getattr(losses, name) for name in losses.__all__
            if inspect.isclass(getattr(losses, name))
            and issubclass(getattr(losses, name), MetricLoss) and name not in ABSTRACT]


def _default(cls):
    parameters = inspect.signature(cls.__init__).parameters
    kwargs = {name: REQUIRED[name]() for name, p in parameters.items()
              if name != "self" and p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return cls(**kwargs)


def _stateful_classes():
    return [cls for cls in _loss_classes() if _default(cls).state is not None]


# Miners that draw at random: every miner class that takes a seed, with the strategies that
# draw (the others are deterministic).
RANDOM_MINERS = {
    "TripletMiner": [lambda: miners.TripletMiner("all", "random", seed=0),
                     lambda: miners.TripletMiner("random", "distance_weighted", seed=1),
                     lambda: miners.TripletMiner("random", "hard")],  # seed=None: a random one
    "UniformHistogramMiner": [lambda: miners.UniformHistogramMiner(seed=0),
                              lambda: miners.UniformHistogramMiner()],
}


def _miner_classes_with_a_seed():
    return sorted(name for name in dir(miners)
                  if inspect.isclass(getattr(miners, name))
                  and issubclass(getattr(miners, name), miners.Miner)
                  and "seed" in inspect.signature(getattr(miners, name).__init__).parameters)


CASES = ([pytest.param(lambda cls=cls: _default(cls), id=cls.__name__)
          for cls in _stateful_classes()]
         + [pytest.param(lambda make=make: losses.ContrastiveLoss(miner=make()),
                         id=f"ContrastiveLoss-{name}-{i}")
            for name, makers in RANDOM_MINERS.items() for i, make in enumerate(makers)])


# On every commit one case of each kind of state (a new loss with state is a case of every
# commit until it is listed here); these, whose kind another fast case has, in the slow tier:
# class vectors (ArcFaceLoss; ProxyAnchorLoss inside MultipleLosses), a wrapper of a loss with
# a random miner (MultipleLosses), and the miners' draws, which advance one seed state whatever
# the strategy (TripletMiner: "random" seeded inside MultipleLosses, unseeded inside MarginLoss;
# UniformHistogramMiner unseeded here, seeded in test_keras_file_resumes_exactly).
SLOW_CASES = {
    "CosFaceLoss", "SphereFaceLoss", "LargeMarginSoftmaxLoss", "NormalizedSoftmaxLoss",
    "P2SGradLoss", "ProxyNCALoss", "ProxyAnchorLoss", "SoftTripleLoss", "SubCenterArcFaceLoss",
    "ManifoldLoss", "TrimmedLoss", "SelfSupervisedLoss", "ContrastiveLoss-TripletMiner-0",
    "ContrastiveLoss-TripletMiner-1", "ContrastiveLoss-TripletMiner-2",
    "ContrastiveLoss-UniformHistogramMiner-0",
}


def test_every_stateful_loss_and_random_miner_is_listed():
    """The cases come from the code: a new loss with state is a case by itself; a new miner
    that takes a seed must get its drawing strategies here."""
    assert _miner_classes_with_a_seed() == sorted(RANDOM_MINERS)
    stateful = {cls.__name__ for cls in _stateful_classes()}
    # The losses known to have state today (a sanity check of the listing itself).
    assert {"MarginLoss", "ProxyAnchorLoss", "CrossBatchMemory", "DynamicSoftMarginLoss",
            "ManifoldLoss", "ArcFaceLoss", "SoftTripleLoss", "MultipleLosses"} <= stateful
    for make in (m for makers in RANDOM_MINERS.values() for m in makers):
        assert make().seed_generator is not None
    assert SLOW_CASES <= {case.id for case in CASES}  # a renamed case is not lost


def _batches():
    data = pk_arrays(num_classes=4, per_class=3, num_batches=2 * STEPS, seed=0)
    b = data.batch_size
    return [(data.x[i * b:(i + 1) * b], data.y[i * b:(i + 1) * b] % NUM_CLASSES)
            for i in range(2 * STEPS)]


def _model(make_loss, dropout=False):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((6,)), keras.layers.Dense(5)]
    if dropout:
        # Seeded: under PyTorch an unseeded Dropout draws from torch's global generator, not
        # from its SeedGenerator (docs/losses.md, "Loss state").
        layers.append(keras.layers.Dropout(0.3, seed=5))
    layers.append(keras.layers.Dense(4))
    model = MetricModel(keras.Sequential(layers), make_loss())
    # Eagerly where a step is cheap that way; JAX dispatches op by op eagerly, and compiles
    # one step quicker than it runs them.
    model.compile(optimizer=keras.optimizers.Adam(0.05), run_eagerly=BACKEND != "jax",
                  jit_compile=BACKEND == "jax")
    model.optimizer.build(model.trainable_variables)
    return model


def _train(model, batches):
    for x, y in batches:
        model.train_on_batch(x, y)


def _values(model):
    return [np.array(to_numpy(v)) for v in model.variables]


def _resumes_exactly(make_loss, tmp_path, name="run.weights.h5", dropout=False):
    batches = _batches()
    straight = _model(make_loss, dropout)
    _train(straight, batches[:STEPS])
    path = tmp_path / name
    straight.save(path) if name.endswith(".keras") else straight.save_weights(path)
    _train(straight, batches[STEPS:])
    if name.endswith(".keras"):
        resumed = tfdml.models.load_model(path)
    else:
        keras.utils.set_random_seed(1)  # another initialization: all of it comes from the file
        resumed = _model(make_loss, dropout)
        resumed.load_weights(path)
    _train(resumed, batches[STEPS:])
    seeds = [v for v in straight.variables if v.name == "seed_generator_state"]
    assert all(int(to_numpy(v)[1]) > 0 for v in seeds)  # the random generators did advance
    for v, a, b in zip(straight.variables, _values(straight), _values(resumed), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=v.path)
    return straight


@pytest.mark.parametrize("make_loss", slow_beyond(CASES, {c.id for c in CASES} - SLOW_CASES))
def test_n_steps_save_load_n_steps_equals_2n_steps(make_loss, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # degenerate-batch notes of some losses
        _resumes_exactly(make_loss, tmp_path)


@pytest.mark.parametrize("make_loss", [
    lambda: losses.MarginLoss(),  # a random miner with seed=None
    lambda: losses.ContrastiveLoss(miner=miners.UniformHistogramMiner(seed=0)),
    lambda: losses.CrossBatchMemory(losses.ContrastiveLoss(), memory_size=24),
], ids=["margin_default", "uniform_histogram", "xbm"])
def test_keras_file_resumes_exactly(make_loss, tmp_path):
    _resumes_exactly(make_loss, tmp_path, name="run.keras")


def test_the_embedders_random_layers_resume_exactly(tmp_path):
    """A Dropout: its generator's state is saved with the model's, so the resumed run drops
    the same units."""
    model = _resumes_exactly(lambda: losses.TripletMarginLoss(), tmp_path, dropout=True)
    assert len([v for v in model.variables if v.name == "seed_generator_state"]) == 1


def test_a_file_without_generator_states_loads_with_a_warning(tmp_path):
    """A weights file of another model layout (here: a plain Keras save of the same layers,
    as tfdml wrote before it saved the generators) still loads, and says that the draws
    start again."""
    make = lambda: losses.MarginLoss()  # noqa: E731
    model = _model(make)
    path = tmp_path / "old.weights.h5"
    keras.Model.save_weights(model, path)  # Keras' own save: what MetricModel adds is there too
    import h5py

    with h5py.File(path, "a") as f:  # remove the generators' entry, as in an older file
        for key in [k for k in f["vars"].keys() if k == MetricModel.SEED_STATES_KEY]:
            del f["vars"][key]
    with pytest.warns(UserWarning, match="random generator"):
        _model(make).load_weights(path)


def test_a_file_with_other_generators_is_refused(tmp_path):
    path = tmp_path / "run.weights.h5"
    _model(lambda: losses.MarginLoss()).save_weights(path)
    with pytest.raises(ValueError, match="random generator state"):
        _model(lambda: losses.MarginLoss(), dropout=True).load_weights(path)
