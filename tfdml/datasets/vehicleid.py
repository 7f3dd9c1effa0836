"""PKU VehicleID from its published layout (`VehicleID_V1.0/`)."""

from __future__ import annotations

import os

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.data.source import DatasetSplit
from tfdml.datasets import common

__all__ = ["load_vehicleid", "vehicleid_query_gallery"]

NAME = "vehicleid"
_FILES = {
    "train": "train_list.txt",
    "test_small": "test_list_800.txt",
    "test_medium": "test_list_1600.txt",
    "test_large": "test_list_2400.txt",
}
SPLITS = tuple(_FILES)


def load_vehicleid(data_dir, split="train"):
    """Reads a split of VehicleID from its published layout.

    The splits are the data set's own lists: `train_list.txt` and the small, medium and
    large test lists of 800, 1,600 and 2,400 vehicles. Labels are the vehicle ids of
    those lists.

    Expected layout::

        VehicleID_V1.0/
          image/0000001.jpg ...
          train_test_split/train_list.txt       one `<image name> <vehicle id>` a line,
          train_test_split/test_list_800.txt    e.g. `0001083 1`
          train_test_split/test_list_1600.txt
          train_test_split/test_list_2400.txt

    Args:
        data_dir: the `VehicleID_V1.0` folder or its parent.
        split: `"train"`, `"test_small"`, `"test_medium"` or `"test_large"`.
            Defaults to `"train"`.

    Returns:
        A `DatasetSplit` with `paths`, `labels` and `class_names` (`{id: str(id)}`).
        Use `vehicleid_query_gallery` for the papers' test protocol.

    Raises:
        ValueError: unknown `split`, or a malformed list file.
        FileNotFoundError: the list file or an image is missing.
    """
    check_choice("split", split, SPLITS)
    rel = os.path.join("train_test_split", _FILES[split])
    root = common.resolve_root(data_dir, NAME, rel, ("VehicleID_V1.0",))
    path = os.path.join(root, rel)
    rows = common.read_rows(path, NAME, 2)
    labels = np.array([common.to_int(r[1], path, NAME) for r in rows], dtype=np.int64)
    names = [r[0] if r[0].lower().endswith(".jpg") else r[0] + ".jpg" for r in rows]
    paths = np.array([os.path.join(root, "image", n) for n in names], dtype=str)
    common.check_paths_exist(paths, NAME)
    return common.make_split(NAME, split, labels, paths)


def vehicleid_query_gallery(ds, seed=0):
    """The VehicleID test protocol: one random image of each vehicle forms the gallery,
    all its other images are queries (Liu et al. 2016; papers repeat it over 10 seeds).

    Args:
        ds: a VehicleID test `DatasetSplit` (any split with `paths` works).
        seed: seed of the random choice. Defaults to `0`.

    Returns:
        `(query, gallery)`, two `DatasetSplit`s with splits `"<split>_query"` and
        `"<split>_gallery"`. Vehicles with a single image have no query.
    """
    if not isinstance(ds, DatasetSplit) or ds.paths is None:
        raise ValueError(f"`ds` must be a DatasetSplit with `paths`. Received: ds={ds!r}")
    rng = np.random.default_rng(seed)
    gallery = np.zeros(len(ds), dtype=bool)
    for c in np.unique(ds.labels):
        gallery[rng.choice(np.flatnonzero(ds.labels == c))] = True

    def part(mask, suffix):
        return DatasetSplit(
            name=ds.name,
            split=f"{ds.split}_{suffix}",
            labels=ds.labels[mask],
            paths=ds.paths[mask],
            class_names={c: n for c, n in ds.class_names.items() if c in set(ds.labels[mask])},
        )

    return part(~gallery, "query"), part(gallery, "gallery")
