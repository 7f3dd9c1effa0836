"""tfdml.data.PKDataset / EvalDataset (keras.utils.PyDataset, every backend): the batches
of pk_batches (numpy_augment: test_numpy_augment.py).

The comparisons with the tf.data pipeline run under TensorFlow; the training and error
tests under every backend.
"""

import io
import logging

import keras
import numpy as np
import pytest
from backends import BACKEND

import tfdml
from tfdml.data import numpy_augment

RNG = np.random.default_rng(7)
IMAGES = RNG.integers(0, 256, size=(40, 6, 5, 3), dtype=np.uint8)
LABELS = np.repeat(np.arange(10), 4)
tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="compares with tf.data")


def _png_bytes(array):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array.squeeze(-1) if array.shape[-1] == 1 else array).save(buffer, "PNG")
    return buffer.getvalue()


def _write_pngs(folder, images):
    paths = []
    for i, image in enumerate(images):
        path = folder / f"{i}.png"
        path.write_bytes(_png_bytes(image))
        paths.append(str(path))
    return paths


# -- the batches of pk_batches --------------------------------------------------------------


@tensorflow_only
@pytest.mark.parametrize("repeat", [True, False])
@pytest.mark.parametrize("channels", [None, 1])
def test_in_memory_batches_equal_pk_batches(repeat, channels):
    kwargs = dict(seed=3, repeat=repeat, channels=channels, small_classes="replace")
    tf_batches = tfdml.data.pk_batches((IMAGES, LABELS), 3, 2, **kwargs)
    py_batches = tfdml.data.PKDataset((IMAGES, LABELS), 3, 2, **kwargs)
    if repeat:
        stream = iter(tf_batches)
        pairs = [(next(stream), py_batches[i]) for i in range(9)]  # 2 sampler epochs and more
    else:
        pairs = []
        for _ in range(3):
            py_batches.on_epoch_begin()  # what Keras calls around each epoch
            pairs += [(tf_batch, py_batches[i]) for i, tf_batch in enumerate(tf_batches)]
            py_batches.on_epoch_end()
        assert py_batches.epoch == 3 and len(pairs) == 3 * len(py_batches)
    for (tf_x, tf_y), (x, y) in pairs:
        assert y.dtype == np.int64 and x.dtype == np.uint8
        np.testing.assert_array_equal(y, tf_y.numpy())
        # RGB to grayscale: the same weights as tf.image.rgb_to_grayscale, rounding may differ
        np.testing.assert_allclose(x.astype(int), tf_x.numpy().astype(int), atol=1)


@tensorflow_only
def test_files_and_encoded_images_equal_pk_batches(tmp_path):
    paths = _write_pngs(tmp_path, IMAGES)
    boxes = RNG.uniform(0, 3, size=(40, 4)).astype(np.float32) + [0, 0, 3, 2]
    split = tfdml.data.DatasetSplit("toy", "train", LABELS, paths=np.array(paths), bboxes=boxes)
    encoded = tfdml.data.DatasetSplit("toy", "train", LABELS,
                                      encoded=np.array([_png_bytes(i) for i in IMAGES], object))
    for source, crop in ((split, False), (split, True), (encoded, False)):
        tf_batches = iter(tfdml.data.pk_batches(source, 2, 3, seed=1, crop_to_bbox=crop))
        py_batches = tfdml.data.PKDataset(source, 2, 3, seed=1, crop_to_bbox=crop,
                                          map_fn=(lambda im: numpy_augment.resize(im, 4))
                                          if crop else None)
        for i in range(4):
            tf_x, tf_y = next(tf_batches) if not crop else (None, None)
            x, y = py_batches[i]
            if crop:  # pk_batches would need a map_fn; compare with the crops done by hand
                idx = py_batches.sampler.iter_batches(0)
                for _ in range(i):
                    next(idx)
                want = [numpy_augment.resize(numpy_augment.crop_to_bbox(IMAGES[j], boxes[j]), 4)
                        for j in next(idx)[0]]
                np.testing.assert_allclose(x, np.stack(want), rtol=1e-6)
                continue
            np.testing.assert_array_equal(y, tf_y.numpy())
            np.testing.assert_array_equal(x, tf_x.numpy())


# -- training under every backend -----------------------------------------------------------


def _model():
    model = keras.Sequential([keras.Input((6, 5, 3)), keras.layers.Flatten(),
                              keras.layers.Rescaling(1 / 255), keras.layers.Dense(4)])
    model.compile("sgd", tfdml.losses.TripletNCALoss(order=2))
    return model


class _Recorded(tfdml.data.PKDataset):
    """Remembers the labels of each batch it gives, with the epoch it gave it in."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.given = []

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        self.given.append((self.epoch, index, y))
        return x, y


@pytest.mark.multibackend
def test_fit_draws_each_sampler_epoch_once():
    batches = _Recorded((IMAGES, LABELS), 3, 2, seed=5, repeat=False, steps_per_epoch=2)
    history = _model().fit(batches, epochs=3, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 3 and np.isfinite(history.history["loss"]).all()
    trained = batches.given[-6:]  # Keras may read a batch before training
    assert [(e, i) for e, i, _ in trained] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    for epoch, index, labels in trained:
        want = batches.sampler.epoch_batches(epoch)[index]
        np.testing.assert_array_equal(labels, LABELS[want])


@pytest.mark.multibackend
def test_endless_stream_continues_across_epochs():
    batches = _Recorded((IMAGES, LABELS), 3, 2, seed=5)
    _model().fit(batches, epochs=2, steps_per_epoch=4, verbose=0,
                 shuffle=tfdml.data.fit_shuffle(batches))
    indices = [i for _, i, _ in batches.given]
    start = len(indices) - 1 - indices[::-1].index(0)  # Keras may read a batch first
    trained = batches.given[start:]  # and read ahead of the steps
    assert [i for _, i, _ in trained] == list(range(len(trained))) and len(trained) >= 8
    stream = batches.sampler.iter_batches(0)
    for (_, _, labels) in trained:
        np.testing.assert_array_equal(labels, LABELS[next(stream)[0]])
    with pytest.raises(TypeError, match="steps_per_epoch"):
        len(batches)


def test_a_pickled_copy_gives_the_same_batches():
    # use_multiprocessing=True with spawned workers pickles the dataset
    import pickle

    for repeat in (True, False):
        batches = tfdml.data.PKDataset((IMAGES, LABELS), 3, 2, seed=9, repeat=repeat,
                                       steps_per_epoch=3)
        batches[2]
        copy = pickle.loads(pickle.dumps(batches))
        for i in range(3):
            np.testing.assert_array_equal(copy[i][1], batches[i][1])
            np.testing.assert_array_equal(copy[i][0], batches[i][0])


@pytest.mark.multibackend
def test_eval_dataset_gives_every_example_in_order(tmp_path):
    paths = _write_pngs(tmp_path, IMAGES[:7])
    for source in ((IMAGES[:7], LABELS[:7]), (paths, LABELS[:7])):
        data = tfdml.data.EvalDataset(source, 3, workers=2)
        assert len(data) == 3 and [len(data[i][1]) for i in range(3)] == [3, 3, 1]
        np.testing.assert_array_equal(np.concatenate([data[i][0] for i in range(3)]), IMAGES[:7])
        embeddings = _model().predict(data, verbose=0)
        assert embeddings.shape == (7, 4)
    with pytest.raises(IndexError, match="index"):
        data[3]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.multibackend
def test_bad_sources_raise_naming_source(tmp_path, caplog):
    cases = [
        (([], []), "at least one example"),
        ((np.zeros((0, 4)), np.zeros(0, int)), "at least one example"),
        (([np.zeros((4, 4)), np.zeros((5, 4))], [0, 0]), "different shapes"),
        ((IMAGES, LABELS[:-1]), "same length"),
        ((["a", 1], [0, 0]), "file paths"),
        ((IMAGES, 3), "array of class ids"),
        ("images", "DatasetSplit"),
    ]
    for source, message in cases:
        with pytest.raises(ValueError, match=message):
            tfdml.data.PKDataset(source, 2, 2)
    with pytest.raises(ValueError, match="labels"):
        tfdml.data.PKDataset((IMAGES, LABELS.astype(str)), 2, 2)
    with pytest.raises(ValueError, match="map_fn"):
        tfdml.data.PKDataset((IMAGES, LABELS), 2, 2, map_fn="resize")
    with pytest.raises(ValueError, match="crop_to_bbox"):
        tfdml.data.PKDataset((IMAGES, LABELS), 2, 2, crop_to_bbox=True)
    with pytest.raises(ValueError, match="channels"):
        tfdml.data.PKDataset((IMAGES, LABELS), 2, 2, channels=2)
    with pytest.raises(ValueError, match="initial_epoch"):
        tfdml.data.PKDataset((IMAGES, LABELS), 2, 2, initial_epoch=-1)
    with pytest.raises(ValueError, match="samples_per_class"):
        tfdml.data.PKDataset((IMAGES, LABELS), 2, 1)
    with pytest.raises(ValueError, match="batch_size"):
        tfdml.data.EvalDataset((IMAGES, LABELS), 0)
    with pytest.raises(IndexError, match="index"):
        tfdml.data.PKDataset((IMAGES, LABELS), 2, 2, repeat=False)[99]


@pytest.mark.multibackend
def test_bad_files_name_the_file_and_sizes_need_a_map_fn(tmp_path):
    paths = _write_pngs(tmp_path, [np.zeros((4 + i % 2, 4, 3), np.uint8) for i in range(8)])
    labels = np.repeat(np.arange(4), 2)
    with pytest.raises(ValueError, match="different shapes.*map_fn"):
        tfdml.data.PKDataset((paths, labels), 4, 2, seed=0)[0]
    resized = tfdml.data.PKDataset((paths, labels), 4, 2, seed=0,
                                   map_fn=numpy_augment.eval_transform(3, 4))
    assert resized[0][0].shape == (8, 3, 3, 3)
    (tmp_path / "0.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="0.png"):
        tfdml.data.PKDataset((paths, labels), 4, 2, seed=0,
                             map_fn=numpy_augment.eval_transform(3, 4))[0]


@tensorflow_only
def test_pk_batches_bad_sources_raise_naming_source(tmp_path):
    import tensorflow as tf

    for source, message in ((([], []), "at least one example"),
                            (([np.zeros((4, 4)), np.zeros((5, 4))], [0, 0]), "different shapes")):
        with pytest.raises(ValueError, match=message):
            tfdml.data.pk_batches(source, 2, 2)
    paths = _write_pngs(tmp_path, [np.zeros((4 + i % 2, 4, 3), np.uint8) for i in range(8)])
    batches = tfdml.data.pk_batches((paths, np.repeat(np.arange(4), 2)), 4, 2, seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="another shape.*map_fn"):
        next(iter(batches))


def test_small_classes_are_logged_as_by_pk_batches(caplog):
    labels = np.array([0, 0, 1, 1, 2, 3, 3])
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        batches = tfdml.data.PKDataset((np.zeros((7, 2)), labels), 2, 2, seed=0, repeat=False)
    assert "skipped 1 class" in caplog.text and batches.sampler.num_classes == 3


@pytest.mark.multibackend
def test_recall_callback_takes_a_py_dataset():
    model = _model()
    x, y = IMAGES.astype("float32"), LABELS
    ks = (1, 2)
    want = tfdml.callbacks.RecallAtK((x, y), ks=ks, verbose=0)
    got = tfdml.callbacks.RecallAtK(tfdml.data.EvalDataset((x, y), 7), ks=ks, verbose=0)
    for callback in (want, got):
        callback.set_model(model)
    np.testing.assert_array_equal(got.embed()[1], y)
    # batches of 7 against one batch of 40: float32 matmuls may round differently
    np.testing.assert_allclose(got.embed()[0], want.embed()[0], rtol=1e-6, atol=1e-6)
    endless = tfdml.data.PKDataset((x, y), 3, 2, seed=0)
    with pytest.raises(ValueError, match="steps"):
        tfdml.callbacks.RecallAtK(endless, ks=ks)
    some = tfdml.callbacks.RecallAtK(endless, ks=ks, steps=2, verbose=0)
    some.set_model(model)
    assert some.embed()[0].shape == (12, 4)
    with pytest.raises(ValueError, match="steps"):
        tfdml.callbacks.RecallAtK((x, y), ks=ks, steps=2)
