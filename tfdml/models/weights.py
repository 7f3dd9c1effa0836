"""Pretrained weights and input shapes: the checks and errors the backbones share."""

from __future__ import annotations

import contextlib
import numbers
import os
import re

__all__ = ["WeightsUnavailableError", "check_input_shape", "check_weights",
           "explain_missing_weights"]


class WeightsUnavailableError(FileNotFoundError):
    """Pretrained weights are neither in the Keras cache nor downloadable (offline).

    The message names the exact file Keras looks for, the directory to put it
    in, and the address to fetch it from on a machine with network access.
    """



def check_weights(weights, allow_imagenet=True):
    if weights is None or (allow_imagenet and weights == "imagenet"):
        return weights
    if isinstance(weights, os.PathLike):
        weights = os.fspath(weights)
    if isinstance(weights, str) and weights != "imagenet" and os.path.isfile(weights):
        return weights
    allowed = '"imagenet", None or' if allow_imagenet else "None or"
    raise ValueError(
        f"`weights` must be {allowed} the path of an existing weights file. "
        f"Received: weights={weights!r}"
    )


def _keras_models_dir():
    """Where Keras Applications cache their weights: ``$KERAS_HOME/models`` (``~/.keras`` when
    ``KERAS_HOME`` is not set; ``/tmp/.keras`` when that is not writable), as Keras documents."""
    base = os.path.expanduser(os.environ.get("KERAS_HOME") or os.path.join("~", ".keras"))
    if not os.access(base, os.W_OK):
        base = os.path.join("/tmp", ".keras")
    return os.path.join(base, "models")


#: How Keras' ``get_file`` reports a failed download: "URL fetch failure on <url>: ...".
_FETCH_FAILURE = re.compile(r"URL fetch failure on\s+(\S+?):?\s")


@contextlib.contextmanager
def explain_missing_weights(backbone):
    """While Keras builds a backbone, a failed weights download becomes a clear error."""
    try:
        yield
    except Exception as err:
        match = _FETCH_FAILURE.search(str(err))
        if match is None:
            raise
        origin = match.group(1)
        name = os.path.basename(origin)
        folder = _keras_models_dir()
        raise WeightsUnavailableError(
            f"The ImageNet weights of backbone {backbone!r} are not in the Keras cache and "
            f"could not be downloaded ({type(err).__name__}: {err}). Keras looks for the "
            f"file {name!r} in the directory {folder!r} (the 'models' folder of "
            "$KERAS_HOME, which defaults to ~/.keras). Download it on a machine with "
            f"network access from {origin} and copy it there under exactly that name, "
            "or pass weights=None, or weights='/path/to/that/file'."
        ) from err


def check_input_shape(input_shape, min_size=1):
    """``input_shape`` as a tuple: ``(height, width, 3)``, sides ``>= min_size`` or None."""
    ok = isinstance(input_shape, list | tuple) and len(input_shape) == 3
    if ok:
        for i, d in enumerate(input_shape):
            if d is None and i < 2:
                continue
            if not isinstance(d, numbers.Integral) or isinstance(d, bool) or d < 1:
                ok = False
        ok = ok and input_shape[2] == 3 and all(
            d is None or d >= min_size for d in input_shape[:2]
        )
    if not ok:
        raise ValueError(
            "`input_shape` must be (height, width, 3) with height and width integers "
            f">= {min_size} (or None). Received: input_shape={input_shape!r}"
        )
    return tuple(input_shape)


