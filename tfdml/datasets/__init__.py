"""Readers of the metric-learning benchmark data sets, with the papers' zero-shot splits.

`load(name, split, data_dir=None, source="files", **options)` returns a
`tfdml.data.DatasetSplit` (paths, encoded bytes or images, plus labels, class names and
bounding boxes) that the P x K sampler and the evaluation code take directly.
`available()` lists the data sets, their splits, sources and options. See
`docs/datasets.md` for where to get each data set and the layout the readers expect.
The readers need no TensorFlow, except `source="tfds"` (TensorFlow Datasets).
"""

from __future__ import annotations

import os

from tfdml.datasets.cars import load_cars196
from tfdml.datasets.common import PUBLISHED_COUNTS, class_range_masks, split_counts
from tfdml.datasets.cub import load_cub200
from tfdml.datasets.digits import load_digits
from tfdml.datasets.glyphs import load_glyphs
from tfdml.datasets.inshop import load_inshop
from tfdml.datasets.omniglot import load_omniglot
from tfdml.datasets.sop import load_sop
from tfdml.datasets.tfds_source import TFDS_NAMES, load_tfds
from tfdml.datasets.vehicleid import load_vehicleid, vehicleid_query_gallery

__all__ = [
    "load",
    "available",
    "load_cub200",
    "load_cars196",
    "load_sop",
    "load_inshop",
    "load_vehicleid",
    "load_omniglot",
    "load_digits",
    "load_glyphs",
    "load_tfds",
    "vehicleid_query_gallery",
    "class_range_masks",
    "split_counts",
    "PUBLISHED_COUNTS",
]

_FILE_READERS = {
    "cub200": load_cub200,
    "cars196": load_cars196,
    "sop": load_sop,
    "inshop": load_inshop,
    "vehicleid": load_vehicleid,
    "omniglot": load_omniglot,
}
_SPLITS = {
    "cub200": ("train", "test"),
    "cars196": ("train", "test"),
    "sop": ("train", "test"),
    "inshop": ("train", "query", "gallery"),
    "vehicleid": ("train", "test_small", "test_medium", "test_large"),
    "omniglot": ("train", "test"),
    "digits": ("train", "test", "all"),
    "glyphs": ("train", "test", "all"),
}
_OPTIONS = {
    "omniglot": {"label": ("character", "alphabet")},
    "digits": {"dtype": ("uint8", "float32")},
    "glyphs": {"num_classes": "int >= 1", "samples_per_class": "int >= 2",
               "image_size": "int in [16, 256]", "difficulty": "float in [0, 3]",
               "characters_per_alphabet": "int >= 1", "seed": "int >= 0",
               "dtype": ("uint8", "float32"), "cache_dir": "a folder or None"},
}
_GENERATED = {"digits": load_digits, "glyphs": load_glyphs}  # in memory: no data_dir


def available():
    """Lists the data sets `load` reads.

    Returns:
        `{name: {"splits": (...), "sources": (...), "options": {option: choices}}}`.

    Example:

    >>> sorted(tfdml.datasets.available())
    ['cars196', 'cub200', 'digits', 'glyphs', 'inshop', 'omniglot', 'sop', 'vehicleid']
    """
    out = {}
    for name, splits in _SPLITS.items():
        sources = ("memory",) if name in _GENERATED else ("files",)
        if name in TFDS_NAMES:
            sources += ("tfds",)
        out[name] = {"splits": splits, "sources": sources, "options": dict(_OPTIONS.get(name, {}))}
    return out


def load(name, split, data_dir=None, source="files", **options):
    """Loads one split of a metric-learning data set.

    Args:
        name: one of `available()`: `"cub200"`, `"cars196"`, `"sop"`, `"inshop"`,
            `"vehicleid"`, `"omniglot"`, `"digits"`, `"glyphs"`.
        split: a split of that data set (see `available()`); the zero-shot splits of the
            papers, e.g. CUB classes 1-100 `"train"`, 101-200 `"test"`.
        data_dir: `source="files"`: the folder of the extracted data set in its original
            layout; defaults to `$TFDML_DATA_DIR/<name>` when that variable is set.
            `source="tfds"`: TFDS's data directory (defaults to TFDS's own).
            Not for `"digits"` (bundled with scikit-learn) nor `"glyphs"` (drawn in
            memory; its `cache_dir` option keeps it on disk): a `data_dir` raises a
            ValueError rather than being ignored.
        source: `"files"` (the published layout on disk) or `"tfds"` (through
            tensorflow-datasets; cub200, cars196, sop, omniglot). Defaults to `"files"`.
        **options: data-set options: `label="character"|"alphabet"` (omniglot),
            `dtype="uint8"|"float32"` (digits, glyphs), `download=False`
            (`source="tfds"`); glyphs' knobs `num_classes`, `samples_per_class`,
            `image_size`, `difficulty`, `characters_per_alphabet`, `seed`, `cache_dir`
            (`tfdml.datasets.load_glyphs`).

    Returns:
        A `tfdml.data.DatasetSplit`. Class ids are the data set's own (not re-numbered per
        split), so query and gallery ids match, and both sources give the same ids.

    Raises:
        ValueError: unknown `name`, `split`, `source` or option, `source="tfds"` for a
            data set TFDS does not have, `data_dir` for `"digits"` or `"glyphs"`, or a
            knob out of range; the message names
            the argument.
        FileNotFoundError: a file of the expected layout is missing; the message names it
            and where to get the data set.

    Example:

    >>> train = tfdml.datasets.load("digits", "train")
    >>> train.images.shape, train.num_classes
    ((1083, 8, 8, 1), 6)
    """
    if name not in _SPLITS:
        raise ValueError(f"`name` must be one of {sorted(_SPLITS)}. Received: name={name!r}")
    if source not in ("files", "tfds"):
        raise ValueError(f"`source` must be 'files' or 'tfds'. Received: source={source!r}")
    allowed = set(_OPTIONS.get(name, {})) | ({"download"} if source == "tfds" else set())
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"{name} (source={source!r}) takes the options {sorted(allowed)}. Received: {options!r}"
        )
    if source == "tfds" and name not in TFDS_NAMES:
        raise ValueError(
            f"`source='tfds'` is available for {sorted(TFDS_NAMES)}. Received: name={name!r}"
        )
    if name in _GENERATED:
        if data_dir is not None:
            where = ("is bundled with scikit-learn and read from there" if name == "digits"
                     else "is drawn in memory (its `cache_dir` option keeps it on disk)")
            raise ValueError(f"{name} {where}: it takes no `data_dir`. "
                             f"Received: data_dir={data_dir!r}")
        return _GENERATED[name](split, **options)
    if source == "tfds":
        return load_tfds(name, split, data_dir=data_dir, **options)
    if data_dir is None and os.environ.get("TFDML_DATA_DIR"):
        data_dir = os.path.join(os.environ["TFDML_DATA_DIR"], name)
    return _FILE_READERS[name](data_dir, split, **options)
