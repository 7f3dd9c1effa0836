"""scikit-learn's bundled 8x8 digits, as a small zero-shot data set for tests and demos."""

from __future__ import annotations

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.data.source import DatasetSplit

__all__ = ["load_digits"]

NAME = "digits"
SPLITS = ("train", "test", "all")
DTYPES = ("uint8", "float32")


def load_digits(split="train", dtype="uint8"):
    """Loads scikit-learn's 8x8 handwritten digits (1,797 images, no download).

    A zero-shot split like the papers': digits 0-5 train, 6-9 test, `"all"` everything.
    Labels are the digits themselves.

    Args:
        split: `"train"`, `"test"` or `"all"`. Defaults to `"train"`.
        dtype: `"uint8"` (pixel values 0-255, scaled from scikit-learn's 0-16) or
            `"float32"` (values in [0, 1]). Defaults to `"uint8"`.

    Returns:
        A `DatasetSplit` with `images` of shape `[N, 8, 8, 1]`, `labels` and
        `class_names` (`{0: "0", ...}`).

    Raises:
        ValueError: unknown `split` or `dtype`.
    """
    check_choice("split", split, SPLITS)
    check_choice("dtype", dtype, DTYPES)
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    x = bunch.images.astype(np.float32) / 16.0
    y = bunch.target.astype(np.int64)
    keep = {"train": y <= 5, "test": y >= 6, "all": np.ones_like(y, dtype=bool)}[split]
    x = x[keep][..., None]
    if dtype == "uint8":
        x = np.round(x * 255.0).astype(np.uint8)
    y = y[keep]
    return DatasetSplit(
        name=NAME,
        split=split,
        labels=y,
        images=x,
        class_names={int(c): str(int(c)) for c in np.unique(y)},
    )
