"""Files, checkpoints, evaluation data and data set splits that cannot be right: an error up
front that names the argument or the file, instead of a silent failure or a late one.

A catalogue:

* loading the wrong checkpoint into a ``MetricModel``: another loss class (ProxyAnchor
  weights into an ArcFace model loaded without a word), another ``num_classes`` (Keras said
  "expected 1 variables, but received 0"), a truncated ``.weights.h5`` / ``.keras`` file
  (h5py's "truncated file", Keras' "File not found");
* ``tfdml.callbacks.RecallAtK``: ``ks`` larger than the data allows, data without labels, a
  dataset that never ends (checked when the callback is made, not after the first epoch);
* ``tfdml.metrics.recall_at_k``: ``ks`` that are not positive integers, or larger than the
  gallery;
* ``tfdml.data.DatasetSplit`` and ``tfdml.datasets.load``: labels that are not class ids,
  items of the wrong type, sizes that do not match, arguments that would be ignored.

Each case asserts the error type and that the message names the argument or the file. The
checkpoint cases run under every Keras backend.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import tfdml
from tfdml import losses
from tfdml._files import CorruptFileError
from tfdml.callbacks import RecallAtK
from tfdml.data import DatasetSplit
from tfdml.models import MetricModel

# -- checkpoints of another model -------------------------------------------------------------


def _model(loss, dim=4):
    keras.utils.set_random_seed(0)
    embedder = keras.Sequential([keras.Input((6,)), keras.layers.Dense(dim)])
    model = MetricModel(embedder, loss)
    model.compile(optimizer="adam")
    return model


def _saved(tmp_path, loss, name="run.weights.h5"):
    path = tmp_path / name
    model = _model(loss)
    if name.endswith(".keras"):
        model.save(path)
    else:
        model.save_weights(path)
    return path, model


@pytest.mark.multibackend
def test_weights_of_another_loss_class_are_refused(tmp_path):
    # Same state layout ([C, D] vectors): this used to load without a word.
    path, _ = _saved(tmp_path, losses.ProxyAnchorLoss(num_classes=4))
    model = _model(losses.ArcFaceLoss(num_classes=4))
    before = np.asarray(model.metric_loss.class_vectors).copy()
    with pytest.raises(ValueError, match="ProxyAnchorLoss.*ArcFaceLoss") as info:
        model.load_weights(path)
    assert str(path) in str(info.value)
    np.testing.assert_array_equal(np.asarray(model.metric_loss.class_vectors), before)


@pytest.mark.multibackend
def test_weights_of_another_num_classes_name_the_shapes(tmp_path):
    path, _ = _saved(tmp_path, losses.ArcFaceLoss(num_classes=4))
    with pytest.raises(ValueError, match=r"\(4, 4\) in the file and \(7, 4\).*num_classes=4 in "
                                         r"the file, 7 here") as info:
        _model(losses.ArcFaceLoss(num_classes=7)).load_weights(path)
    assert str(path) in str(info.value) and "expected 1 variables" not in str(info.value)


@pytest.mark.multibackend
def test_weights_of_another_embedding_size_name_it(tmp_path):
    path, _ = _saved(tmp_path, losses.ProxyAnchorLoss(num_classes=3))
    model = _model(losses.ProxyAnchorLoss(num_classes=3), dim=5)
    with pytest.raises(ValueError, match="embedding size 4 in the file, 5 here") as info:
        model.load_weights(path)
    assert str(path) in str(info.value)


@pytest.mark.multibackend
def test_weights_of_the_same_loss_still_load_and_skip_mismatch_still_warns(tmp_path):
    path, saved = _saved(tmp_path, losses.ArcFaceLoss(num_classes=4))
    model = _model(losses.ArcFaceLoss(num_classes=4))
    model.metric_loss.class_vectors.assign(np.zeros((4, 4), "float32"))
    model.load_weights(path)
    np.testing.assert_array_equal(np.asarray(model.metric_loss.class_vectors),
                                  np.asarray(saved.metric_loss.class_vectors))
    other = _model(losses.ProxyAnchorLoss(num_classes=4))
    with pytest.warns(UserWarning, match="ProxyAnchorLoss"):  # Keras' skip_mismatch
        other.load_weights(tmp_path / "run.weights.h5", skip_mismatch=True)


@pytest.mark.multibackend
def test_a_wrapper_sharing_its_losss_state_loads_its_own_weights(tmp_path):
    def trimmed():
        return losses.TrimmedLoss(losses.MarginLoss(num_classes=3), trim=0.25)

    path, saved = _saved(tmp_path, trimmed())
    model = _model(trimmed())
    model.load_weights(path)
    np.testing.assert_array_equal(np.asarray(model.metric_loss.trainable_variables[0]),
                                  np.asarray(saved.metric_loss.trainable_variables[0]))


@pytest.mark.multibackend
@pytest.mark.parametrize("name", ["run.weights.h5", "run.keras"])
def test_a_truncated_file_is_named_as_truncated(tmp_path, name):
    path, _ = _saved(tmp_path, losses.ArcFaceLoss(num_classes=4), name)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what a save killed part-way leaves
    model = _model(losses.ArcFaceLoss(num_classes=4))
    with pytest.raises(CorruptFileError, match="truncated or corrupt") as info:
        model.load_weights(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, OSError)
    if name.endswith(".keras"):  # keras.saving.load_model says "File not found"
        with pytest.raises(CorruptFileError, match="truncated or corrupt") as info:
            tfdml.models.load_model(path)
        assert str(path) in str(info.value)


@pytest.mark.multibackend
def test_load_model_of_a_complete_file_and_of_a_missing_one(tmp_path):
    path, saved = _saved(tmp_path, losses.ArcFaceLoss(num_classes=4), "run.keras")
    loaded = tfdml.models.load_model(path, compile=False)
    assert isinstance(loaded, MetricModel)
    np.testing.assert_array_equal(np.asarray(loaded.metric_loss.class_vectors),
                                  np.asarray(saved.metric_loss.class_vectors))
    with pytest.raises(ValueError, match="missing.keras"):  # Keras' own error
        tfdml.models.load_model(tmp_path / "missing.keras")


# -- RecallAtK: checked when it is made -------------------------------------------------------

X = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
Y = np.array([0, 0, 1])


def test_recall_callback_ks_larger_than_the_data():
    with pytest.raises(ValueError, match=r"`ks`.*3 samples.*2 others.*Received: ks=\(8,\)"):
        RecallAtK((X, Y), ks=(8,))
    RecallAtK((X, Y), ks=(1, 2))  # a query sees the 2 others


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ((X, None), "y=None"),
        ((X, np.array(["a", "b", "c"])), "`y`"),
        ((X, np.array([0.5, 1.0, 2.0])), "`y`"),
        ((X, np.zeros((3, 1, 2), "int32")), "y.shape"),
        ((X, np.array([[0, 1], [2, 0], [0, 1]])), "`y` must be multi-hot"),
        ((X, np.array([[0, 1], [0, 0], [0, 1]])), "empty label set"),
        ((X, Y[:2]), "len(y)=2"),
        (X, "`data`"),
    ],
)
def test_recall_callback_data_without_proper_labels(data, named):
    with pytest.raises(ValueError) as info:
        RecallAtK(data, ks=(1,))
    assert named in str(info.value)


def test_recall_callback_datasets_without_labels_or_end():
    import tensorflow as tf

    x = tf.data.Dataset.from_tensor_slices(X).batch(2)
    with pytest.raises(ValueError, match="no labels.*element_spec"):
        RecallAtK(x)
    endless = tf.data.Dataset.from_generator(
        lambda: iter(lambda: (X, Y), None),
        output_signature=(tf.TensorSpec((3, 4), tf.float32), tf.TensorSpec((3,), tf.int64)))
    with pytest.raises(ValueError, match=r"unknown cardinality.*`steps`"):
        RecallAtK(endless)
    with pytest.raises(ValueError, match="infinite.*`steps`"):
        RecallAtK(tf.data.Dataset.from_tensor_slices((X, Y)).batch(3).repeat())
    recall = RecallAtK(endless, ks=(1, 2), steps=2)  # two batches per evaluation
    embeddings, labels = _with_model(recall).embed()
    assert embeddings.shape == (6, 4) and labels.tolist() == [0, 0, 1, 0, 0, 1]
    with pytest.raises(ValueError, match="Received: steps=0"):
        RecallAtK(endless, steps=0)
    with pytest.raises(ValueError, match=r"`steps` is for a dataset.*Received: steps=2"):
        RecallAtK((X, Y), steps=2)


def _with_model(callback):
    callback.set_model(keras.Sequential([keras.Input((4,)), keras.layers.Identity()]))
    return callback


def test_recall_callback_checks_before_training_not_after_the_first_epoch():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    epochs = []
    with pytest.raises(ValueError, match="`ks`"):
        model.fit(X, np.zeros((3, 2)), epochs=1, verbose=0,
                  callbacks=[keras.callbacks.LambdaCallback(
                      on_epoch_end=lambda e, logs: epochs.append(e)),
                      RecallAtK((X, Y), ks=(8,))])
    assert epochs == []


# -- recall_at_k: ks ---------------------------------------------------------------------------


@pytest.mark.parametrize("ks", [(0,), (-1,), (1.5,), (True,), ("1",), (), None, (1, 2.0)])
def test_recall_at_k_ks_must_be_positive_integers(ks):
    with pytest.raises(ValueError, match=r"`ks` must be .*integers >= 1.*Received: ks="):
        tfdml.metrics.recall_at_k(X, Y, ks)


def test_recall_at_k_ks_larger_than_the_gallery():
    # Documented: a K beyond what a query sees would count every query with a same-class
    # item as a hit; it raises, naming `ks` and the gallery size.
    with pytest.raises(ValueError, match=r"`ks` asks for 3 neighbours.*offers 2.*ks=\(1, 3\)"):
        tfdml.metrics.recall_at_k(X, Y, (1, 3))
    with pytest.raises(ValueError, match="offers 3"):
        tfdml.metrics.recall_at_k(X[:1], Y[:1], (4,), gallery_embeddings=X, gallery_labels=Y)
    assert tfdml.metrics.recall_at_k(X, Y, 2) == {2: pytest.approx(2 / 3)}


# -- data set splits ---------------------------------------------------------------------------

IMAGES = np.zeros((3, 4, 4, 3), np.uint8)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"labels": [0.5, 1.0, 2.0], "images": IMAGES}, "`labels`"),  # was truncated to 0
        ({"labels": ["a", "b", "c"], "images": IMAGES}, "`labels`"),
        ({"labels": [True, False, True], "images": IMAGES}, "`labels`"),
        ({"labels": [0, np.nan, 1], "images": IMAGES}, "`labels`"),
        ({"labels": [1e20, 0, 1], "images": IMAGES}, "`labels`"),
        ({"labels": [0, 1], "images": IMAGES}, "`labels` must have shape [3]"),
        ({"labels": [[0], [1], [2]], "images": IMAGES}, "labels.shape"),
        ({"labels": [0], "images": np.zeros(())}, "`images`"),
        ({"labels": [0, 1], "paths": np.array([1, 2])}, "`paths`"),
        ({"labels": [0, 1], "encoded": np.array(["a", "b"], object)}, "`encoded`"),
        ({"labels": [0, 1, 2], "images": IMAGES, "bboxes": np.zeros((3, 3))}, "`bboxes`"),
        ({"labels": [0, 1, 2], "images": IMAGES, "bboxes": np.full((3, 4), np.nan)},
         "`bboxes`"),
        ({"labels": [0, 1, 2]}, "exactly one of"),
    ],
)
def test_dataset_split_checks_labels_and_items(kwargs, named):
    with pytest.raises(ValueError) as info:
        DatasetSplit(name="toy", split="train", **kwargs)
    assert named in str(info.value)


def test_dataset_split_keeps_valid_labels():
    split = DatasetSplit(name="toy", split="train", labels=np.array([0.0, 2.0, 7.0]),
                         paths=[os.path.join("a", "b.jpg"), "c.jpg", "d.jpg"])
    assert split.labels.dtype == np.int64 and split.labels.tolist() == [0, 2, 7]
    assert len(DatasetSplit(name="toy", split="t", labels=[], images=IMAGES[:0])) == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        (("digits", "train"), {"data_dir": "/data/digits"}, "data_dir"),  # was ignored
        (("digits", "train"), {"source": "tfds"}, "source='tfds'"),  # was ignored
        (("digits", "validation"), {}, "split"),
        (("digits", "train"), {"dtype": "int8"}, "dtype"),
        (("cub", "train"), {}, "name"),
        (("cub200", "train"), {"source": "web"}, "source"),
        (("cub200", "train"), {"label": "alphabet"}, "label"),
        (("cub200", "train"), {"data_dir": ""}, "data_dir"),
    ],
)
def test_dataset_load_names_the_bad_argument(args, kwargs, named):
    with pytest.raises(ValueError) as info:
        tfdml.datasets.load(*args, **kwargs)
    assert named in str(info.value)
