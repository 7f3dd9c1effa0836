"""CUB-200-2011 from its published layout (`CUB_200_2011/`)."""

from __future__ import annotations

import os

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.datasets import common

__all__ = ["load_cub200"]

NAME = "cub200"
SPLITS = ("train", "test")
NUM_TRAIN_CLASSES = 100


def load_cub200(data_dir, split="train"):
    """Reads a split of CUB-200-2011 from its published layout.

    The zero-shot split of the metric-learning papers: classes 1-100 train, 101-200 test
    (the data set's own `train_test_split.txt`, a per-image classification split, is not
    used). Labels are CUB's own class ids, 1 to 200.

    Expected layout (the extracted `CUB_200_2011.tgz`; `data_dir` may be this folder or its
    parent)::

        CUB_200_2011/
          images.txt               <image id> <relative path>
          image_class_labels.txt   <image id> <class id>
          classes.txt              <class id> <class folder name>
          bounding_boxes.txt       <image id> <x> <y> <width> <height>  (optional)
          images/001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg ...

    Args:
        data_dir: the `CUB_200_2011` folder or its parent.
        split: `"train"` or `"test"`. Defaults to `"train"`.

    Returns:
        A `DatasetSplit` with `paths`, `labels` (1-200), `class_names`
        (`{id: "001.Black_footed_Albatross"}`) and `bboxes` in pixels,
        `(ymin, xmin, ymax, xmax)`, or None without `bounding_boxes.txt`.

    Raises:
        ValueError: unknown `split`, or a malformed list file.
        FileNotFoundError: a list file or an image is missing.
    """
    check_choice("split", split, SPLITS)
    root = common.resolve_root(data_dir, NAME, "images.txt", ("CUB_200_2011",))
    images = common.read_rows(os.path.join(root, "images.txt"), NAME, 2)
    labels_path = os.path.join(root, "image_class_labels.txt")
    image_labels = {
        r[0]: common.to_int(r[1], labels_path, NAME) for r in common.read_rows(labels_path, NAME, 2)
    }
    classes_path = os.path.join(root, "classes.txt")
    class_names = {
        common.to_int(r[0], classes_path, NAME): r[1]
        for r in common.read_rows(classes_path, NAME, 2)
    }
    missing = [r[0] for r in images if r[0] not in image_labels]
    if missing:
        raise ValueError(
            f"{NAME}: malformed {labels_path}: no class for image ids {missing[:5]}. "
            f"Received: {len(image_labels)} labelled images for {len(images)} listed"
        )
    box_path = os.path.join(root, "bounding_boxes.txt")
    boxes = None
    if os.path.isfile(box_path):
        boxes = common.read_boxes(box_path, NAME, 5)  # <image id> <x> <y> <width> <height>
    else:
        common.logger.info("%s: no %s, bboxes=None", NAME, box_path)

    labels = np.array([image_labels[r[0]] for r in images], dtype=np.int64)
    train, test = common.class_range_masks(labels, NUM_TRAIN_CLASSES, first_id=1)
    keep = train if split == "train" else test
    ids = [r[0] for r, k in zip(images, keep, strict=True) if k]
    paths = np.array(
        [os.path.join(root, "images", r[1]) for r, k in zip(images, keep, strict=True) if k],
        dtype=str,
    )
    common.check_paths_exist(paths, NAME)
    bboxes = None
    if boxes is not None:
        missing = [i for i in ids if i not in boxes]
        if missing:
            raise ValueError(
                f"{NAME}: malformed {box_path}: no box for image ids {missing[:5]}. "
                f"Received: {len(boxes)} boxes"
            )
        bboxes = np.array([boxes[i] for i in ids], dtype=np.float32).reshape(-1, 4)
    labels = labels[keep]
    return common.make_split(NAME, split, labels, paths, class_names, bboxes)
