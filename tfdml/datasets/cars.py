"""Cars196 (Stanford Cars) from its published layouts: `car_ims/` + `cars_annos.mat`, or the
devkit layout (`cars_train/`, `cars_test/`, `devkit/`)."""

from __future__ import annotations

import os

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.datasets import common

__all__ = ["load_cars196"]

NAME = "cars196"
SPLITS = ("train", "test")
NUM_TRAIN_CLASSES = 98
_BOX_FIELDS = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2")


def _loadmat(path):
    if not os.path.isfile(path):
        raise common.missing_file_error(path, NAME)
    from scipy import io as sio

    try:
        return sio.loadmat(path, squeeze_me=True)
    except Exception as err:  # scipy raises several types for a corrupt file
        raise ValueError(f"{NAME}: cannot read {path} as a .mat file. Received: {err}") from err


def _records(mat, path, fields):
    """The `annotations` struct array of a Cars .mat file as a dict of 1-d arrays."""
    ann = mat.get("annotations")
    names = getattr(getattr(ann, "dtype", None), "names", None) or ()
    missing = [f for f in fields if f not in names]
    if ann is None or missing:
        raise ValueError(
            f"{NAME}: malformed {path}: expected an `annotations` struct with fields "
            f"{list(fields)}. Received: fields {list(names)}"
        )
    ann = np.atleast_1d(ann)
    return {f: np.atleast_1d(ann[f]) for f in fields}


def _class_names(mat, path):
    names = mat.get("class_names")
    if names is None:
        raise ValueError(f"{NAME}: malformed {path}: no `class_names`. Received: {sorted(mat)}")
    return {i + 1: str(n) for i, n in enumerate(np.atleast_1d(names))}


def _read_original(root):
    path = os.path.join(root, "cars_annos.mat")
    mat = _loadmat(path)
    rec = _records(mat, path, ("relative_im_path", "class", *_BOX_FIELDS))
    paths = [os.path.join(root, str(p)) for p in rec["relative_im_path"]]
    return paths, rec, _class_names(mat, path)


def _read_devkit(root):
    devkit = os.path.join(root, "devkit")
    meta_path = os.path.join(devkit, "cars_meta.mat")
    class_names = _class_names(_loadmat(meta_path), meta_path)
    train_path = os.path.join(devkit, "cars_train_annos.mat")
    test_path = os.path.join(root, "cars_test_annos_withlabels.mat")
    if not os.path.isfile(test_path):
        test_path = os.path.join(devkit, "cars_test_annos_withlabels.mat")
    fields = ("fname", "class", *_BOX_FIELDS)
    paths, parts = [], []
    for mat_path, folder in ((train_path, "cars_train"), (test_path, "cars_test")):
        rec = _records(_loadmat(mat_path), mat_path, fields)
        paths += [os.path.join(root, folder, str(f)) for f in rec["fname"]]
        parts.append(rec)
    rec = {f: np.concatenate([p[f] for p in parts]) for f in ("class", *_BOX_FIELDS)}
    return paths, rec, class_names


def load_cars196(data_dir, split="train"):
    """Reads a split of Cars196 from its published layout.

    The zero-shot split of the metric-learning papers: classes 1-98 train, 99-196 test
    (the data set's own per-image `test` flags are not used). Labels are the data set's own
    class ids, 1 to 196.

    Expected layout, either the original release (`car_ims.tgz` + `cars_annos.mat`)::

        cars196/
          cars_annos.mat        struct `annotations` (relative_im_path, bbox_x1, bbox_y1,
                                bbox_x2, bbox_y2, class, test) and `class_names`
          car_ims/000001.jpg ...

    or the devkit release::

        cars196/
          cars_train/00001.jpg ...   cars_test/00001.jpg ...
          devkit/cars_meta.mat  devkit/cars_train_annos.mat
          cars_test_annos_withlabels.mat   (or devkit/cars_test_annos_withlabels.mat)

    Args:
        data_dir: the folder holding `cars_annos.mat` (or `devkit/`).
        split: `"train"` or `"test"`. Defaults to `"train"`.

    Returns:
        A `DatasetSplit` with `paths`, `labels` (1-196), `class_names` and `bboxes` in
        pixels, `(ymin, xmin, ymax, xmax)`.

    Raises:
        ValueError: unknown `split`, or a malformed .mat file.
        FileNotFoundError: the annotation file or an image is missing.
    """
    check_choice("split", split, SPLITS)
    if (
        data_dir is not None
        and os.path.isdir(os.path.join(os.fspath(data_dir), "devkit"))
        and not os.path.isfile(os.path.join(os.fspath(data_dir), "cars_annos.mat"))
    ):
        root = os.fspath(data_dir)
        paths, rec, class_names = _read_devkit(root)
    else:
        root = common.resolve_root(data_dir, NAME, "cars_annos.mat", ("cars196", "stanford_cars"))
        paths, rec, class_names = _read_original(root)
    try:
        labels = rec["class"].astype(np.int64)
        boxes = np.stack([rec[f].astype(np.float32) for f in _BOX_FIELDS], axis=1)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{NAME}: malformed annotations in {root}: non-numeric class or box. Received: {err}"
        ) from err
    train, test = common.class_range_masks(labels, NUM_TRAIN_CLASSES, first_id=1)
    keep = train if split == "train" else test
    paths = np.array([p for p, k in zip(paths, keep, strict=True) if k], dtype=str)
    common.check_paths_exist(paths, NAME)
    x1, y1, x2, y2 = boxes[keep].T
    labels = labels[keep]
    bboxes = np.stack([y1, x1, y2, x2], axis=1).reshape(-1, 4)
    return common.make_split(NAME, split, labels, paths, class_names, bboxes)
