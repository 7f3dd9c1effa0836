"""Values and gradients of every loss on fixed batches, to be compared with a recorded copy.

``tests/fixtures/make_recorded_losses.py`` writes ``tests/fixtures/recorded_losses.npz``
from :func:`record_all`; ``tests/losses/test_recorded_losses.py`` computes them again and
compares. A refactoring of the losses (how a loss is declared, reduced or mined) must
leave every number unchanged.

Each case records, on one uneven float64 batch (absent classes, singletons) and its
float32 copy: the reduced value, the gradient with respect to the embeddings (and to the
loss's learned variables, set to fixed values), the per-anchor values of ``call``, the
value with sample weights and, for a loss with a functional form, the functional value.
A loss with a memory bank records its second call (the first fills the bank). TensorFlow
only: the numbers are those of one backend's kernels.
"""

from __future__ import annotations

import zlib

import numpy as np
from backends import BACKEND, to_numpy, value_and_grad_function
from keras import ops
from loss_cases import LOSS_CASES

from tfdml import losses
from tfdml.compat import tfa
from tfdml.miners import TripletMiner

LABELS = np.array([0, 3, 0, 1, 5, 1, 0, 2, 2, 5, 1, 7, 2, 0], dtype="int32")  # 4, 6: absent
DIM = 5
NUM_CLASSES = 8

# The losses with learned class vectors and a memory bank are contract cases too (LOSS_CASES:
# normalized_softmax, cosface, arcface, subcenter_arcface, soft_triple, proxy_nca,
# proxy_anchor, with the class ids of LABELS); their variables are set here.
_EXTRA = {
    "arcface_m0.3_s16": lambda: losses.ArcFaceLoss(NUM_CLASSES, margin=0.3, scale=16.0),
    "margin_per_class_beta": lambda: losses.MarginLoss(
        num_classes=NUM_CLASSES, miner=TripletMiner("random", "distance_weighted", seed=9)),
    "xbm_nca2": lambda: losses.CrossBatchMemory(losses.TripletNCALoss(order=2), memory_size=20),
    "xbm_ms": lambda: losses.CrossBatchMemory(losses.MultiSimilarityLoss(), memory_size=17),
    "nca2_batch": lambda: losses.TripletNCALoss(order=2, average="batch"),
    "margin_terms": lambda: losses.TripletMarginLoss(average="terms"),
    "margin_nonzero": lambda: losses.TripletMarginLoss(average="nonzero"),
    "ms_blocks": lambda: losses.MultiSimilarityLoss(block_size=4),
    "nca_blocks": lambda: losses.TripletNCALoss(miner=TripletMiner("hard", "semihard"),
                                                block_size=5),
    "loop_ms_blocks": lambda: losses.LoOpLoss("multi_similarity", block_size=4),
    "fappy_blocks": lambda: losses.FAPPYLoss(block_size=4),
    "tfa_semihard": lambda: tfa.TripletSemiHardLoss(),
    "tfa_hard_soft": lambda: tfa.TripletHardLoss(soft=True),
    "tfa_lifted": lambda: tfa.LiftedStructLoss(),
    "tfa_contrastive_pairs": None,  # takes pairs, not class ids: see _functional_only
}

#: Functional forms and the arguments to call them with (beyond ``y_true, y_pred``).
FUNCTIONAL = {
    "triplet_nca_loss": (losses.triplet_nca_loss, {"order": 2}),
    "triplet_margin_loss": (losses.triplet_margin_loss, {"distance": "l2"}),
    "pn_loss": (losses.pn_loss, {}),
    "contrastive_loss": (losses.contrastive_loss, {}),
    "margin_loss": (losses.margin_loss, {"miner": TripletMiner("easy", "hard")}),
    "multi_similarity_loss": (losses.multi_similarity_loss, {}),
    "supcon_loss": (losses.supcon_loss, {}),
    "ntxent_loss": (losses.ntxent_loss, {}),
    "circle_loss": (losses.circle_loss, {}),
    "soft_nearest_neighbor_loss": (losses.soft_nearest_neighbor_loss, {}),
    "loop_loss_triplet": (losses.loop_loss, {"base": "triplet"}),
    "loop_loss_ms": (losses.loop_loss, {"base": "multi_similarity"}),
    "hphn_triplet_loss": (losses.hphn_triplet_loss, {}),
    "lifted_structure_loss": (losses.lifted_structure_loss, {}),
    "normalized_softmax_loss": (losses.normalized_softmax_loss, {"weights": "W"}),
    "cosface_loss": (losses.cosface_loss, {"weights": "W"}),
    "arcface_loss": (losses.arcface_loss, {"weights": "W"}),
    "proxy_nca_loss": (losses.proxy_nca_loss, {"proxies": "W"}),
    "proxy_anchor_loss": (losses.proxy_anchor_loss, {"proxies": "W"}),
    "tfa_triplet_semihard_loss": (tfa.triplet_semihard_loss, {}),
    "tfa_lifted_struct_loss": (tfa.lifted_struct_loss, {}),
}


def cases() -> dict:
    """``{case id: loss factory}``: the contract suite's configurations and the rest."""
    found = {case.id: case.factory for case in LOSS_CASES}
    found.update({k: v for k, v in _EXTRA.items() if v is not None})
    return found


def _seed(name):
    return zlib.crc32(name.encode())


def batch(dtype="float64"):
    rng = np.random.default_rng(20261126)
    x = rng.normal(size=(len(LABELS), DIM))
    x[3] *= 3.0  # uneven norms
    return LABELS, x.astype(dtype)


def _set_variables(loss, name):
    """Builds the loss's state and gives its learned variables fixed values."""
    state = loss.build_state(DIM)
    rng = np.random.default_rng(_seed(name))
    for variable in ([] if state is None else state.trainable_variables):
        variable.assign(rng.normal(size=variable.shape).astype(variable.dtype))


def _value_and_grads(loss, labels, x, sample_weight=None, jit_compile=False):
    """The loss and its gradients with respect to the embeddings and (TensorFlow) to the
    loss's learned variables, as NumPy.

    Under JAX and PyTorch only the embeddings' gradient: a learned variable is a constant
    of the traced function there (its gradient is TensorFlow's to record and check).
    ``jit_compile``: through ``tf.function(jit_compile=True)`` or ``jax.jit``.
    """
    if BACKEND != "tensorflow":
        step = value_and_grad_function(
            lambda e: loss(labels, e, sample_weight=sample_weight), jit_compile=jit_compile)
        value, grad = to_numpy(step(x))
        return value, [grad]
    import tensorflow as tf

    variables = getattr(loss, "trainable_variables", [])

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(labels, x, sample_weight=sample_weight)
        return value, tape.gradient(value, [x, *variables],
                                    unconnected_gradients=tf.UnconnectedGradients.ZERO)

    if jit_compile:
        step = tf.function(step, jit_compile=True, autograph=False)
    value, grads = step(tf.constant(x))
    return value.numpy(), [g.numpy() for g in grads]


def fresh_loss(name, factory, labels, x):
    """``factory()`` with its learned variables set to the recorded case's values (and a
    memory bank filled by a first call)."""
    loss = factory()
    if isinstance(loss, losses.MetricLoss):
        _set_variables(loss, name)
        if isinstance(loss, losses.CrossBatchMemory):
            loss(labels, x[::-1].copy())  # fills the memory bank
    return loss


def record_case(name, factory, dtypes=("float64", "float32")) -> dict:
    """The recorded arrays of one case, keyed ``<name>/<what>``."""
    out = {}
    for dtype in dtypes:
        labels, x = batch(dtype)
        weights = np.linspace(0.0, 2.0, len(labels)).astype(dtype)
        for what, kwargs in (("", {}), ("weighted_", {"sample_weight": weights})):
            loss = fresh_loss(name, factory, labels, x)
            try:
                value, grads = _value_and_grads(loss, labels, x, **kwargs)
            except ValueError as error:  # a loss of the whole batch (VICReg): no weights
                if not kwargs or "takes no `sample_weight`" not in str(error):
                    raise
                continue
            out[f"{name}/{what}value_{dtype}"] = value
            for i, g in enumerate(grads):
                out[f"{name}/{what}grad{i}_{dtype}"] = g
        loss = factory()
        if isinstance(loss, losses.MetricLoss) and not isinstance(loss, losses.CrossBatchMemory):
            _set_variables(loss, name)
            try:
                out[f"{name}/call_{dtype}"] = to_numpy(loss.call(labels, x))
            except NotImplementedError:  # ProxyAnchorLoss: no value per sample
                pass
    return out


def compiled_case(name, factory) -> dict:
    """The float32 value and embedding gradient of one case, compiled (keys as in
    :func:`record_case`)."""
    labels, x = batch("float32")
    value, grads = _value_and_grads(fresh_loss(name, factory, labels, x), labels, x,
                                    jit_compile=True)
    return {f"{name}/value_float32": value, f"{name}/grad0_float32": grads[0]}


def record_functional(name, fn, kwargs, jit_compile=False) -> dict:
    out = {}
    for dtype in ("float64", "float32"):
        labels, x = batch(dtype)
        args = dict(kwargs)
        if args.get("weights") == "W" or args.get("proxies") == "W":
            key = "weights" if "weights" in args else "proxies"
            rng = np.random.default_rng(_seed(name))
            args[key] = ops.convert_to_tensor(rng.normal(size=(NUM_CLASSES, DIM)).astype(dtype))
        step = value_and_grad_function(lambda e, labels=labels, args=args: fn(labels, e, **args),
                                       jit_compile=jit_compile)
        value, grad = to_numpy(step(x))
        out[f"{name}/value_{dtype}"] = value
        out[f"{name}/grad0_{dtype}"] = grad
    return out


def record_all() -> dict:
    out = {}
    for name, factory in cases().items():
        out.update(record_case(name, factory))
    for name, (fn, kwargs) in FUNCTIONAL.items():
        out.update(record_functional("fn_" + name, fn, kwargs))
    return out
