"""Contract tests every tfdml loss must pass: serialization, training, degenerate batches,
mixed precision, input validation, reductions and memory (no hidden B^3 tensors).

To cover a new loss (or loss + miner configuration), add one line to ``LOSS_CASES``
(``tests/loss_cases.py``). Each check runs on the cases it can tell apart: what a loss class
shares with every loss (config, save and load, reductions, class ids in low precision) on
one case per class; where the loss and its miner meet (degenerate batches, no triplet, no
B^3 tensor) on one case per class and per miner kind. Each case's values and gradients,
eager and compiled, are those of the record (``tests/losses/test_recorded_losses.py``).

The tests marked ``multibackend`` also run under JAX and PyTorch (``make test-slow``). The
graph and HLO inspections and the ``tf.data`` pipelines stay TensorFlow-only.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import keras
import numpy as np
import pytest
from backends import BACKEND, CAN_COMPILE, compiled, to_numpy
from harness import (
    Batch,
    LossProbe,
    assert_config_roundtrip,
    assert_finite_loss_and_grads,
    assert_keras_save_load,
    assert_one_step_fit,
    degenerate_batches,
    degenerate_examples,
    large_tensor_ops,
    loss_and_grads,
    mixed_precision_loss,
    no_triplet_batches,
    nonfinite_batches,
    pk_arrays,
    pk_data,
    pk_dataset,
    run_under_policy,
    slow_beyond,
    small_embedding_model,
    trace_loss_graph,
    walk_graph_ops,
    with_examples,
    with_reduction,
    xla_large_shapes,
)
from hypothesis import Phase, given, settings
from keras import ops
from loss_cases import CASES, LOSS_CASES, ONE_PER_CLASS, ONE_PER_CLASS_AND_MINER

import tfdml
from tfdml import losses
from tfdml.losses import (
    ContrastiveLoss,
    MarginLoss,
    MetricLoss,
    MultiSimilarityLoss,
    TrimmedLoss,
    TripletMarginLoss,
    TripletNCALoss,
    triplet_margin_loss,
    triplet_nca_loss,
)
from tfdml.miners import MultiSimilarityMiner, TripletMiner

# The contract tests call MarginLoss without a model to train its beta.
pytestmark = pytest.mark.filterwarnings("ignore:Loss .* has learned variables")

MB = pytest.mark.multibackend
ON_TF = BACKEND == "tensorflow"

def params(cases, multibackend=frozenset()):
    """pytest params; the cases whose id is in ``multibackend`` (True: all) are also
    marked ``multibackend`` (they run under JAX and PyTorch too)."""
    return [
        pytest.param(case, id=case.id,
                     marks=MB if multibackend is True or case.id in multibackend else ())
        for case in cases
    ]


def pick(*ids, multibackend=True):
    return params([CASES[i] for i in ids], multibackend)


#: What a loss class shares with every loss (config, save and load, reductions, class ids):
#: one case per class. Where the loss and its miner meet (degenerate batches, no triplet,
#: no B^3 tensor): every class and every miner kind once. Each loss with each of its miners
#: is checked for values and gradients, eager and compiled, by the recorded values
#: (tests/losses/test_recorded_losses.py).
PER_CLASS = params(ONE_PER_CLASS, multibackend=True)
PER_CLASS_AND_MINER = params(ONE_PER_CLASS_AND_MINER, multibackend=True)


def fresh(loss):
    return with_reduction(loss, loss.reduction)


def takes(loss, argument) -> bool:
    """Whether the loss's class takes ``argument`` (``reduction``, ``average``)."""
    return argument in inspect.signature(type(loss).__init__).parameters


def built(loss, embedding_dim):
    """``loss`` with its state built for embeddings of size ``embedding_dim``: a state sized
    by the embeddings (class vectors, a memory bank) cannot be made inside a traced step."""
    if isinstance(loss, MetricLoss):
        loss.build_state(embedding_dim)
    return loss


def skip_unless_probed(case):
    """The fuzz tests trace one probe with a dynamic embedding size, on any class ids and
    any number of rows."""
    if case.sized_state:
        pytest.skip("its state is sized by the embedding size, which a traced probe does "
                    "not know")
    if case.class_ids is not None:
        pytest.skip(f"class ids must be in [0, {case.class_ids})")
    if case.two_views:
        pytest.skip("two stacked views: an even number of rows, no labels")
    if not case.per_anchor:
        pytest.skip("no terms per anchor: no reduction='none'")


# -- every public loss is a contract case --------------------------------------------------------

#: The public loss classes that no case of LOSS_CASES makes, and why.
EXEMPT = {
    "MetricLoss": "the base class of the losses, with no terms of its own",
    "ClassVectorLoss": "the base class of the losses with learned class vectors",
    "ManifoldLoss": "its embedding size is an argument (`l`), and the contract checks use "
                    "several; tests/losses/test_manifold.py checks it on one",
    "SimSiamLoss": "y_true holds the targets, not class ids; "
                   "tests/losses/test_self_supervised.py checks it",
    "BYOLLoss": "y_true holds the target network's projections, not class ids; "
                "tests/losses/test_self_supervised.py checks it",
    "MoCoLoss": "y_true holds the momentum encoder's keys, not class ids; "
                "tests/losses/test_self_supervised.py checks it",
}


@MB
def test_every_public_loss_is_a_contract_case_or_exempt():
    """A new public loss joins LOSS_CASES (tests/loss_cases.py), or EXEMPT with the reason."""
    public = {name for name in losses.__all__
              if inspect.isclass(cls := getattr(losses, name))
              and issubclass(cls, keras.losses.Loss)}
    made = {type(case.make()).__name__ for case in LOSS_CASES}
    assert public - made - set(EXEMPT) == set(), "neither a contract case nor exempt"
    assert set(EXEMPT) <= public and not set(EXEMPT) & made, "a stale exemption"


# A 10-sample batch with classes of 3, 3, 2 and two singletons (anchors without positive);
# B != D so that axis mistakes cannot hide.
LABELS = np.array([0, 1, 0, 2, 1, 0, 3, 2, 1, 4], np.int32)
EMBEDDINGS = np.random.default_rng(42).normal(size=(10, 5)).astype(np.float32)


def triplet_anchors(labels):
    """Anchors that have both a positive and a negative in the batch."""
    same = labels[:, None] == labels[None, :]
    positive = (same & ~np.eye(len(labels), dtype=bool)).any(axis=1)
    return positive & (~same).any(axis=1)


# -- serialization -----------------------------------------------------------------------------


# A miner's config is one code path whatever its strategies: on every commit each loss class
# (with its miner) and the disjoint miner; the other miner kinds in the slow tier.
CONFIG_FAST = {case.id for case in ONE_PER_CLASS} | {"nca2_disjoint_easy_hard"}


@pytest.mark.parametrize("case", slow_beyond(PER_CLASS_AND_MINER, CONFIG_FAST))
def test_config_roundtrip(case):
    loss = case.make()
    clone = assert_config_roundtrip(loss)
    if getattr(loss, "miner", None) is not None:
        assert_config_roundtrip(loss.miner)
        assert clone.miner is not loss.miner
    # The rebuilt loss computes the same thing.
    np.testing.assert_allclose(
        to_numpy(loss(LABELS, EMBEDDINGS)), to_numpy(clone(LABELS, EMBEDDINGS)), rtol=1e-6
    )


# The .keras file stores the loss as serialize_keras_object does, which test_config_roundtrip
# checks for every case on every commit (JSON included); saved in a model and loaded on every
# commit, one case per kind of nested config and state: a miner, a learned variable, a wrapped
# loss, a list of losses, class vectors and their initializer, a running histogram and a
# memory bank. The other classes in the slow tier.
SAVE_LOAD_FAST = {"nca_order1", "wu_default", "trimmed_margin_random", "multiple_nca_contrastive",
                  "normalized_softmax", "dynamic_soft_margin", "xbm_nca2_bank64"}


@pytest.mark.parametrize("case", slow_beyond(PER_CLASS, SAVE_LOAD_FAST))
def test_keras_save_load(case, tmp_path):
    if case.two_views:
        pytest.skip("two stacked views: the model's batch has an odd number of rows")
    assert_keras_save_load(case.factory, tmp_path)


@MB
def test_config_keeps_dtype():
    loss = TripletNCALoss(dtype="float16")
    assert type(loss).from_config(loss.get_config()).dtype == "float16"


# -- XLA, training -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", slow_beyond(  # margin_cos_random: nca2_random's miner, random/random
        pick("nca2_random", "margin_cos_random", "nca2_easy_dw", "wu_all_dw", "wu_default",
             "margin_disjoint_dw", multibackend={"nca2_random", "wu_all_dw"}),
        {"nca2_random", "nca2_easy_dw", "wu_all_dw", "wu_default", "margin_disjoint_dw"})
)
def test_seeded_random_miner_reproducible_and_compiles(case):
    """Under PyTorch ``compiled`` is the function itself: the later calls run eagerly."""
    first = case.make()
    a = to_numpy(first(LABELS, EMBEDDINGS))
    b = to_numpy(case.make()(LABELS, EMBEDDINGS))
    assert a == b, "two losses with the same seed gave different first values"
    step = compiled(lambda y, x: first(y, x))
    values = [to_numpy(step(LABELS, EMBEDDINGS)) for _ in range(3)]
    assert np.all(np.isfinite(values))
    broken = EMBEDDINGS.copy()
    broken[4, 0] = np.nan
    assert np.isnan(to_numpy(step(LABELS, broken)))


@pytest.mark.parametrize("case", pick("nca2_random"))
def test_one_step_fit_jit(case):
    """(PyTorch: eager fit; the other backends compile the train step.)"""
    assert_one_step_fit(case.factory, jit_compile=True, steps=2)


def test_issue_example_nca_order2_jit_fit_on_tf_data():
    """``model.compile(loss=TripletNCALoss(order=2), jit_compile=True)`` + fit on tf.data,
    with class ids > 2048 and [B, 1] labels as some pipelines give them."""
    dataset = pk_dataset(label_offset=3000).map(lambda x, y: (x, y[:, None]))
    model = small_embedding_model()
    assert_one_step_fit(
        tfdml.losses.TripletNCALoss(order=2), jit_compile=True, dataset=dataset, model=model
    )


@MB
@pytest.mark.skipif(BACKEND == "jax", reason="an eager (jit_compile=False) JAX fit compiles "
                    "every op: too slow for CI; test_one_step_fit_jit fits under JAX")
@pytest.mark.parametrize("factory", [TripletNCALoss, TripletMarginLoss], ids=["nca", "margin"])
def test_default_losses_fit_with_steps_per_epoch(factory):
    history = assert_one_step_fit(factory, jit_compile=False, steps=2, epochs=2)
    assert len(history.history["loss"]) == 2


# -- the seed state of random miners in fit ------------------------------------------------------


def _three_fit_steps(loss, wrap):
    """The logged losses of 3 fit steps at learning rate 0 on one fixed batch (only the
    miner's draws can change them), in a MetricModel (``wrap``) or a bare model."""
    data = pk_arrays(num_batches=1)
    model = small_embedding_model()
    if wrap:
        model = tfdml.models.MetricModel(model, loss)
        model.compile(optimizer=keras.optimizers.SGD(0.0), jit_compile=CAN_COMPILE)
    else:
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss, jit_compile=CAN_COMPILE)
    logged = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: logged.append(float(logs["loss"])))
    model.fit(np.tile(data.x, (3, 1)), np.tile(data.y, 3), batch_size=len(data.y),
              shuffle=False, verbose=0, callbacks=[record])
    return logged


@MB
@pytest.mark.parametrize("make_loss", [
    lambda: TripletNCALoss(miner=TripletMiner("random", "random", seed=3)),
    lambda: tfdml.losses.MarginLoss(miner=TripletMiner("all", "distance_weighted", seed=3)),
], ids=["nca_random", "margin_distance_weighted"])
def test_owned_random_miner_draws_anew_at_every_fit_step(make_loss):
    """The MetricModel owns the miner's seed: every compiled step draws anew (JAX's
    stateless training included), and the seed state moves on."""
    loss = make_loss()
    generator = loss.miner.seed_generator
    before = to_numpy(generator.state)
    with warnings.catch_warnings():
        # Neither the JAX warning nor a spurious "no anchor" (PyTorch's symbolic build).
        warnings.simplefilter("error", UserWarning)
        logged = _three_fit_steps(loss, wrap=True)
    assert not np.array_equal(to_numpy(generator.state), before)
    # Keras logs the running mean of the epoch: it moves only if the draws change.
    assert np.ptp(logged) > 1e-4, logged


@MB
@pytest.mark.skipif(BACKEND != "jax", reason="JAX's stateless training only")
def test_unowned_random_miner_warns_and_repeats_under_jax():
    loss = TripletNCALoss(miner=TripletMiner("random", "random", seed=3))
    with pytest.warns(UserWarning, match="MetricModel"):
        logged = _three_fit_steps(loss, wrap=False)
    assert np.ptp(logged) < 1e-6, logged  # the documented failure the warning is about


# -- degenerate batches ------------------------------------------------------------------------


@functools.cache
def probe(case_id):
    """One traced probe per case, shared by the fuzz tests (tracing is the slow part)."""
    return LossProbe(CASES[case_id].factory, extra_reductions=())


# The fuzz tests by backend. TensorFlow: a probe traced once with dynamic shapes, many
# generated examples. PyTorch: an eager probe, fast, so a few generated examples. JAX: the
# probe is compiled (jax.jit) once per batch shape, and hypothesis' generated batches all
# have different shapes, so only the hand-made examples of one shape, FUZZ_SHAPE, run.
#
# A fuzz test of the fast tier runs its hand-made examples (each kind of degenerate batch;
# tracing the probe is most of the cost); the test of the same name with the suffix
# ``_on_generated_batches``, in the slow tier, runs hypothesis' generated batches through the
# same check.
FUZZ_SHAPE = (8, 5)


def fuzz_settings(tf_examples, torch_examples):
    if BACKEND == "jax":
        return settings(phases=[Phase.explicit])
    return settings(max_examples=tf_examples if ON_TF else torch_examples)


#: The hand-made examples alone (``@with_examples``): the fast tier.
EXAMPLES_ONLY = settings(phases=[Phase.explicit])

#: Under JAX only the hand-made examples run (see above): nothing is generated.
GENERATED_NOT_UNDER_JAX = pytest.mark.skipif(
    BACKEND == "jax", reason="one compile per batch shape: the hand-made examples only")


def generated_settings(tf_examples, torch_examples):
    """The generated batches alone (the hand-made ones are the test without the suffix)."""
    return settings(max_examples=tf_examples if ON_TF else torch_examples,
                    phases=[phase for phase in Phase if phase is not Phase.explicit])


def fuzz_examples(batches):
    """The hand-made examples (under JAX, those of FUZZ_SHAPE)."""
    if BACKEND != "jax":
        return batches
    return [b for b in batches if b.embeddings.shape == FUZZ_SHAPE]


def _one_shape_examples():
    """A one-class and a singleton batch of FUZZ_SHAPE (degenerate_examples' have 6 rows)."""
    x = np.random.default_rng(6).normal(size=FUZZ_SHAPE).astype(np.float32)
    singletons = np.array([0, 1, 255, 256, 2047, 2048, 4097, 2**24 + 1], np.int32)
    return [Batch(np.full(8, 2**20 + 3, np.int32), x, "one_class_8"),
            Batch(singletons, x, "singletons_8")]


DEGENERATE_EXAMPLES = degenerate_examples() + _one_shape_examples()


@pytest.mark.parametrize("case", PER_CLASS_AND_MINER)
@EXAMPLES_ONLY
@given(batch=degenerate_batches())
@with_examples(fuzz_examples(DEGENERATE_EXAMPLES))
def test_degenerate_batches_finite(case, batch):
    _check_degenerate_batch(case, batch)


@pytest.mark.slow
@GENERATED_NOT_UNDER_JAX
@pytest.mark.parametrize("case", PER_CLASS_AND_MINER)
@generated_settings(10, 3)
@given(batch=degenerate_batches())
def test_degenerate_batches_finite_on_generated_batches(case, batch):
    _check_degenerate_batch(case, batch)


def _check_degenerate_batch(case, batch):
    skip_unless_probed(case)
    out = probe(case.id)(batch.labels, batch.embeddings)
    for key, value in out.items():
        assert np.all(np.isfinite(value)), f"non-finite {key}: {value}"
    assert out["value"] >= 0.0 or case.signed
    assert out["none"].shape == batch.labels.shape
    if not case.zero_without_triplet:
        return
    assert np.all(out["none"][~triplet_anchors(batch.labels)] == 0.0)
    if not batch.has_triplet:
        assert out["value"] == 0.0
        assert np.all(out["grad"] == 0.0)


def _nonfinite_examples():
    """One NaN entry in a P x K batch, an Inf row in a one-class batch, -Inf everywhere."""
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 3], np.int32)
    x = np.random.default_rng(9).normal(size=FUZZ_SHAPE).astype(np.float32)
    entry, row, everything = x.copy(), x.copy(), np.full_like(x, -np.inf)
    entry[2, 1] = np.nan
    row[3] = np.inf
    return [Batch(labels, entry, "pk+nan@entry"), Batch(np.full(8, 5, np.int32), row,
                                                          "one_class+inf@row"),
            Batch(labels, everything, "pk-inf@all")]


# The check sits in the shared reduction, so one configuration per loss and miner kind is
# fuzzed traced (what can differ is a crash on the way, as FAPPY's NaN bin index once was);
# one case per loss class is checked eagerly, in every reduction, below.
NONFINITE_FUZZ = pick("nca_order1", "nca2_all_semihard", "nca2_disjoint_easy_hard", "margin_l2",
                      "margin_all_all", "wu_default", "wu_all_dw", "wu_ms_pairs", "ms_default",
                      "contrastive_all_pairs", "trimmed_nca2", "loop_triplet", "loop_ms",
                      "loop_ms_segments", "hphn_triplet", "lifted_structure", "fappy",
                      "histogram")


@pytest.mark.parametrize("case", NONFINITE_FUZZ)
@EXAMPLES_ONLY
@given(batch=nonfinite_batches())
@with_examples(fuzz_examples(_nonfinite_examples()))
def test_nonfinite_embeddings_give_nan(case, batch):
    """A NaN or Inf anywhere in the batch gives a NaN loss (TerminateOnNaN fires), never a
    finite value from a selection that silently skipped the bad sample."""
    _check_nonfinite_batch(case, batch)


@pytest.mark.slow
@GENERATED_NOT_UNDER_JAX
@pytest.mark.parametrize("case", NONFINITE_FUZZ)
@generated_settings(10, 3)
@given(batch=nonfinite_batches())
def test_nonfinite_embeddings_give_nan_on_generated_batches(case, batch):
    _check_nonfinite_batch(case, batch)


def _check_nonfinite_batch(case, batch):
    out = probe(case.id)(batch.labels, batch.embeddings)
    assert np.isnan(out["value"]), (batch.kind, out["value"])
    assert np.all(np.isnan(out["none"])), (batch.kind, out["none"])


@pytest.mark.parametrize("case", PER_CLASS)
def test_nonfinite_embeddings_give_nan_eagerly_for_every_reduction(case):
    if not takes(case.make(), "reduction"):
        pytest.skip("one value for the batch: no reduction, no sample weights")
    weights = np.linspace(0.5, 2.0, 10).astype(np.float32)
    for reduction, bad in (("sum_over_batch_size", np.nan), ("mean_with_sample_weight", np.inf),
                           ("sum", -np.inf), ("none", np.nan))[:4 if case.per_anchor else 3]:
        x = EMBEDDINGS.copy()
        x[3, 1] = bad
        value = to_numpy(with_reduction(case.factory, reduction)(LABELS, x,
                                                                 sample_weight=weights))
        assert np.all(np.isnan(value)), (bad, reduction, value)


# Slow tier: test_degenerate_batches_finite asserts the same (value, per-anchor values and
# gradient exactly 0) on these hand-made batches on every commit; here batches without a
# triplet are generated too.
@pytest.mark.slow
@pytest.mark.parametrize("case", PER_CLASS_AND_MINER)
@fuzz_settings(10, 2)
@given(batch=no_triplet_batches())
@with_examples(fuzz_examples([b for b in DEGENERATE_EXAMPLES if not b.has_triplet]))
def test_no_triplet_gives_exact_zero(case, batch):
    if not case.zero_without_triplet:
        pytest.skip("a pair loss over all pairs learns from negative pairs alone")
    skip_unless_probed(case)
    assert not batch.has_triplet
    out = probe(case.id)(batch.labels, batch.embeddings)
    for key in ("value", "none", "grad"):
        assert np.all(out[key] == 0.0), (key, out[key])


# Every class's terms without a triplet are checked in its own reduction on every commit
# (test_degenerate_batches_finite, hand-made batches with one class and with singletons). The
# other reductions and sample weights are reduce_terms' (tfdml.losses.terms), whose path
# depends on the average: on every commit one class per average (anchors, nonzero, batch,
# terms), one that does not normalize, and each class with its own compute_terms (the
# trimmed wrapper, the memory bank, the dynamic soft margin); the others in the slow tier.
NO_TRIPLET_REDUCTIONS_FAST = {"nca_order1", "wu_default", "ms_default", "ntxent",
                              "soft_nearest_neighbor", "trimmed_margin_random", "xbm_nca2_bank64",
                              "dynamic_soft_margin"}


@pytest.mark.parametrize("case", slow_beyond(PER_CLASS, NO_TRIPLET_REDUCTIONS_FAST))
def test_no_triplet_zero_for_every_reduction(case):
    """(The default reduction is fuzzed above.)"""
    if not case.zero_without_triplet:
        pytest.skip("a pair loss over all pairs learns from negative pairs alone")
    weights = np.linspace(0.5, 2.0, 10).astype(np.float32)
    for labels in (np.full(10, 2**16 + 1), np.arange(10) * 300):
        for reduction in ("mean_with_sample_weight", "sum", "none"):
            loss = with_reduction(case.factory, reduction)
            value, grad = loss_and_grads(loss, labels, EMBEDDINGS, sample_weight=weights)
            assert np.all(value == 0.0) and np.all(grad == 0.0), (reduction, value)


@pytest.mark.parametrize("case", pick("nca_order2", "margin_l2", "nca2_disjoint_easy_hard"))
def test_degenerate_batches_eager(case):
    """The fuzz tests run traced; spot-check the same batches eagerly."""
    zero_rows = EMBEDDINGS.copy()
    zero_rows[::3] = 0.0
    duplicates = np.repeat(EMBEDDINGS[:2], 5, axis=0)
    for labels, embeddings, empty in [
        (LABELS, zero_rows, False),
        (LABELS, duplicates, False),
        (LABELS, np.zeros_like(EMBEDDINGS), False),
        (np.full(10, 4099), EMBEDDINGS, True),
        (np.arange(10) + 2**20, EMBEDDINGS, True),
    ]:
        value, grad = assert_finite_loss_and_grads(case.factory, labels, embeddings)
        if empty:
            assert value == 0.0 and np.all(grad == 0.0)


# -- class ids and mixed precision -------------------------------------------------------------

# Class 7 has a triplet whatever happens; the two other samples are positives of each
# other only if their ids are (wrongly) merged.
ID_EMBEDDINGS = np.array(
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.0, 0.75]], np.float32
)


def _expected_and_merged(factory, embeddings):
    """Loss values for labels that keep the two ids apart (correct) and that merge them."""
    correct = to_numpy(factory()(np.array([0, 1, 7, 7]), embeddings))
    merged = to_numpy(factory()(np.array([0, 0, 7, 7]), embeddings))
    assert not np.isclose(correct, merged, rtol=1e-3), "test batch does not tell the cases apart"
    return correct, merged


# The class ids take the same path whatever the low-precision dtype: on every commit every
# class with two ids that bfloat16 merges; float16 and larger ids in the slow tier (and, in a
# mixed-precision model, in test_mixed_precision_model_keeps_class_ids on every commit).
@pytest.mark.parametrize("case", PER_CLASS)
@pytest.mark.parametrize(
    "ids,dtype",
    slow_beyond([pytest.param((256, 257), "bfloat16", id="256_257_bf16"),
                 pytest.param((4096, 4097), "bfloat16", id="4096_4097_bf16"),
                 pytest.param((2048, 2049), "float16", id="2048_2049_fp16")], {"256_257_bf16"}),
)
def test_class_ids_stay_distinct_with_low_precision_embeddings(case, ids, dtype):
    if case.class_ids is not None and case.class_ids <= max(ids):
        pytest.skip(f"class ids must be in [0, {case.class_ids})")
    if case.two_views:
        pytest.skip("two stacked views: the labels are not used")
    embeddings = ops.cast(ID_EMBEDDINGS, dtype)
    as_low = to_numpy(ops.cast(ops.cast(np.array(ids, np.float32), dtype), "float32"))
    assert as_low[0] == as_low[1], (
        "the ids must collide in the low-precision dtype for this test to mean anything"
    )
    correct, _ = _expected_and_merged(case.factory, to_numpy(ops.cast(embeddings, "float32")))
    # int64 as tf.data gives them (JAX without jax_enable_x64: int32, the ids fit).
    labels = ops.convert_to_tensor(np.array([ids[0], ids[1], 7, 7], np.int64))
    value = case.make()(labels, embeddings)
    np.testing.assert_allclose(to_numpy(value), correct, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "policy,ids",
    [
        ("mixed_bfloat16", (256, 257)),
        ("mixed_bfloat16", (4096, 4097)),
        ("mixed_float16", (2048, 2049)),
    ],
    ids=["bf16_256_257", "bf16_4096_4097", "fp16_2048_2049"],
)
# The model's dtype policy and the loss's labels meet in the shared MetricLoss path: one loss
# on every commit, the triplet margin loss in the slow tier (with bfloat16 embeddings, every
# class is checked by test_class_ids_stay_distinct_with_low_precision_embeddings).
@pytest.mark.parametrize("case", slow_beyond(
    pick("nca_order2", "margin_squared_l2",
         multibackend={"nca_order2"} if BACKEND == "jax" else True), {"nca_order2"}))
def test_mixed_precision_model_keeps_class_ids(case, policy, ids):
    labels = [ids[0], ids[1], 2049 + 7, 2049 + 7]
    result = mixed_precision_loss(
        case.factory, policy, labels, ID_EMBEDDINGS, kernel=np.eye(3),
        fit_steps=1 if ids != (4096, 4097) else 0,
    )
    correct, _ = _expected_and_merged(case.factory, result["embeddings"])
    np.testing.assert_allclose(result["direct"], correct, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result["evaluate"], correct, rtol=1e-5, atol=1e-6)


@MB
def test_mixed_bfloat16_jit_fit_default_margin_loss():
    """The default TripletMarginLoss (all/semihard: sort + searchsorted) under XLA and bfloat16
    (PyTorch: eagerly)."""
    with run_under_policy("mixed_bfloat16"):
        model = small_embedding_model()
        output = model(np.zeros((1, 6), np.float32))
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        assert_one_step_fit(
            TripletMarginLoss(), jit_compile=True, dataset=pk_data(label_offset=4095),
            model=model,
        )
    assert keras.config.dtype_policy().name == "float32"


@MB
def test_int64_class_ids_beyond_int32_not_merged():
    labels = np.array([0, 2**32, 7, 7], np.int64)
    correct, _ = _expected_and_merged(TripletNCALoss, ID_EMBEDDINGS)
    try:
        value = to_numpy(TripletNCALoss()(labels, ID_EMBEDDINGS))
    except ValueError:
        return  # rejecting the ids would be fine too
    np.testing.assert_allclose(value, correct, rtol=1e-6)


# -- input validation --------------------------------------------------------------------------


def _call(loss, labels_shape, embeddings_shape):
    return loss(np.zeros(labels_shape, np.int32), np.ones(embeddings_shape, np.float32))


BAD_INPUTS = [
    ("batch_mismatch", lambda: _call(TripletNCALoss(), (5,), (4, 3)),
     r"`y_true`.*Received: y_true\.shape=\(5,\), y_pred\.shape=\(4, 3\)"),
    ("batch_mismatch_margin", lambda: _call(TripletMarginLoss(), (4, 1), (6, 3)),
     r"`y_true`.*y_true\.shape=\(4,\).*y_pred\.shape=\(6, 3\)"),
    ("embeddings_rank3", lambda: _call(TripletNCALoss(), (4,), (4, 3, 2)),
     r"`y_pred`.*Received: y_pred\.shape=\(4, 3, 2\)"),
    ("embeddings_rank1", lambda: _call(TripletMarginLoss(), (4,), (4,)),
     r"`y_pred`.*Received: y_pred\.shape=\(4,\)"),
    ("labels_rank3", lambda: _call(TripletNCALoss(), (4, 1, 1), (4, 3)),
     r"`y_true`.*Received: y_true\.shape=\(4, 1, 1\)"),
    # [4, 2] is multi-hot label sets: all zeros, every set is empty.
    ("labels_b_by_2", lambda: _call(TripletMarginLoss(), (4, 2), (4, 3)),
     r"`y_true` has samples with an empty label set"),
    ("positive_name", lambda: TripletMiner(positive="medium"),
     r"`positive`.*Received: positive='medium'"),
    ("negative_name", lambda: TripletMiner(negative="hardest"),
     r"`negative`.*Received: negative='hardest'"),
    ("temperature_zero", lambda: TripletNCALoss(temperature=0),
     r"`temperature`.*Received: temperature=0"),
    ("temperature_negative", lambda: TripletNCALoss(temperature=-0.5),
     r"`temperature`.*Received: temperature=-0\.5"),
    ("temperature_nan", lambda: TripletNCALoss(temperature=float("nan")),
     r"`temperature`.*Received: temperature=nan"),
    ("order_3", lambda: TripletNCALoss(order=3), r"`order`.*Received: order=3"),
    ("order_0", lambda: TripletNCALoss(order=0), r"`order`.*Received: order=0"),
    ("distance", lambda: TripletMarginLoss(distance="manhattan"),
     r"`distance`.*Received: distance='manhattan'"),
    ("margin_negative", lambda: TripletMarginLoss(margin=-0.1),
     r"`margin`.*Received: margin=-0\.1"),
    ("reduction_nca", lambda: TripletNCALoss(reduction="avg"),
     r"`reduction`.*Received: reduction='avg'"),
    ("reduction_margin", lambda: TripletMarginLoss(reduction="auto"),
     r"`reduction`.*Received: reduction='auto'"),
    ("miner_string", lambda: TripletNCALoss(miner="easy"), r"`miner`.*Received: miner='easy'"),
    ("miner_loss", lambda: TripletMarginLoss(miner=keras.losses.MeanSquaredError()),
     r"`miner`.*Received: miner=<"),
    ("disjoint_all_positive", lambda: TripletMiner("all", "hard", disjoint=True),
     r"`disjoint=True`.*Received: positive='all', negative='hard'"),
    ("disjoint_all_negative", lambda: TripletMiner("easy", "all", disjoint=True),
     r"`disjoint=True`.*Received: positive='easy', negative='all'"),
    ("seed_string", lambda: TripletMiner("random", "random", seed="1"),
     r"`seed`.*Received: seed='1'"),
    ("functional_temperature", lambda: triplet_nca_loss(LABELS, EMBEDDINGS, temperature=0.0),
     r"`temperature`.*Received: temperature=0\.0"),
    ("functional_distance", lambda: triplet_margin_loss(LABELS, EMBEDDINGS, distance="L2"),
     r"`distance`.*Received: distance='L2'"),
    ("functional_mismatch", lambda: triplet_nca_loss(LABELS[:4], EMBEDDINGS),
     r"`y_true`.*Received: y_true\.shape=\(4,\)"),
    ("ref_labels_alone", lambda: triplet_nca_loss(LABELS, EMBEDDINGS, ref_labels=LABELS),
     r"`ref_labels`"),
    ("dw_lower_cutoff", lambda: TripletMiner("easy", "distance_weighted", lower_cutoff=2.0),
     r"`lower_cutoff`.*Received: lower_cutoff=2\.0"),
    ("dw_upper_cutoff", lambda: TripletMiner("easy", "distance_weighted", upper_cutoff=0.4),
     r"`upper_cutoff`.*Received: upper_cutoff=0\.4"),
    ("dw_without_embeddings", lambda: TripletMiner("easy", "distance_weighted").mine(
        ops.eye(3), [0, 0, 1]), r"needs the embeddings"),
    ("ms_epsilon_negative", lambda: MultiSimilarityMiner(epsilon=-0.1),
     r"`epsilon`.*Received: epsilon=-0\.1"),
    ("ms_positive_name", lambda: MultiSimilarityMiner(positive="semihard"),
     r"`positive`.*Received: positive='semihard'"),
    ("ms_alpha_zero", lambda: MultiSimilarityLoss(alpha=0), r"`alpha`.*Received: alpha=0"),
    ("wu_margin_negative", lambda: MarginLoss(margin=-0.2), r"`margin`.*Received: margin=-0\.2"),
    ("wu_num_classes_zero", lambda: MarginLoss(num_classes=0),
     r"`num_classes`.*Received: num_classes=0"),
    ("wu_beta_list_no_classes", lambda: MarginLoss(beta=[1.0, 1.2]), r"`num_classes`"),
    ("wu_labels_out_of_range", lambda: MarginLoss(num_classes=3)(LABELS, EMBEDDINGS),
     r"`num_classes=3`.*\[0, 3\).*from 0 to 4"),
    ("wu_beta_lr", lambda: MarginLoss(beta_lr_multiplier=0.0), r"`beta_lr_multiplier`"),
    ("contrastive_distance", lambda: ContrastiveLoss(distance="l1"),
     r"`distance`.*Received: distance='l1'"),
    ("contrastive_margin", lambda: ContrastiveLoss(negative_margin=-1),
     r"`negative_margin`.*Received: negative_margin=-1"),
    ("trim_one", lambda: TrimmedLoss(TripletNCALoss(), trim=1.0), r"`trim`.*Received: trim=1\.0"),
    ("trim_keras_loss", lambda: TrimmedLoss(keras.losses.MeanSquaredError()), r"`loss`"),
]


@MB
@pytest.mark.parametrize(
    "make,match", [pytest.param(m, r, id=i) for i, m, r in BAD_INPUTS]
)
def test_bad_input_raises_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_numpy_scalar_hyperparameters_accepted():
    assert TripletMarginLoss(margin=np.float32(0.25)).margin == 0.25
    assert TripletNCALoss(temperature=np.float32(0.5)).temperature == 0.5
    assert TripletNCALoss(order=np.int64(2)).order == 2
    miner = TripletMiner("random", "random", seed=np.int64(3))
    assert miner.get_config()["seed"] == 3 and type(miner.get_config()["seed"]) is int


@MB
def test_labels_b_by_1_equal_labels_b():
    loss = TripletNCALoss(order=2)
    np.testing.assert_array_equal(
        to_numpy(loss(LABELS[:, None], EMBEDDINGS)), to_numpy(loss(LABELS, EMBEDDINGS))
    )


# -- reductions --------------------------------------------------------------------------------

RED_LABELS = np.array([0, 0, 1, 1, 2, 1], np.int32)  # anchor 4 is a singleton
RED_EMBEDDINGS = np.random.default_rng(3).normal(size=(6, 4)).astype(np.float32)
RED_WEIGHTS = np.array([1.0, 2.0, 0.5, 0.0, 3.0, 1.5], np.float32)


def _ephn_nca_reference(labels, embeddings, temperature=1.0):
    """Per-anchor EPHN NCA (order 1), plain loops; NaN-free 0 for anchors without triplet."""
    x = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    sim = x @ x.T
    losses, valid = np.zeros(len(labels)), np.zeros(len(labels), bool)
    for a in range(len(labels)):
        pos = [s for j, s in enumerate(sim[a]) if j != a and labels[j] == labels[a]]
        neg = [s for j, s in enumerate(sim[a]) if labels[j] != labels[a]]
        if pos and neg:
            losses[a] = np.log1p(np.exp((max(neg) - max(pos)) / temperature))
            valid[a] = True
    return losses, valid


@MB
def test_reductions_against_reference():
    losses, valid = _ephn_nca_reference(RED_LABELS, RED_EMBEDDINGS)
    assert valid.tolist() == [True, True, True, True, False, True]
    w = RED_WEIGHTS

    def run(reduction, sample_weight=None):
        loss = TripletNCALoss(reduction=reduction)
        return to_numpy(loss(RED_LABELS, RED_EMBEDDINGS, sample_weight=sample_weight))

    np.testing.assert_allclose(run("none"), losses, rtol=1e-5)
    np.testing.assert_allclose(run(None), losses, rtol=1e-5)
    np.testing.assert_allclose(run("sum_over_batch_size"), losses.sum() / 5, rtol=1e-5)
    np.testing.assert_allclose(run("mean"), losses.sum() / 5, rtol=1e-5)
    np.testing.assert_allclose(run("sum"), losses.sum(), rtol=1e-5)
    np.testing.assert_allclose(run("mean_with_sample_weight"), losses.sum() / 5, rtol=1e-5)
    # Sample weights: the mean divides by the number of anchors with a triplet,
    # mean_with_sample_weight by the weight of those anchors.
    np.testing.assert_allclose(run("none", w), losses * w, rtol=1e-5)
    np.testing.assert_allclose(run("sum", w), (losses * w).sum(), rtol=1e-5)
    np.testing.assert_allclose(run("sum_over_batch_size", w), (losses * w).sum() / 5, rtol=1e-5)
    np.testing.assert_allclose(
        run("mean_with_sample_weight", w), (losses * w).sum() / w[valid].sum(), rtol=1e-5
    )
    np.testing.assert_allclose(
        run("sum_over_batch_size", w[:, None]), (losses * w).sum() / 5, rtol=1e-5
    )


def _reference_reduction(terms, average):
    """NumPy: per-anchor values and denominator shares of tfdml.losses.base."""
    total, count, nonzero = (np.asarray(t, np.float64) for t in terms)
    valid = count > 0
    if average in ("anchors", "batch"):
        values = np.where(valid, total / np.where(valid, count, 1.0), 0.0)
        return values, valid.astype(np.float64) if average == "anchors" else np.ones_like(values)
    return total, count if average == "terms" else nonzero


def _check_halves_reductions(cls, config, terms, average):
    """The reductions of a pair loss whose terms split ([B, 2]: positive, negative pairs)."""
    total, count, nonzero = (np.asarray(t, np.float64) for t in terms)
    assert total.shape == (len(LABELS), 2) and np.all(nonzero <= count)
    over = nonzero if average == "halves" else count
    values = (total / np.where(over.sum(0) > 0, over.sum(0), 1.0)).sum(axis=1)
    w = np.linspace(0.5, 2.0, len(LABELS)).astype(np.float32)

    def run(reduction, sample_weight=None):
        loss = cls.from_config({**config, "reduction": reduction})
        return to_numpy(loss(LABELS, EMBEDDINGS, sample_weight=sample_weight))

    np.testing.assert_allclose(run("none"), values, rtol=1e-5, atol=1e-7)
    for reduction in ("sum", "sum_over_batch_size"):
        np.testing.assert_allclose(run(reduction), values.sum(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(run(reduction, w), (values * w).sum(), rtol=1e-5, atol=1e-7)
    halves = [(w @ total[:, k]) / (w @ over[:, k]) if (w @ over[:, k]) > 0 else 0.0
              for k in (0, 1)]
    np.testing.assert_allclose(run("mean_with_sample_weight", w), sum(halves), rtol=1e-5,
                               atol=1e-7)
    valid = count.sum(axis=1) > 0
    assert valid.sum() > 0
    return valid


def _check_reductions(base, average):
    config = base.get_config()
    if takes(base, "average"):  # CrossBatchMemory averages as the loss it wraps
        config["average"] = average
    loss = built(type(base).from_config(config), EMBEDDINGS.shape[-1])
    terms = to_numpy(list(loss.per_anchor(LABELS, EMBEDDINGS)))
    if average in ("halves", "halves_terms"):
        return _check_halves_reductions(type(base), config, terms, average)
    terms = [t.sum(axis=-1) if t.ndim == 2 else t for t in terms]  # split pair terms: [B, 2]
    total, count, nonzero = terms
    assert total.shape == count.shape == nonzero.shape == LABELS.shape
    assert np.all(nonzero <= count) and np.all(count >= 0)
    valid = count > 0
    assert valid.sum() > 0
    values, shares = _reference_reduction(terms, average)
    w = np.linspace(0.5, 2.0, len(LABELS)).astype(np.float32)

    def run(reduction, sample_weight=None):
        loss = type(base).from_config({**config, "reduction": reduction})
        return to_numpy(loss(LABELS, EMBEDDINGS, sample_weight=sample_weight))

    none = run("none")
    assert none.shape == LABELS.shape
    np.testing.assert_allclose(none, values, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(run("sum"), values.sum(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        run("sum_over_batch_size"), values.sum() / shares.sum(), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        run("mean_with_sample_weight", w), (values * w).sum() / (shares * w).sum(), rtol=1e-5,
        atol=1e-7,
    )
    np.testing.assert_allclose(
        run("sum_over_batch_size", w), (values * w).sum() / shares.sum(), rtol=1e-5, atol=1e-7
    )
    return valid


# Each case's reduced value (with and without sample weights) and per-anchor values are
# checked against the record on every commit (tests/losses/test_recorded_losses.py), and
# every average with every kind of term below. Here on every commit one class per average
# (anchors, nonzero, batch, terms, split pair terms, halves, halves_terms), one that does not
# normalize, one with class vectors, and each loss whose terms are its own (the wrappers, the
# memory bank, the dynamic soft margin); the other classes in the slow tier.
REDUCTIONS_FAST = {"nca_order1", "wu_default", "ms_default", "ntxent", "contrastive_all_pairs",
                   "tcm", "ipv", "soft_nearest_neighbor", "normalized_softmax",
                   "trimmed_margin_random", "xbm_nca2_bank64", "self_supervised_ntxent",
                   "dynamic_soft_margin"}


@pytest.mark.parametrize("case", slow_beyond(PER_CLASS, REDUCTIONS_FAST))
def test_reductions_consistent_with_per_anchor(case):
    if not case.per_anchor:
        pytest.skip("no terms per anchor")
    base = case.make()
    valid = _check_reductions(fresh(base), base.average)
    if case.zero_without_triplet:
        assert not valid[~triplet_anchors(LABELS)].any()


@pytest.mark.parametrize("average", ["anchors", "batch", "terms", "nonzero"])
@pytest.mark.parametrize("case", pick(
    "nca2_all_semihard", "wu_all_dw", "ms_default", "contrastive_all_pairs", "fappy",
    "trimmed_nca2",
    # Eager FAPPY under JAX: seconds of op compiles; test_fappy checks its values there.
    multibackend=True if BACKEND != "jax" else {"nca2_all_semihard", "wu_all_dw", "ms_default",
                                                "contrastive_all_pairs", "trimmed_nca2"}))
def test_every_average_for_every_kind_of_term(case, average):
    _check_reductions(fresh(case.make()), average)


@pytest.mark.parametrize("case", PER_CLASS)
def test_average_is_checked_and_saved(case):
    loss = case.make()
    if not takes(loss, "average"):  # a sum of losses, a sum over proxies, a memory's own
        assert "average" not in loss.get_config()
        return
    assert loss.average in ("anchors", "batch", "terms", "nonzero", "halves", "halves_terms")
    assert loss.get_config()["average"] == loss.average
    with pytest.raises(ValueError, match="average"):
        type(loss).from_config({**loss.get_config(), "average": "pairs"})


@MB
def test_fit_with_sample_weight_zero_on_all_anchors_keeps_weights():
    """Sample weights reach the loss through model.fit: all-zero weights mean no update."""
    features = np.random.default_rng(0).normal(size=(12, 6)).astype(np.float32)
    labels = np.repeat(np.arange(4), 3)
    model = small_embedding_model()
    model.compile(optimizer="sgd", loss=TripletNCALoss(order=2))
    before = [w.numpy().copy() for w in model.trainable_weights]
    model.fit(features, labels, sample_weight=np.zeros(12), batch_size=12, epochs=1, verbose=0)
    for b, a in zip(before, model.trainable_weights, strict=True):
        np.testing.assert_array_equal(b, a.numpy())


# -- memory: no B x B x B tensor unless every triplet is wanted ----------------------------------

GRAPH_BATCH, GRAPH_DIM = 48, 8
CUBE_LIMIT = GRAPH_BATCH**3 // 2


# fappy and histogram: their optimized XLA program is checked on every commit below (their
# histograms lower to larger tensors than their graph has); their graph in the slow tier.
CUBE_GRAPH_SLOW = {"fappy", "histogram"}


@pytest.mark.parametrize("case", slow_beyond(
    params(ONE_PER_CLASS_AND_MINER),
    {case.id for case in ONE_PER_CLASS_AND_MINER} - CUBE_GRAPH_SLOW))
def test_no_cubic_tensor_unless_all_all(case):
    graph = trace_loss_graph(built(case.make(), GRAPH_DIM), GRAPH_BATCH, GRAPH_DIM)
    assert any("gradient_tape" in op.name for op in walk_graph_ops(graph)), "no backward ops"
    big = large_tensor_ops(graph, CUBE_LIMIT)
    if case.is_cubic:
        assert big, "the all/all strategy builds a B^3 mask: the check must see it"
    else:
        assert not big, f"{case.id} materializes a tensor of >= B^3/2 elements: {big[:5]}"


# XLA compiles each (seconds): on every commit the all/all control and the losses whose ops
# lower to larger tensors than their graph has (sorting, searching, histograms); the rest of
# the miner kinds and losses in the slow tier (the graph walk above checks each on every
# commit, but fappy and histogram, whose compiled program is checked here).
_HLO_FAST = {"margin_all_all", "nca2_all_semihard", "fappy", "histogram", "loop_ms"}


@pytest.mark.parametrize("case", [
    pytest.param(CASES[i], id=i, marks=() if i in _HLO_FAST else pytest.mark.slow)
    for i in ("margin_squared_l2", "nca2_all_semihard", "nca2_easy_semihard", "nca2_easy_hard",
              "margin_all_all", "margin_cos_random", "wu_all_dw", "wu_eps_dw", "ms_default",
              "ms_all_semihard", "contrastive_all_pairs", "trimmed_nca2", "loop_ms",
              "loop_triplet_segments", "fappy", "histogram")])
def test_no_cubic_tensor_in_compiled_xla_program(case):
    """Same claim on the optimized HLO: XLA lowers some ops to larger tensors than the graph has."""
    big = xla_large_shapes(case.factory, CUBE_LIMIT, GRAPH_BATCH, GRAPH_DIM)
    if case.is_cubic:
        assert big, "the all/all strategy builds a B^3 mask: the check must see it"
    else:
        assert not big, f"{case.id} compiles to a tensor of >= B^3/2 elements: {big[:5]}"


def test_xla_check_sees_searchsorted_lowering():
    """A batched tf.searchsorted compiles to a [B, R, R] comparison: the HLO check catches it."""

    import tensorflow as tf

    class SearchsortedLoss(keras.losses.Loss):
        def __call__(self, labels, embeddings, sample_weight=None):
            scores = tf.matmul(embeddings, embeddings, transpose_b=True)
            count = tf.searchsorted(tf.sort(scores, axis=1), scores, side="right")
            return tf.reduce_sum(tf.cast(count, tf.float32) * scores)

    assert xla_large_shapes(SearchsortedLoss(), CUBE_LIMIT, GRAPH_BATCH, GRAPH_DIM)


def test_graph_walk_enters_while_loops():
    """The walker finds a B^3 tensor hidden in a while-loop body (and in the disjoint miner's
    loop it sees ops the top-level graph does not list)."""
    import tensorflow as tf

    @tf.function
    def hidden(x):
        def body(i, total):
            cube = x[:, None, None] * x[None, :, None] * x[None, None, :]
            return i + 1, total + tf.reduce_sum(cube)

        return tf.while_loop(lambda i, _: i < 2, body, (0, 0.0))[1]

    graph = hidden.get_concrete_function(tf.TensorSpec([GRAPH_BATCH], tf.float32)).graph
    top_level = [
        op for op in graph.get_operations()
        for out in op.outputs
        if out.shape.is_fully_defined() and out.shape.num_elements() >= CUBE_LIMIT
    ]
    assert not top_level
    assert large_tensor_ops(graph, CUBE_LIMIT)

    disjoint = trace_loss_graph(CASES["nca2_disjoint_easy_hard"].factory, GRAPH_BATCH, GRAPH_DIM)
    assert len(list(walk_graph_ops(disjoint))) > len(disjoint.get_operations())
