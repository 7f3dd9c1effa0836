"""The files TensorBoard's embedding projector reads, written without TensorFlow:
:func:`projector_export`."""

from __future__ import annotations

import math
import os

import numpy as np

from tfdml._argument_checks import check_int
from tfdml._files import atomic_path
from tfdml.analysis._display import as_numpy, as_text, check_images, display, png_bytes
from tfdml.search import at_indices, check_finite

__all__ = ["MAX_SPRITE", "projector_export"]

#: The largest sprite TensorBoard's projector shows, in pixels per side.
MAX_SPRITE = 8192


def _write_bytes(path, data):
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def _check_name(name):
    if (not isinstance(name, str) or not name or name in (".", "..", "metadata", "sprite")
            or any(c in name for c in '/\\"\t\n\r') or name != name.strip()):
        raise ValueError(
            "`name` must be a non-empty file stem without slashes, quotes, tabs or line "
            "breaks, other than 'metadata' and 'sprite' (the other files' names). "
            f"Received: name={name!r}"
        )
    return name


def _check_embeddings(embeddings):
    x = as_numpy(embeddings)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0 or not (
            np.issubdtype(x.dtype, np.number) and not np.iscomplexobj(x)):
        raise ValueError("`embeddings` must be a non-empty [N, D] array of real numbers. "
                         f"Received: embeddings.shape={x.shape}, dtype={x.dtype}")
    check_finite(x, "embeddings")
    return x.astype(np.float32)


def _metadata_column(name, values, n, single):
    values = as_numpy(values)
    if values.ndim != 1 or len(values) != n:
        raise ValueError(f"`{name}` must have one entry per row of `embeddings` ({n}). "
                         f"Received: {name}.shape={values.shape}")
    texts = [as_text(v) for v in values]
    bad = [i for i, t in enumerate(texts) if any(c in t for c in "\t\n\r")]
    if bad:
        raise ValueError(
            f"`{name}` contains tabs or line breaks (at {at_indices(bad)}): TensorBoard's "
            "metadata.tsv has one line per row and tab-separated columns, without escapes, so "
            "they are refused rather than rewritten. Replace them first. Received: "
            f"{name}[{bad[0]}]={texts[bad[0]]!r}"
        )
    blank = [i for i, t in enumerate(texts) if not t.strip()] if single else []
    if blank:
        raise ValueError(
            f"`{name}` has empty (or blank) entries (at {at_indices(blank)}): TensorBoard "
            "skips blank lines of metadata.tsv, which would shift every later row. Give them "
            f"a placeholder. Received: {name}[{blank[0]}]={texts[blank[0]]!r}"
        )
    return texts


def _metadata_text(labels, ids, n):
    """The text of ``metadata.tsv``, or None without labels and ids."""
    given = [(key, v) for key, v in (("label", labels), ("id", ids)) if v is not None]
    if not given:
        return None
    columns = [_metadata_column(name + "s", v, n, len(given) == 1) for name, v in given]
    if len(columns) == 1:
        return "".join(t + "\n" for t in columns[0])
    lines = ["label\tid", *(f"{a}\t{b}" for a, b in zip(*columns, strict=True))]
    return "".join(line + "\n" for line in lines)


def _thumbnail_size(thumbnail_size, side, height, width):
    """``(height, width)`` of a sprite thumbnail."""
    if thumbnail_size is None:
        longest = max(height, width)
        if side * longest <= MAX_SPRITE:
            return height, width
        scale = (MAX_SPRITE // side) / longest
        return max(1, int(height * scale)), max(1, int(width * scale))
    if isinstance(thumbnail_size, (tuple, list)) and len(thumbnail_size) == 2:
        size = (check_int("thumbnail_size", thumbnail_size[0]),
                check_int("thumbnail_size", thumbnail_size[1]))
    else:
        longest = check_int("thumbnail_size", thumbnail_size)
        scale = longest / max(height, width)
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
    if side * max(size) > MAX_SPRITE:
        raise ValueError(
            f"`thumbnail_size` is too large: {side} x {side} thumbnails of {size[0]} x "
            f"{size[1]} pixels exceed TensorBoard's {MAX_SPRITE} x {MAX_SPRITE} sprite; at most "
            f"{MAX_SPRITE // side} pixels a side. Received: thumbnail_size={thumbnail_size!r}"
        )
    return size


def _resize(pixels, height, width):
    """``uint8`` RGB pixels resized to ``(height, width)``: Pillow's bilinear filter (which
    averages when it shrinks), else nearest neighbours."""
    if pixels.shape[:2] == (height, width):
        return pixels
    try:
        from PIL import Image
    except ImportError:
        rows = (np.arange(height) * pixels.shape[0]) // height
        cols = (np.arange(width) * pixels.shape[1]) // width
        return pixels[rows][:, cols]
    image = Image.fromarray(np.ascontiguousarray(pixels)).resize(
        (width, height), Image.Resampling.BILINEAR)
    return np.asarray(image)


def _sprite(images, n, thumbnail_size):
    """``(pixels, (height, width))``: the ``uint8`` RGB sprite and its thumbnail size."""
    images = check_images("images", images, n, exact=True)
    side = math.ceil(math.sqrt(n))
    if side > MAX_SPRITE:
        raise ValueError(f"Too many images for a {MAX_SPRITE} x {MAX_SPRITE} sprite: {n}. "
                         f"Received: images.shape={images.shape}")
    th, tw = _thumbnail_size(thumbnail_size, side, images.shape[1], images.shape[2])
    sprite = np.full((side * th, side * tw, 3), 255, np.uint8)
    for i, image in enumerate(images):
        pixels = display(image)
        if pixels.ndim == 2:
            pixels = np.repeat(pixels[..., None], 3, axis=-1)
        r, c = divmod(i, side)
        sprite[r * th:(r + 1) * th, c * tw:(c + 1) * tw] = _resize(pixels, th, tw)
    return sprite, (th, tw)


def _projector_config(name, shape, metadata, thumbnail):
    lines = ["embeddings {", f'  tensor_name: "{name}"', f"  tensor_shape: {shape[0]}",
             f"  tensor_shape: {shape[1]}", f'  tensor_path: "{name}.tsv"']
    if metadata:
        lines.append('  metadata_path: "metadata.tsv"')
    if thumbnail is not None:
        th, tw = thumbnail
        lines += ["  sprite {", '    image_path: "sprite.png"', f"    single_image_dim: {tw}",
                  f"    single_image_dim: {th}", "  }"]
    return "\n".join([*lines, "}"]) + "\n"


def projector_export(logdir, embeddings, labels=None, ids=None, images=None,
                     name: str = "embeddings", thumbnail_size=None) -> list:
    """Writes the files TensorBoard's embedding projector reads, without TensorFlow.

    In ``logdir`` (created if needed):

    * ``<name>.tsv``: one line per embedding, the values tab-separated, as
      float32 written with 9 significant digits (``%.9g``: read back, every
      value is the same float32);
    * ``metadata.tsv`` (with ``labels`` or ``ids``): one line per embedding.
      With only one of them, a single column without a header line (the
      projector's convention); with both, a header line ``label<TAB>id`` then
      the two columns. Labels and ids are written with ``str`` (bytes decoded
      as UTF-8). Tabs, newlines and carriage returns inside them are
      **refused** (a ``ValueError``): the format has no escapes. So are empty
      or blank entries of a single column, as the projector skips blank lines;
    * ``sprite.png`` (with ``images``): the images as RGB thumbnails on a
      square grid of ``ceil(sqrt(N))`` thumbnails a side, row by row from the
      top left, unused cells white; grey images become RGB. The whole sprite is
      at most 8192 x 8192 pixels (the projector's limit): the images keep
      their size when they fit, else they are shrunk (aspect kept) to fit;
    * ``projector_config.pbtxt``: the projector's ``ProjectorConfig`` in
      protobuf text format (``tensor_name``, ``tensor_shape``,
      ``tensor_path``, ``metadata_path``, ``sprite { image_path
      single_image_dim }``, the paths relative to ``logdir``).

    The config describes this one embedding: it replaces any
    ``projector_config.pbtxt`` already in ``logdir`` (export several
    embeddings into separate directories, e.g. ``logs/epoch_5``). Each file is
    written whole or not at all, the config last. Open it with ``tensorboard
    --logdir <logdir>`` and the Projector tab (TensorBoard's projector reads
    the config in the log directory itself; no event file is needed).

    Args:
        logdir: the directory to write to.
        embeddings: ``[N, D]`` real numbers (an array or a tensor).
        labels: ``[N]`` labels (integers or strings). Defaults to `None`.
        ids: ``[N]`` ids (integers or strings). Defaults to `None`.
        images: ``[N, H, W]``, ``[N, H, W, 1]`` or ``[N, H, W, 3]`` images of
            the embeddings, scaled as for
            :func:`tfdml.analysis.plot_retrieval`. Defaults to `None` (no
            sprite).
        name: the tensor's name in the projector and the stem of its file.
            Defaults to `"embeddings"`.
        thumbnail_size: the size of a thumbnail in the sprite: an int (its
            longer side, the aspect kept) or ``(height, width)``; the grid
            must fit in 8192 x 8192 pixels. Defaults to `None` (the images'
            size, shrunk to fit when needed).

    Returns:
        The list of written paths, the config last.

    Raises:
        ValueError: embeddings that are not ``[N, D]`` real numbers or contain
            NaN or Inf (the message names ``embeddings`` and the rows),
            ``labels``, ``ids`` or ``images`` whose length is not ``N``, tabs
            or line breaks in labels or ids, a bad ``name`` or
            ``thumbnail_size``.
        ImportError: images given and neither Pillow nor matplotlib installed.

    Examples:

    >>> tfdml.analysis.projector_export("logs/projector", model.predict(x_test),
    ...                                 labels=y_test, images=x_test)
    """
    name = _check_name(name)
    x = _check_embeddings(embeddings)
    metadata = _metadata_text(labels, ids, len(x))
    sprite = None if images is None else _sprite(images, len(x), thumbnail_size)
    logdir = os.fspath(logdir)
    os.makedirs(logdir, exist_ok=True)
    written = [os.path.join(logdir, f"{name}.tsv")]
    with atomic_path(written[0]) as tmp, open(tmp, "wb") as f:
        np.savetxt(f, x, fmt="%.9g", delimiter="\t", newline="\n")
    if metadata is not None:
        written.append(os.path.join(logdir, "metadata.tsv"))
        _write_bytes(written[-1], metadata.encode("utf-8"))
    if sprite is not None:
        written.append(os.path.join(logdir, "sprite.png"))
        _write_bytes(written[-1], png_bytes(sprite[0]))
    config = _projector_config(name, x.shape, metadata is not None,
                               None if sprite is None else sprite[1])
    written.append(os.path.join(logdir, "projector_config.pbtxt"))
    _write_bytes(written[-1], config.encode("utf-8"))
    return written
