"""In-shop Clothes Retrieval (DeepFashion) from its published layout."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.datasets import common

__all__ = ["load_inshop"]

NAME = "inshop"
SPLITS = ("train", "query", "gallery")
_PARTITION = os.path.join("Eval", "list_eval_partition.txt")
_BBOXES = os.path.join("Anno", "list_bbox_inshop.txt")


def load_inshop(data_dir, split="train"):
    """Reads a split of the In-shop Clothes Retrieval benchmark from its published layout.

    The splits are the benchmark's own `list_eval_partition.txt`: `train`, and `query` and
    `gallery`, which share item ids (each query's matches are the gallery images of its
    item). Labels are the item numbers (`id_00000001` -> 1), the same in query and gallery.

    Expected layout::

        In-shop Clothes Retrieval Benchmark/     (any name; pass it as `data_dir`)
          Eval/list_eval_partition.txt   line 1: number of images; line 2: header
                                         `image_name item_id evaluation_status`; then e.g.
                                         `img/WOMEN/Dresses/id_00000002/02_1_front.jpg
                                         id_00000002 train`
          Img/img/WOMEN/Dresses/id_00000002/02_1_front.jpg ...   (img.zip extracted in Img/;
                                         `img/` directly under `data_dir` also works)
          Anno/list_bbox_inshop.txt      optional: line 1 count, line 2 header, then
                                         `<image_name> <clothes type> <pose> x_1 y_1 x_2 y_2`

    Args:
        data_dir: the benchmark folder (holding `Eval/`).
        split: `"train"`, `"query"` or `"gallery"`. Defaults to `"train"`.

    Returns:
        A `DatasetSplit` with `paths`, `labels` (item numbers), `class_names`
        (`{1: "id_00000001"}`), `bboxes` in pixels of the `img/` images,
        `(ymin, xmin, ymax, xmax)`, when `Anno/list_bbox_inshop.txt` is present (else None),
        and the garment types of the image paths as categories: `category_names`
        (`{1: "MEN/Denim", ...}`, the `<GENDER>/<TYPE>` folders of the whole list, sorted
        and numbered from 1, so every split numbers them alike) and `categories`
        (`{item number: category id}`; an item listed under several types takes the one
        most of its images are under). `PKSampler(categories=...)` and
        `pk_batches(..., categories_per_batch=C)` take them as they are. When an image
        path is not `img/<GENDER>/<TYPE>/<item>/<file>`, both are left empty (None, `{}`).

    Raises:
        ValueError: unknown `split`, or a malformed partition file.
        FileNotFoundError: the partition file or an image is missing.
    """
    check_choice("split", split, SPLITS)
    root = common.resolve_root(data_dir, NAME, _PARTITION)
    path = os.path.join(root, _PARTITION)
    with open(path, encoding="utf-8") as f:
        first, header = f.readline().strip(), f.readline().split()
    if header[:3] != ["image_name", "item_id", "evaluation_status"]:
        raise ValueError(
            f"{NAME}: malformed {path}: line 2 must be "
            f"'image_name item_id evaluation_status'. Received: {' '.join(header)!r}"
        )
    rows = common.read_rows(path, NAME, 3, skip=2)
    if first.isdigit() and int(first) != len(rows):
        raise ValueError(
            f"{NAME}: malformed {path}: line 1 announces {first} images. "
            f"Received: {len(rows)} image lines"
        )
    unknown = {r[2] for r in rows} - set(SPLITS)
    if unknown:
        raise ValueError(
            f"{NAME}: malformed {path}: evaluation_status must be one of {list(SPLITS)}. "
            f"Received: {sorted(unknown)}"
        )
    category_names, category_of = _categories(rows)
    rows = [r for r in rows if r[2] == split]
    image_root = os.path.join(root, "Img")
    if not os.path.isdir(os.path.join(image_root, "img")) and os.path.isdir(
        os.path.join(root, "img")
    ):
        image_root = root
    item_ids = [r[1] for r in rows]
    labels = np.array(
        [common.to_int(i.removeprefix("id_"), path, NAME) for i in item_ids], dtype=np.int64
    )
    paths = np.array([os.path.join(image_root, r[0]) for r in rows], dtype=str)
    common.check_paths_exist(paths, NAME)
    bboxes = None
    if os.path.isfile(os.path.join(root, _BBOXES)):
        # <image_name> <clothes type> <pose> x_1 y_1 x_2 y_2, after a count and a header
        boxes = common.read_boxes(os.path.join(root, _BBOXES), NAME, 7, corners=True, skip=2,
                                  what="box numbers")
        missing = [r[0] for r in rows if r[0] not in boxes]
        if missing:
            raise ValueError(
                f"{NAME}: malformed {os.path.join(root, _BBOXES)}: no box for {missing[0]}. "
                f"Received: {len(boxes)} boxes"
            )
        bboxes = np.array([boxes[r[0]] for r in rows], dtype=np.float32).reshape(-1, 4)
    names = dict(zip(labels.tolist(), item_ids, strict=True))
    ds = common.make_split(NAME, split, labels, paths, names, bboxes)
    if category_of is None:
        return ds
    categories = {int(c): category_of[item] for c, item in zip(labels, item_ids, strict=True)}
    return dataclasses.replace(ds, categories=categories, category_names=category_names)


def _categories(rows):
    """``({category id: "GENDER/TYPE"}, {item id: category id})`` from the image paths
    ``img/<GENDER>/<TYPE>/<item>/<file>`` of every row, or ``({}, None)`` when a path has
    another form. Ids number the sorted names from 1; an item under several types takes
    the most common one (the first listed, on a tie)."""
    parts = [r[0].split("/") for r in rows]
    if not parts or any(len(p) < 5 or p[0] != "img" for p in parts):
        return {}, None
    kinds = ["/".join(p[1:3]) for p in parts]
    ids = {name: i for i, name in enumerate(sorted(set(kinds)), start=1)}
    votes = {}
    for row, kind in zip(rows, kinds, strict=True):
        votes.setdefault(row[1], Counter())[kind] += 1
    category_of = {item: ids[count.most_common(1)[0][0]] for item, count in votes.items()}
    return {i: name for name, i in ids.items()}, category_of
