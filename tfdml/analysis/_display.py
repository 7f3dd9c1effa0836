"""How the analysis pictures show arrays: images in, ``uint8`` pixels (or PNG bytes) out,
and labels or ids as text.

**Images** are ``[N, H, W]``, ``[N, H, W, 1]`` (grey) or ``[N, H, W, 3]`` (RGB)
arrays. ``uint8`` images are shown as they are; float images (any other dtype
too) whose finite values all lie in ``[0, 1]`` are shown as they are (``1`` is
white); any other range is min-max scaled per image (a constant image is shown
black), and NaN or Inf pixels are shown black.
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["as_numpy", "as_text", "check_images", "display", "png_bytes"]


def as_numpy(x):
    """``x`` as a NumPy array (a tensor of any Keras backend, a list...)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            from keras import ops

            return ops.convert_to_numpy(x)
        except Exception:  # not a tensor of the backend: NumPy's own conversion
            pass
    return np.asarray(x)


def check_images(name, images, rows, exact):
    """``images`` as a NumPy array of ``[N, H, W(, 1 or 3)]`` images with enough rows."""
    if images is None:
        return None
    images = as_numpy(images)
    shape = images.shape
    if not (images.ndim == 3 or (images.ndim == 4 and shape[-1] in (1, 3))):
        raise ValueError(f"`{name}` must be [N, H, W], [N, H, W, 1] or [N, H, W, 3] images. "
                         f"Received: {name}.shape={shape}")
    if not (images.dtype == bool or np.issubdtype(images.dtype, np.number)):
        raise ValueError(f"`{name}` must hold numbers. Received: {name}.dtype={images.dtype}")
    if exact and len(images) != rows:
        raise ValueError(f"`{name}` must have one image per query row of `results` ({rows}). "
                         f"Received: {name}.shape={shape}")
    if not exact and len(images) < rows:
        raise ValueError(f"`{name}` must hold every gallery position in `results.indices` (up "
                         f"to {rows - 1}, so at least {rows} images). Received: {name}.shape="
                         f"{shape}")
    return images


def as_text(value) -> str:
    """A label or an id as text: bytes decoded as UTF-8, NumPy scalars as Python ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value.item() if isinstance(value, np.generic) else value)


def display(image):
    """One image as ``uint8`` ``[H, W]`` (grey) or ``[H, W, 3]``, scaled as the module says."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype == np.uint8:
        return image
    x = image.astype(np.float64)
    finite = np.isfinite(x)
    values = x[finite]
    if values.size and (values.min() < 0.0 or values.max() > 1.0):
        low, high = values.min(), values.max()
        x = (x - low) / (high - low) if high > low else np.zeros_like(x)
    x = np.where(finite, x, 0.0)
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def png_bytes(pixels) -> bytes:
    """``uint8`` ``[H, W]`` or ``[H, W, 3]`` pixels as a PNG file, with Pillow, else
    matplotlib."""
    buffer = io.BytesIO()
    try:
        from PIL import Image
    except ImportError:
        try:
            from matplotlib import image as mpl_image
        except ImportError as err:
            raise ImportError("Writing images needs Pillow or matplotlib: `pip install "
                              "pillow`.") from err
        mpl_image.imsave(buffer, pixels, format="png", cmap="gray", vmin=0, vmax=255)
    else:
        Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue()
