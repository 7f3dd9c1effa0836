"""Stanford Online Products from its published layout (`Stanford_Online_Products/`)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.datasets import common

__all__ = ["load_sop", "SUPER_CLASSES"]

NAME = "sop"
SPLITS = ("train", "test")
_FILES = {"train": "Ebay_train.txt", "test": "Ebay_test.txt"}
# Super-class names in the order of their ids (1-12) in the Ebay_*.txt lists.
SUPER_CLASSES = (
    "bicycle",
    "cabinet",
    "chair",
    "coffee_maker",
    "fan",
    "kettle",
    "lamp",
    "mug",
    "sofa",
    "stapler",
    "table",
    "toaster",
)


def load_sop(data_dir, split="train"):
    """Reads a split of Stanford Online Products from its published layout.

    The split is the data set's own: `Ebay_train.txt` (classes 1-11,318) and `Ebay_test.txt`
    (classes 11,319-22,634). Labels are the product class ids of those files.

    Expected layout (the extracted `Stanford_Online_Products.zip`)::

        Stanford_Online_Products/
          Ebay_train.txt   header `image_id class_id super_class_id path`, then one image
          Ebay_test.txt    a line, e.g. `1 1 1 bicycle_final/111085122871_0.JPG`
          bicycle_final/111085122871_0.JPG ...

    Args:
        data_dir: the `Stanford_Online_Products` folder or its parent.
        split: `"train"` or `"test"`. Defaults to `"train"`.

    Returns:
        A `DatasetSplit` with `paths`, `labels`, `class_names` = each product's
        super-class name (e.g. `"bicycle"`; products have no names of their own),
        `categories` = each product's `super_class_id` (`{class id: 1 ... 12}`) and
        `category_names` = `{super_class_id: name}` for the 12 super-classes (the
        `SUPER_CLASSES` in order). `PKSampler(categories=...)` and
        `pk_batches(..., categories_per_batch=C)` take them as they are.

    Raises:
        ValueError: unknown `split`, or a malformed list file.
        FileNotFoundError: the list file or an image is missing.
    """
    check_choice("split", split, SPLITS)
    fname = _FILES[split]
    root = common.resolve_root(data_dir, NAME, fname, ("Stanford_Online_Products",))
    path = os.path.join(root, fname)
    with open(path, encoding="utf-8") as f:
        header = f.readline().split()
    if header[:4] != ["image_id", "class_id", "super_class_id", "path"]:
        raise ValueError(
            f"{NAME}: malformed {path}: the first line must be "
            f"'image_id class_id super_class_id path'. Received: {' '.join(header)!r}"
        )
    rows = common.read_rows(path, NAME, 4, skip=1)
    labels = np.array([common.to_int(r[1], path, NAME) for r in rows], dtype=np.int64)
    supers = [common.to_int(r[2], path, NAME) for r in rows]
    bad = [s for s in supers if not 1 <= s <= len(SUPER_CLASSES)]
    if bad:
        raise ValueError(
            f"{NAME}: malformed {path}: super_class_id must be in 1-{len(SUPER_CLASSES)}. "
            f"Received: {bad[0]}"
        )
    paths = np.array([os.path.join(root, r[3]) for r in rows], dtype=str)
    common.check_paths_exist(paths, NAME)
    categories = {int(c): s for c, s in zip(labels, supers, strict=True)}
    class_names = {c: SUPER_CLASSES[s - 1] for c, s in categories.items()}
    ds = common.make_split(NAME, split, labels, paths, class_names)
    names = {i: name for i, name in enumerate(SUPER_CLASSES, start=1)}
    return dataclasses.replace(ds, categories=categories, category_names=names)
