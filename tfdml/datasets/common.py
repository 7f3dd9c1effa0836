"""Helpers shared by the data set readers: published counts, class-range splits, checks."""

from __future__ import annotations

import logging
import os

import numpy as np

logger = logging.getLogger("tfdml.datasets")

# Where to get each data set, quoted in every "missing file" error.
HOMEPAGES = {
    "cub200": "CUB-200-2011, https://www.vision.caltech.edu/datasets/cub_200_2011/ "
    "(CUB_200_2011.tgz, https://data.caltech.edu/records/65de6-vp158)",
    "cars196": "Stanford Cars (Cars196), https://ai.stanford.edu/~jkrause/cars/car_dataset.html "
    "(car_ims.tgz + cars_annos.mat, or cars_train.tgz/cars_test.tgz + car_devkit.tgz + "
    "cars_test_annos_withlabels.mat)",
    "sop": "Stanford Online Products, https://cvgl.stanford.edu/projects/lifted_struct/ "
    "(Stanford_Online_Products.zip)",
    "inshop": "DeepFashion In-shop Clothes Retrieval Benchmark, "
    "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html "
    "(Img/img.zip and Eval/list_eval_partition.txt)",
    "vehicleid": "PKU VehicleID, https://www.pkuml.org/resources/pku-vehicleid.html "
    "(VehicleID_V1.0, on request from the authors)",
    "omniglot": "Omniglot, https://github.com/brendenlake/omniglot "
    "(python/images_background.zip and python/images_evaluation.zip)",
}

# Published (classes, images) per split, with where each number comes from. `load` warns
# when a full split read from disk differs from these (None: not checked).
_PUBLISHED = (
    # (data set, source, {split: (classes, images)})
    ("cub200", "FAPPY paper sec. 4.1; LoOp paper sec. 4",
     {"train": (100, 5864), "test": (100, 5924)}),
    ("cars196", "LoOp paper sec. 4", {"train": (98, 8054), "test": (98, 8131)}),
    ("sop", "FAPPY paper sec. 4.1; LoOp paper sec. 4",
     {"train": (11318, 59551), "test": (11316, 60502)}),
    ("inshop", "DeepFashion In-shop benchmark description",
     {"train": (3997, 25882), "query": (3985, 14218), "gallery": (3985, 12612)}),
    # train_list.txt as distributed: 13,164 vehicles (documented by several VehicleID reader
    # codebases). Its image count is not checked: no primary source was found for it, and
    # the paper's 13,134 vehicles / 110,178 images do not describe the distributed list.
    ("vehicleid", "the distributed train_list.txt", {"train": (13164, None)}),
    ("vehicleid", "FAPPY paper sec. 4.1 (after Liu et al. 2016)",
     {"test_small": (800, 7332), "test_medium": (1600, 12995), "test_large": (2400, 20038)}),
    ("omniglot", "Omniglot repository README (Lake et al. 2015)",
     {"train": (964, 19280), "test": (659, 13180)}),
    ("omniglot_alphabet", "Omniglot repository README",
     {"train": (30, 19280), "test": (20, 13180)}),
)
#: `{(data set, split): (classes, images, source)}`.
PUBLISHED_COUNTS = {
    (name, split): (classes, images, source)
    for name, source, splits in _PUBLISHED
    for split, (classes, images) in splits.items()
}


def missing_file_error(path, name, what="file"):
    """Builds the error raised when a file of a data set's published layout is missing.

    Args:
        path: the file or directory that was expected.
        name: data set name (a key of `HOMEPAGES`).
        what: `"file"` or `"directory"`, for the message.

    Returns:
        A `FileNotFoundError` naming `path` and where to get the data set.
    """
    return FileNotFoundError(
        f"{name}: expected {what} not found: {path}. Download the data set from "
        f"{HOMEPAGES[name]} and pass the extracted folder as `data_dir` "
        "(see docs/datasets.md for the expected layout)."
    )


def resolve_root(data_dir, name, marker, default_folders=()):
    """Finds the data set root: `data_dir` itself or one of its known sub-folders.

    Args:
        data_dir: the directory the user passed.
        name: data set name, for the error message.
        marker: a path relative to the root that must exist (e.g. `"images.txt"`).
        default_folders: sub-folder names the archive extracts to (e.g. `"CUB_200_2011"`),
            tried when `marker` is not directly under `data_dir`.

    Returns:
        The root directory, a str.

    Raises:
        ValueError: `data_dir` is None or empty.
        FileNotFoundError: `marker` is found in none of the candidate folders.
    """
    if data_dir is None or str(data_dir) == "":
        raise ValueError(
            f"{name}: `data_dir` must be the folder holding the extracted data set "
            f"(it must contain {marker!r}). Received: data_dir={data_dir!r}"
        )
    data_dir = os.path.expanduser(os.fspath(data_dir))
    for root in [data_dir] + [os.path.join(data_dir, f) for f in default_folders]:
        if os.path.exists(os.path.join(root, marker)):
            return root
    raise missing_file_error(os.path.join(data_dir, marker), name)


def read_rows(path, name, ncols, skip=0):
    """Reads a whitespace-separated list file into rows of `ncols` str fields.

    Args:
        path: the file.
        name: data set name, for the error messages.
        ncols: the number of fields every row must have (at least).
        skip: number of header lines to skip.

    Returns:
        A list of lists of str.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: a row has fewer than `ncols` fields.
    """
    if not os.path.isfile(path):
        raise missing_file_error(path, name)
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno <= skip or not line.strip():
                continue
            fields = line.split()
            if len(fields) < ncols:
                raise ValueError(
                    f"{name}: malformed line {lineno} of {path}: expected {ncols} fields. "
                    f"Received: {line.strip()!r}"
                )
            rows.append(fields[:ncols])
    return rows


def read_boxes(path, name, ncols, corners=False, skip=0, what="numbers"):
    """Reads a bounding-box list file: `{first field: (ymin, xmin, ymax, xmax)}` in pixels.

    Args:
        path: the file.
        name: data set name, for the error messages.
        ncols: the fields of a row; its last four are the box.
        corners: the box is `x1 y1 x2 y2` (else `x y width height`). Defaults to `False`.
        skip: number of header lines to skip. Defaults to `0`.
        what: what the four fields are called in the error message. Defaults to
            `"numbers"`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: a row is too short or its box is not four numbers.
    """
    boxes = {}
    for r in read_rows(path, name, ncols, skip=skip):
        try:
            x, y, a, b = (float(v) for v in r[-4:])
        except ValueError:
            raise ValueError(
                f"{name}: malformed {path}: expected 4 {what}. Received: {r!r}"
            ) from None
        # (a, b): the corner (x2, y2) with `corners`, else the width and height
        boxes[r[0]] = (y, x, b, a) if corners else (y, x, y + b, x + a)
    return boxes


def to_int(value, path, name):
    """`int(value)`, or a ValueError naming the file and the value."""
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{name}: malformed {path}: expected an integer. Received: {value!r}"
        ) from None


def class_range_masks(labels, num_train_classes, first_id=1):
    """The zero-shot split by class id: the first `num_train_classes` ids train, the rest test.

    Args:
        labels: `[N]` integer class ids.
        num_train_classes: number of training classes (100 for CUB, 98 for Cars196).
        first_id: the smallest class id of the data set (1 for CUB and Cars196).

    Returns:
        `(train_mask, test_mask)`, two `[N]` bool arrays.
    """
    labels = np.asarray(labels)
    train = labels < first_id + num_train_classes
    return train, ~train


def split_counts(class_counts, num_train_classes, first_id=1):
    """Classes and images per split that `class_range_masks` gives for per-class counts.

    Args:
        class_counts: `{class id: number of images}` for the whole data set.
        num_train_classes: see `class_range_masks`.
        first_id: see `class_range_masks`.

    Returns:
        `{"train": (classes, images), "test": (classes, images)}`.
    """
    ids = np.array(sorted(class_counts), dtype=np.int64)
    counts = np.array([class_counts[i] for i in ids], dtype=np.int64)
    train, test = class_range_masks(ids, num_train_classes, first_id)
    return {
        "train": (int(train.sum()), int(counts[train].sum())),
        "test": (int(test.sum()), int(counts[test].sum())),
    }


def make_split(name, split, labels, paths, names=None, bboxes=None):
    """A `DatasetSplit` of image files, its published counts checked (see below).

    Args:
        names: `{class id: name}` for (at least) the classes present; a class
            without an entry is named by its id.
    """
    from tfdml.data.source import DatasetSplit

    names = names or {}
    ds = DatasetSplit(
        name=name,
        split=split,
        labels=labels,
        paths=paths,
        class_names={int(c): names.get(int(c), str(int(c))) for c in np.unique(labels)},
        bboxes=bboxes,
    )
    check_published_counts(ds)
    return ds


def check_published_counts(ds, key=None):
    """Logs a warning when a full split's class or image count differs from the published one.

    Args:
        ds: a `DatasetSplit`.
        key: `(name, split)` to compare with; defaults to `(ds.name, ds.split)`.

    Returns:
        True when the counts match (or nothing is published for `key`), else False.
    """
    key = key or (ds.name, ds.split)
    if key not in PUBLISHED_COUNTS:
        return True
    classes, images, source = PUBLISHED_COUNTS[key]
    if ds.num_classes == classes and images in (None, len(ds)):
        return True
    logger.warning(
        "%s/%s: read %d classes and %d images; the published split has %d classes and %s "
        "images (%s). Check that the data set is complete and unmodified.",
        key[0],
        key[1],
        ds.num_classes,
        len(ds),
        classes,
        "an unpublished number of" if images is None else images,
        source,
    )
    return False


def check_paths_exist(paths, name):
    """Raises `FileNotFoundError` naming the first listed image that is not on disk."""
    for p in paths:
        if not os.path.isfile(p):
            raise missing_file_error(p, name)
