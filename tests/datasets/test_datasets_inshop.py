"""In-shop Clothes Retrieval reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdml
import tfdml.datasets as D

JPEG = tf.io.encode_jpeg(np.zeros((4, 4, 3), np.uint8)).numpy()
ROWS = [
    ("img/WOMEN/Dresses/id_00000002/02_1_front.jpg", "id_00000002", "train"),
    ("img/WOMEN/Dresses/id_00000002/02_2_side.jpg", "id_00000002", "train"),
    ("img/MEN/Denim/id_00000080/01_1_front.jpg", "id_00000080", "query"),
    ("img/MEN/Denim/id_00000080/01_2_side.jpg", "id_00000080", "gallery"),
    ("img/MEN/Denim/id_00000080/01_3_back.jpg", "id_00000080", "gallery"),
    ("img/WOMEN/Tees/id_00007982/01_1_front.jpg", "id_00007982", "query"),
    ("img/WOMEN/Tees/id_00007982/01_2_side.jpg", "id_00007982", "gallery"),
]


def make_inshop(root, image_dir="Img", rows=ROWS):
    os.makedirs(root / "Eval")
    lines = [str(len(rows)), "image_name item_id evaluation_status"]
    for name, item, status in rows:
        path = root / image_dir / name
        os.makedirs(path.parent, exist_ok=True)
        path.write_bytes(JPEG)
        lines.append(f"{name} {item} {status}")
    (root / "Eval" / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("image_dir", ["Img", "."])
def test_query_gallery_share_item_ids(tmp_path, image_dir, caplog):
    root = make_inshop(tmp_path, image_dir)
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        train = D.load("inshop", "train", data_dir=root)
        query = D.load("inshop", "query", data_dir=root)
        gallery = D.load("inshop", "gallery", data_dir=root)
    assert train.class_counts() == {2: 2}
    assert query.class_counts() == {80: 1, 7982: 1}
    assert gallery.class_counts() == {80: 2, 7982: 1}
    assert set(query.labels) == set(gallery.labels)
    assert query.class_names == {80: "id_00000080", 7982: "id_00007982"}
    assert all(os.path.isfile(p) for p in np.concatenate([query.paths, gallery.paths]))
    assert "14218" in caplog.text and "12612" in caplog.text


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"list_eval_partition\.txt.*DeepFashion"):
        D.load_inshop(tmp_path, "query")
    root = make_inshop(tmp_path)
    part = root / "Eval" / "list_eval_partition.txt"
    text = part.read_text()
    part.write_text(text.replace("query", "test", 1))
    with pytest.raises(ValueError, match="evaluation_status.*'test'"):
        D.load_inshop(root, "query")
    part.write_text(text.replace("7\n", "9\n", 1))
    with pytest.raises(ValueError, match="announces 9"):
        D.load_inshop(root, "query")
    part.write_text(text.replace("image_name", "name", 1))
    with pytest.raises(ValueError, match="line 2"):
        D.load_inshop(root, "query")
    part.write_text(text)
    os.remove(root / "Img" / ROWS[-1][0])
    with pytest.raises(FileNotFoundError, match="01_2_side.jpg"):
        D.load_inshop(root, "gallery")
    with pytest.raises(ValueError, match="split.*'test'"):
        D.load_inshop(root, "test")


def test_bounding_boxes_when_annotation_present(tmp_path):
    root = make_inshop(tmp_path)
    assert D.load_inshop(root, "query").bboxes is None
    os.makedirs(root / "Anno")
    lines = [str(len(ROWS)), "image_name clothes_type pose_type x_1 y_1 x_2 y_2"]
    lines += [
        f"{name} 1 1 {i} {2 * i} {i + 50} {2 * i + 60}" for i, (name, _, _) in enumerate(ROWS)
    ]
    (root / "Anno" / "list_bbox_inshop.txt").write_text("\n".join(lines) + "\n")
    query = D.load_inshop(root, "query")
    # ROWS[2] is the first query image: x_1=2, y_1=4, x_2=52, y_2=64 -> (ymin, xmin, ymax, xmax)
    np.testing.assert_allclose(query.bboxes[0], [4.0, 2.0, 64.0, 52.0])
    assert query.bboxes.shape == (2, 4)
    (root / "Anno" / "list_bbox_inshop.txt").write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(ValueError, match="no box for img/MEN/Denim"):
        D.load_inshop(root, "query")


def test_garment_types_are_the_categories(tmp_path):
    root = make_inshop(tmp_path)
    names = {1: "MEN/Denim", 2: "WOMEN/Dresses", 3: "WOMEN/Tees"}
    splits = {s: D.load_inshop(root, s) for s in ("train", "query", "gallery")}
    for split in splits.values():  # numbered over the whole list: alike in every split
        assert split.category_names == names
    assert splits["train"].categories == {2: 2}
    assert splits["query"].categories == splits["gallery"].categories == {80: 1, 7982: 3}


def test_an_item_under_two_types_takes_the_most_common_and_odd_paths_give_none(tmp_path):
    rows = ROWS + [("img/MEN/Tees/id_00000080/01_4_full.jpg", "id_00000080", "gallery"),
                   ("img/WOMEN/Tees/id_00000080/01_5_full.jpg", "id_00000080", "gallery")]
    root = make_inshop(tmp_path / "two", rows=rows)
    gallery = D.load_inshop(root, "gallery")
    assert gallery.category_names == {1: "MEN/Denim", 2: "MEN/Tees", 3: "WOMEN/Dresses",
                                      4: "WOMEN/Tees"}
    assert gallery.categories == {80: 1, 7982: 4}  # 3 images under MEN/Denim
    flat = [(name.replace("img/WOMEN/Tees/", "img/"), item, status)
            for name, item, status in ROWS]
    plain = D.load_inshop(make_inshop(tmp_path / "flat", rows=flat), "query")
    assert plain.categories is None and plain.category_names == {}


def test_categories_feed_the_sampler(tmp_path):
    kinds = ("MEN/Denim", "MEN/Tees", "WOMEN/Dresses")
    rows = [(f"img/{kinds[item % 3]}/id_{item:08d}/0{i}_front.jpg", f"id_{item:08d}", "train")
            for item in range(1, 10) for i in range(2)]
    train = D.load_inshop(make_inshop(tmp_path, rows=rows), "train")
    assert len(set(train.categories.values())) == 3
    batches = tfdml.data.pk_batches(train, 3, 2, seed=0, categories_per_batch=2,
                                    map_fn=lambda image: tf.image.resize(image, (2, 2)))
    for _, y in batches.take(3):
        classes = y.numpy()[::2]
        assert len(set(classes.tolist())) == 3
        assert len({train.categories[int(c)] for c in classes}) == 2
