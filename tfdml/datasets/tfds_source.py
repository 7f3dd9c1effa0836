"""Reading the data sets through TensorFlow Datasets, with the same class splits and ids as
the readers of the published layouts."""

from __future__ import annotations

import numpy as np

from tfdml._argument_checks import check_choice
from tfdml.data.source import DatasetSplit
from tfdml.datasets import common, omniglot

__all__ = ["load_tfds", "TFDS_NAMES"]

# tfdml name -> TFDS builder name.
TFDS_NAMES = {
    "cub200": "caltech_birds2011",
    "cars196": "cars196",
    "sop": "stanford_online_products",
    "omniglot": "omniglot",
}
_SPLITS = {
    "cub200": ("train", "test"),
    "cars196": ("train", "test"),
    "sop": ("train", "test"),
    "omniglot": ("train", "test"),
}
# CUB and Cars196 are split per image in TFDS (for classification): read both TFDS splits
# and split by class id, as the metric-learning papers do.
_NUM_TRAIN_CLASSES = {"cub200": 100, "cars196": 98}


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:  # pragma: no cover - tensorflow-datasets is in the dev extra
        raise ImportError(
            "source='tfds' needs tensorflow-datasets: `pip install tensorflow-datasets` "
            "(or, in a clone of tfdml, `pip install \".[datasets]\"`)."
        ) from err
    return tfds


def _image_shape(img):
    from tfdml._tensorflow import tf

    is_jpeg = tf.equal(tf.strings.substr(img, 0, 2), b"\xff\xd8")
    return tf.cond(
        is_jpeg,
        lambda: tf.cast(tf.image.extract_jpeg_shape(img)[:2], tf.int32),
        lambda: tf.shape(tf.io.decode_image(img, channels=3, expand_animations=False))[:2],
    )


def load_tfds(name, split="train", data_dir=None, download=False, label="character"):
    """Reads a split through TensorFlow Datasets, as encoded image bytes.

    Same classes, ids and splits as the readers of the published layouts:

    * `cub200` (`caltech_birds2011`): TFDS's train and test are merged and split by class,
      1-100 train, 101-200 test; labels = TFDS label + 1 (CUB's own ids); pixel `bboxes`.
    * `cars196`: likewise, 1-98 train, 99-196 test; labels = TFDS label + 1.
    * `sop` (`stanford_online_products`): TFDS's train/test (the Ebay lists); labels =
      `class_id` + 1 (the ids of `Ebay_*.txt`); `class_names` = super-class names.
    * `omniglot`: TFDS's train (background) / test (evaluation); `label="character"` gives
      TFDS label + 1 (the file-name character number), `label="alphabet"` the alphabet ids
      of `load_omniglot`.

    Images are not decoded (`tfds.decode.SkipDecoding`), so this reads the whole split into
    memory as bytes.

    Args:
        name: `"cub200"`, `"cars196"`, `"sop"` or `"omniglot"`.
        split: `"train"` or `"test"`. Defaults to `"train"`.
        data_dir: TFDS data directory, passed to `tfds.builder`. Defaults to TFDS's own
            (`~/tensorflow_datasets`).
        download: call `download_and_prepare` first (network). Defaults to `False`.
        label: Omniglot only, `"character"` or `"alphabet"`. Defaults to `"character"`.

    Returns:
        A `DatasetSplit` with `encoded`, `labels`, `class_names` and, for CUB and Cars196,
        `bboxes` in pixels `(ymin, xmin, ymax, xmax)`.

    Raises:
        ValueError: unknown `name`, `split` or `label`.
        FileNotFoundError: the data set is not prepared in `data_dir` and `download=False`.
    """
    split = _check_arguments(name, split, label)
    cols, features, label_key = _read_columns(name, split, data_dir, download)
    labels = np.asarray(cols[label_key], dtype=np.int64).reshape(-1) + 1
    encoded = np.empty(len(labels), dtype=object)
    encoded[:] = cols["image"]
    bboxes = None
    if "bbox" in cols:
        bboxes = np.asarray(cols["bbox"], dtype=np.float32).reshape(-1, 4)
    labels, class_names, key = _classes(name, split, label, labels, cols, features, label_key)
    if name in _NUM_TRAIN_CLASSES:
        train, test = common.class_range_masks(labels, _NUM_TRAIN_CLASSES[name], first_id=1)
        keep = train if split == "train" else test
        labels, encoded = labels[keep], encoded[keep]
        bboxes = bboxes[keep] if bboxes is not None else None
        class_names = {c: n for c, n in class_names.items() if c in set(labels.tolist())}
    out = DatasetSplit(
        name=name,
        split=split,
        labels=labels,
        encoded=encoded,
        class_names=class_names,
        bboxes=bboxes,
    )
    common.check_published_counts(out, key)
    return out


def _check_arguments(name, split, label):
    """``split`` (an Omniglot alias resolved) once ``name``, ``split`` and ``label`` are known
    to be valid; a ValueError naming the first bad one otherwise."""
    check_choice("name", name, TFDS_NAMES)
    if name == "omniglot":
        split = omniglot.SPLIT_ALIASES.get(split, split)
        check_choice("label", label, omniglot.LABELS)
    elif label != "character":
        raise ValueError(f"`label` is an Omniglot option. Received: label={label!r}")
    check_choice("split", split, _SPLITS[name])
    return split


def _read_columns(name, split, data_dir, download):
    """``(columns, features, label_key)``: the split's examples read through TFDS as lists of
    NumPy values by feature name (images as encoded bytes, boxes in pixels), TFDS's feature
    descriptions, and the name of the class-id feature."""
    from tfdml._tensorflow import tf  # the ImportError that says what to install

    tfds = _import_tfds()

    builder = tfds.builder(TFDS_NAMES[name], data_dir=data_dir)
    if download:
        builder.download_and_prepare()
    features = builder.info.features
    decoders = {
        k: tfds.decode.SkipDecoding()
        for k, f in features.items()
        if isinstance(f, tfds.features.Image)
    }
    tfds_split = "train+test" if name in _NUM_TRAIN_CLASSES else split
    try:
        ds = builder.as_dataset(split=tfds_split, decoders=decoders, shuffle_files=False)
    except AssertionError as err:  # TFDS: "Dataset ... not found in data_dir"
        raise FileNotFoundError(
            f"{name}: TFDS data set {TFDS_NAMES[name]!r} is not prepared in "
            f"data_dir={data_dir!r}. Prepare it with `tfds build {TFDS_NAMES[name]}` or "
            f"load(..., source='tfds', download=True); the data come from "
            f"{common.HOMEPAGES[name]}. TFDS said: {err}"
        ) from err

    label_key = "class_id" if name == "sop" else "label"
    keys = ["image", label_key] + {
        "cub200": ["bbox", "label_name"],
        "cars196": ["bbox"],
        "sop": ["super_class_id"],
        "omniglot": ["alphabet"],
    }[name]

    def select(ex):
        out = {k: ex[k] for k in keys}
        if "bbox" in out:
            hw = tf.cast(_image_shape(ex["image"]), tf.float32)
            out["bbox"] = tf.cast(ex["bbox"], tf.float32) * tf.stack([hw[0], hw[1], hw[0], hw[1]])
        return out

    cols = {k: [] for k in keys}
    for ex in tfds.as_numpy(ds.map(select)):
        for k in keys:
            cols[k].append(ex[k])
    return cols, features, label_key


def _classes(name, split, label, labels, cols, features, label_key):
    """``(labels, class_names, key)``: the class ids (Omniglot alphabets with
    ``label="alphabet"``), their names, and the key of the published counts to check."""
    names_feature = features[label_key] if label_key in features else None
    known = list(getattr(names_feature, "names", []) or [])
    class_names = {
        int(c): known[c - 1] if c - 1 < len(known) else str(int(c)) for c in np.unique(labels)
    }
    key = (name, split)
    if name == "cub200":
        class_names.update(
            {
                int(c): n.decode() if isinstance(n, bytes) else str(n)
                for c, n in zip(labels, cols["label_name"], strict=True)
            }
        )
    elif name == "sop":
        from tfdml.datasets.sop import SUPER_CLASSES

        class_names = {
            int(c): SUPER_CLASSES[int(s)]
            for c, s in zip(labels, cols["super_class_id"], strict=True)
        }
    elif name == "omniglot" and label == "alphabet":
        alpha = np.asarray(cols["alphabet"], dtype=np.int64)
        ids = omniglot.alphabet_ids(alpha.tolist(), split)
        alphabet_names = list(getattr(features["alphabet"], "names", []) or [])
        labels = np.array([ids[a] for a in alpha.tolist()], dtype=np.int64)
        class_names = {
            i: alphabet_names[a] if a < len(alphabet_names) else str(i) for a, i in ids.items()
        }
        key = ("omniglot_alphabet", split)
    return labels, class_names, key
