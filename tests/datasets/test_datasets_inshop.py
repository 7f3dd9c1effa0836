"""In-shop Clothes Retrieval reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

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
