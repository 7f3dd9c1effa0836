"""Omniglot from its published layout (`images_background/`, `images_evaluation/`)."""

from __future__ import annotations

import os

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.data.source import DatasetSplit
from tfdml.datasets import common

__all__ = ["load_omniglot"]

NAME = "omniglot"
SPLITS = ("train", "test")
SPLIT_ALIASES = {"background": "train", "evaluation": "test"}
LABELS = ("character", "alphabet")
_FOLDERS = {"train": "images_background", "test": "images_evaluation"}
# Alphabet ids: background alphabets 0-29, evaluation alphabets 30-49, each in sorted order
# of their folder names.
ALPHABET_OFFSET = {"train": 0, "test": 30}


def alphabet_ids(alphabet_keys, split):
    """Maps each alphabet key (folder name, or TFDS alphabet index) to its tfdml alphabet id:
    `ALPHABET_OFFSET[split]` + its rank in sorted order among the split's alphabets."""
    return {k: ALPHABET_OFFSET[split] + i for i, k in enumerate(sorted(set(alphabet_keys)))}


def load_omniglot(data_dir, split="train", label="character"):
    """Reads a split of Omniglot from its published layout.

    The split of Lake et al. (2015): the 30 background alphabets (`"train"`, alias
    `"background"`) and the 20 evaluation alphabets (`"test"`, alias `"evaluation"`).

    Labels:

    * `label="character"`: the data set's own character number, the prefix of each file
      name (`0709_01.png` -> 709): 1-964 in the background set, 965-1623 in evaluation.
    * `label="alphabet"`: the alphabet, as in the easy-positive-sampling paper: 0-29 for the
      background alphabets, 30-49 for the evaluation alphabets, in sorted order of folder
      names.

    Expected layout (`python/images_background.zip` and `python/images_evaluation.zip` of
    the Omniglot repository, extracted side by side)::

        omniglot/
          images_background/Alphabet_of_the_Magi/character01/0709_01.png ...
          images_evaluation/Angelic/character01/0965_01.png ...

    Args:
        data_dir: the folder holding `images_background/` and/or `images_evaluation/`.
        split: `"train"` or `"test"` (or `"background"`, `"evaluation"`).
            Defaults to `"train"`.
        label: `"character"` or `"alphabet"`. Defaults to `"character"`.

    Returns:
        A `DatasetSplit` with `paths`, `labels` and `class_names`
        (`{709: "Alphabet_of_the_Magi/character01"}`, or `{0: "Alphabet_of_the_Magi"}`).

    Raises:
        ValueError: unknown `split` or `label`, or a file name without a character number.
        FileNotFoundError: the split's folder is missing or empty.
    """
    split = SPLIT_ALIASES.get(split, split)
    check_choice("split", split, SPLITS)
    check_choice("label", label, LABELS)
    folder = _FOLDERS[split]
    root = common.resolve_root(data_dir, NAME, folder, ("omniglot", "python"))
    base = os.path.join(root, folder)
    # The zip files extract to images_background/<alphabet>/..., some copies have one more
    # images_background/ level.
    if os.path.isdir(os.path.join(base, folder)):
        base = os.path.join(base, folder)
    alphabets = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    if not alphabets:
        raise common.missing_file_error(os.path.join(base, "<alphabet>"), NAME, "directory")
    paths, chars, alpha, char_names = [], [], [], {}
    for a in alphabets:
        for c in sorted(os.listdir(os.path.join(base, a))):
            cdir = os.path.join(base, a, c)
            if not os.path.isdir(cdir):
                continue
            for f in sorted(os.listdir(cdir)):
                if not f.lower().endswith(".png"):
                    continue
                prefix = f.split("_")[0]
                if not prefix.isdigit():
                    raise ValueError(
                        f"{NAME}: malformed file name in {cdir}: expected "
                        f"'<character number>_<drawer>.png'. Received: {f!r}"
                    )
                paths.append(os.path.join(cdir, f))
                chars.append(int(prefix))
                alpha.append(a)
                char_names[int(prefix)] = f"{a}/{c}"
    if not paths:
        raise common.missing_file_error(os.path.join(base, "<alphabet>/<character>/*.png"), NAME)
    if label == "character":
        labels = np.array(chars, dtype=np.int64)
        class_names = char_names
        key = (NAME, split)
    else:
        ids = alphabet_ids(alpha, split)
        labels = np.array([ids[a] for a in alpha], dtype=np.int64)
        class_names = {i: a for a, i in ids.items()}
        key = ("omniglot_alphabet", split)
    ds = DatasetSplit(
        name=NAME,
        split=split,
        labels=labels,
        paths=np.array(paths, dtype=str),
        class_names=class_names,
    )
    common.check_published_counts(ds, key)
    return ds
