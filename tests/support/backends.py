"""Backend-generic helpers for tests that run under TensorFlow, JAX and PyTorch.

A test module that runs under every Keras backend sets
``pytestmark = pytest.mark.multibackend`` (or marks single tests); under a
backend other than TensorFlow, ``conftest.py`` deselects everything else.
Such tests use ``keras.ops`` and the helpers below, never ``tf.*``.

* :data:`BACKEND`: ``keras.backend.backend()``.
* :func:`to_numpy`: any backend tensor (or nested structure) to NumPy.
* :func:`value_and_grad`: ``fn(*args)`` and its gradient w.r.t. chosen
  arguments, as NumPy arrays (``tf.GradientTape``, ``jax.value_and_grad`` or
  ``torch.autograd``).
* :func:`compiled`: ``fn`` compiled as ``jit_compile=True`` would
  (``tf.function(jit_compile=True)`` or ``jax.jit``); PyTorch runs it eagerly.
* :data:`CAN_COMPILE`: whether :func:`compiled` really compiles.
* :func:`traced`: ``fn`` as a graph (``tf.function`` without XLA, ``jax.jit``) for many
  evaluations; PyTorch runs it eagerly.
* :func:`value_and_grad_tensors`: like :func:`value_and_grad`, but returns backend
  tensors and may be called inside a compiled or traced function.
* :func:`value_and_grad_function`: a reusable (optionally compiled) function
  ``f(*args) -> (value, grads)`` of backend tensors.
* :func:`enable_float64`: context in which float64 tensors exist (JAX's
  ``jax_enable_x64``; a no-op elsewhere).
* :func:`central_differences`: the finite-difference gradient of a NumPy function.
* :func:`gradient_check`: the backend's gradient of a scalar function and its central
  finite differences (as ``tf.test.compute_gradient``), in float64.

The ``tf.function`` s made here trace without AutoGraph (``autograph=False``): the core is
``keras.ops`` code that ``jax.jit`` traces as it is, so AutoGraph has nothing to convert,
and its source conversion makes tracing several times slower. Code that did need it (a
Python ``if`` or ``for`` on a tensor) fails to trace, as it does under ``jax.jit``.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np

BACKEND = keras.backend.backend()
CAN_COMPILE = BACKEND in ("tensorflow", "jax")

__all__ = [
    "BACKEND",
    "CAN_COMPILE",
    "compiled",
    "central_differences",
    "enable_float64",
    "gradient_check",
    "to_numpy",
    "traced",
    "value_and_grad",
    "value_and_grad_function",
    "value_and_grad_tensors",
]


def to_numpy(x):
    """NumPy copies of backend tensors (nested lists/tuples/dicts kept); None stays None."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return type(x)(to_numpy(v) for v in x) if not hasattr(x, "_fields") else type(x)(
            *(to_numpy(v) for v in x))
    if isinstance(x, dict):
        return {k: to_numpy(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return x
    return keras.ops.convert_to_numpy(x)


def _as_tensor(x):
    if x is None or isinstance(x, (int, float, bool, str)):
        return x
    return keras.ops.convert_to_tensor(x)


def value_and_grad_tensors(fn, *args, argnums=0):
    """``(fn(*args), grads)`` as backend tensors; ``args`` are backend tensors already.

    The gradient is that of ``sum(fn(*args))`` w.r.t. ``args[argnums]`` (zeros where
    ``fn`` does not depend on an argument). Unlike :func:`value_and_grad`, this can be
    called inside a compiled or traced function (``tf.function``, ``jax.jit``).
    ``argnums`` is an int (``grads`` one tensor) or a tuple of ints (a tuple).
    """
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    args = list(args)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            for i in nums:
                tape.watch(args[i])
            value = fn(*args)
            target = tf.reduce_sum(value)
        grads = tape.gradient(target, [args[i] for i in nums],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
    elif BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def wrapped(*diff):
            full = list(args)
            for i, d in zip(nums, diff, strict=True):
                full[i] = d
            out = fn(*full)
            return jnp.sum(out), out

        (_, value), grads = jax.value_and_grad(wrapped, argnums=tuple(range(len(nums))),
                                               has_aux=True)(*[args[i] for i in nums])
    elif BACKEND == "torch":
        import torch

        for i in nums:
            args[i] = args[i].detach().clone().requires_grad_(True)
        value = fn(*args)
        target = value.sum()
        inputs = [args[i] for i in nums]
        if target.requires_grad:
            grads = torch.autograd.grad(target, inputs, allow_unused=True)
            grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads,
                                                                              strict=True)]
        else:
            grads = [torch.zeros_like(x) for x in inputs]
        value = value.detach()
    else:  # pragma: no cover
        raise NotImplementedError(BACKEND)
    return value, grads[0] if single else tuple(grads)


def value_and_grad(fn, *args, argnums=0):
    """``(value, grads)`` of ``fn(*args)`` as NumPy, the gradient w.r.t. ``args[argnums]``.

    ``fn`` returns a scalar (or a tensor, whose sum is differentiated).
    ``argnums`` is an int (``grads`` one array) or a tuple of ints (a tuple).
    Arguments are converted to backend tensors first; non-array arguments
    (None, Python scalars) pass through. Runs eagerly.
    """
    args = [_as_tensor(a) for a in args]
    return to_numpy(value_and_grad_tensors(fn, *args, argnums=argnums))


def value_and_grad_function(fn, argnums=0, jit_compile=False):
    """A reusable function ``f(*args) -> (fn(*args), grads)`` returning backend tensors.

    Gradients as in :func:`value_and_grad_tensors`. TensorFlow: a ``tf.function``
    (graph mode; XLA with ``jit_compile=True``), so its graph can be inspected
    (``get_concrete_function``, ``experimental_get_compiler_ir``). JAX: ``jax.jit``
    with ``jit_compile=True``, eager otherwise. PyTorch: always eager (see
    :data:`CAN_COMPILE`). Array arguments are converted to backend tensors.
    """
    def step(*args):
        return value_and_grad_tensors(fn, *args, argnums=argnums)

    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(step, jit_compile=jit_compile, autograph=False)
    if BACKEND == "jax" and jit_compile:
        import jax

        jitted = jax.jit(step)
        return lambda *args: jitted(*[_as_tensor(a) for a in args])
    return lambda *args: step(*[_as_tensor(a) for a in args])


@contextlib.contextmanager
def enable_float64():
    """A context in which float64 tensors exist: ``jax_enable_x64`` under JAX.

    TensorFlow and PyTorch always have float64; there it does nothing.
    """
    if BACKEND != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def central_differences(fun, x, delta=1e-6):
    """``d fun(x) / d x`` of a scalar NumPy function by central differences, entry by entry
    (``x`` as float64)."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += delta
        minus[index] -= delta
        grad[index] = (fun(plus) - fun(minus)) / (2.0 * delta)
    return grad


def reference_gradient(fun, x, delta=1e-4):
    """Central differences of a float64 reference with Richardson extrapolation (error
    O(delta^4): about 1e-11 relative for smooth losses, where plain central differences
    give 1e-9 at best)."""
    coarse = central_differences(fun, x, delta)
    fine = central_differences(fun, x, delta / 2)
    return fine + (fine - coarse) / 3


def assert_close_grad(got, want, rtol):
    """Entrywise ``rtol``, with ``rtol`` of the largest entry as the absolute floor."""
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def gradient_check(fn, x, delta=1e-6):
    """``(theoretical, numerical)``: the gradient of the scalar ``fn(x)`` w.r.t. the float64
    array ``x`` and its :func:`central_differences`, both as NumPy arrays of ``x``'s shape.
    Call it inside :func:`enable_float64`.

    The gradient is compiled under JAX (eager JAX differentiates op by op, several times
    slower); the many evaluations of ``fn`` run :func:`traced`.
    """
    x = np.asarray(x, np.float64)
    _, theoretical = to_numpy(value_and_grad_function(fn, jit_compile=BACKEND == "jax")(x))
    evaluate = traced(fn)
    numerical = central_differences(lambda e: float(to_numpy(evaluate(_as_tensor(e)))), x,
                                    delta)
    return np.asarray(theoretical, np.float64), numerical


def traced(fn):
    """``fn`` traced once for many evaluations: a ``tf.function`` graph (TensorFlow, no
    XLA), ``jax.jit`` (JAX); PyTorch runs it eagerly."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, autograph=False)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def compiled(fn):
    """``fn`` compiled with XLA where the backend can (TF, JAX); PyTorch: ``fn`` itself."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True, autograph=False)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn
