"""Readers -> P x K sampler -> augmentation -> a tfdml loss, end to end on generated files."""

import numpy as np
import tensorflow as tf
from test_datasets_cub import make_cub

import tfdml


def test_cub_layout_to_pk_batches_with_boxes_and_augmentation(tmp_path):
    # Train classes 1, 2, 3, 50 (3 is a singleton: no positive, skipped); test class 150.
    base = make_cub(tmp_path, classes={1: 3, 2: 2, 3: 1, 50: 4, 150: 2})
    train = tfdml.datasets.load("cub200", "train", data_dir=base)
    batches = tfdml.data.pk_batches(
        train, classes_per_batch=2, samples_per_class=3, seed=0, crop_to_bbox=True,
        map_fn=tfdml.data.augment.train_transform(8, 10, preprocess="resnet50"),
    )
    seen = set()
    for images, labels in batches.take(6):
        assert images.shape == (6, 8, 8, 3) and images.dtype == tf.float32
        ids, counts = np.unique(labels.numpy(), return_counts=True)
        assert len(ids) == 2 and set(counts) == {3}
        seen.update(ids.tolist())
        loss = tfdml.losses.TripletNCALoss(order=2)(labels, tf.reshape(images, [6, -1]))
        assert np.isfinite(loss.numpy())
    assert seen == {1, 2, 50}


def test_digits_reader_feeds_the_sampler_in_memory():
    train = tfdml.datasets.load("digits", "train", dtype="float32")
    images, labels = next(iter(tfdml.data.pk_batches(train, 6, 4, seed=3)))
    assert images.shape == (24, 8, 8, 1) and images.dtype == tf.float32
    assert sorted(np.unique(labels.numpy()).tolist()) == [0, 1, 2, 3, 4, 5]


def test_grayscale_digits_through_a_resnet_transform_train_and_eval():
    # 8 x 8 x 1 digits and a 3-channel ImageNet normalization: converted to RGB, not a
    # broadcasting error deep inside tf.data.
    train = tfdml.datasets.load("digits", "train")
    fn = tfdml.data.augment.train_transform(32, 36, preprocess="resnet50")
    images, labels = next(iter(tfdml.data.pk_batches(train, 4, 2, seed=0, map_fn=fn)))
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
    rgb, _ = next(iter(tfdml.data.pk_batches(train, 4, 2, seed=0, channels=3, map_fn=fn)))
    np.testing.assert_allclose(images, rgb, atol=1e-4)  # the same as converting first
    loss = tfdml.losses.TripletNCALoss(order=2)(labels, tf.reshape(images, [8, -1]))
    assert np.isfinite(loss.numpy())
    test = tfdml.datasets.load("digits", "test")
    evaluate = tfdml.data.augment.eval_transform(32, 36, preprocess="resnet50")
    images, _ = next(iter(tfdml.data.eval_batches(test, 16, map_fn=evaluate)))
    assert images.shape == (16, 32, 32, 3)
