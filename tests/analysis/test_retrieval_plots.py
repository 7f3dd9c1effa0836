"""tfdml.analysis.retrieval: the worst queries, the figures, the HTML page, the projector files.

NumPy, matplotlib (Agg) and Pillow only: the results are built by hand as
``RetrievalResults`` of NumPy arrays.
"""

from __future__ import annotations

import base64
import html.parser
import io
import os
import warnings

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_hex

import tfdml
from tfdml.analysis._display import display
from tfdml.analysis._tiles import COLORS
from tfdml.search.results import RetrievalResults

matplotlib.use("Agg")

NAN = float("nan")


def _results(labels=True, ids=True):
    """3 queries, 3 neighbours; query 1 has a NaN score and an empty slot.

    Correct: query 0 slots 0 and 2, query 1 slot 0, query 2 slot 2.
    """
    indices = np.array([[4, 1, 2], [0, 3, -1], [5, 6, 7]], np.int64)
    scores = np.array([[0.9, 0.8, 0.7], [0.95, NAN, NAN], [0.5, 0.4, 0.3]], np.float32)
    return RetrievalResults(
        metric="cosine", scores=scores, indices=indices,
        labels=np.array([[0, 1, 0], [1, 0, -1], [0, 0, 2]], np.int64) if labels else None,
        ids=np.array([["g4", "g1", "g2"], ["g0", "<b>&", ""], ["g5", "g6", "g7"]]) if ids
        else None,
        query_labels=np.array([0, 1, 2], np.int64) if labels else None,
        query_ids=np.array(["q0", "q1", "q2"]) if ids else None,
    )


def _images(n, rgb=False, seed=0):
    rng = np.random.default_rng(seed)
    if rgb:
        return rng.uniform(0.0, 1.0, size=(n, 8, 8, 3))
    return rng.integers(0, 256, size=(n, 8, 8), dtype=np.uint8)


def _tile(fig, row, col, k=3):
    return fig.axes[row * (k + 1) + col]


def _frame(ax):
    return {to_hex(s.get_edgecolor()) for s in ax.spines.values()}


# -- worst_queries ------------------------------------------------------------------------------


def _ranked(rows):
    """Query label 1 for every row; ``T`` a neighbour of label 1, ``F`` of label 0, ``-`` empty."""
    labels = np.array([[{"T": 1, "F": 0, "-": -1}[c] for c in row] for row in rows], np.int64)
    indices = np.where(labels >= 0, np.arange(labels.size).reshape(labels.shape), -1)
    scores = np.where(labels >= 0, 0.5, NAN).astype(np.float32)
    return RetrievalResults("cosine", scores, indices, labels=labels,
                            query_labels=np.ones(len(rows), np.int64))


# AP over the retrieved list: 0.5, (1/3 + 2/4 + 3/5 + 4/6) / 4 = 0.525, 0, 1, 1, 0.5.
# First correct rank: 2, 3, none, 1, 1, 2.
WORST = _ranked(["FTFFFF", "FFTTTT", "FFFFFF", "TFFFF-", "TTFFFF", "FTFFFF"])


def test_worst_queries_by_average_precision_and_by_first_correct():
    assert WORST.correct.shape == (6, 6)
    got = tfdml.analysis.worst_queries(WORST, n=6)
    assert got.dtype == np.int64 and got.tolist() == [2, 0, 5, 1, 3, 4]
    assert tfdml.analysis.worst_queries(WORST, n=3).tolist() == [2, 0, 5]
    first = tfdml.analysis.worst_queries(WORST, n=6, by="first_correct")
    assert first.tolist() == [2, 1, 0, 5, 3, 4]
    assert tfdml.analysis.worst_queries(WORST, n=100).tolist() == got.tolist()


def test_worst_queries_needs_labels_and_valid_arguments():
    with pytest.raises(ValueError, match="needs the labels"):
        tfdml.analysis.worst_queries(_results(labels=False))
    with pytest.raises(ValueError, match="`by`"):
        tfdml.analysis.worst_queries(WORST, by="recall")
    with pytest.raises(ValueError, match="`n`"):
        tfdml.analysis.worst_queries(WORST, n=0)


def test_plot_worst_queries_titles_give_the_values():
    fig = tfdml.analysis.plot_worst_queries(WORST, n=2, k=2)
    titles = [fig.axes[r * 3].get_title(loc="left") for r in range(2)]
    assert titles == ["query 2: AP 0.000", "query 0: AP 0.500"]
    fig = tfdml.analysis.plot_worst_queries(WORST, n=3, by="first_correct")
    titles = [fig.axes[r * 6].get_title(loc="left") for r in range(3)]
    assert titles == ["query 2: no correct item in the top 6",
                      "query 1: first correct at rank 3", "query 0: first correct at rank 2"]
    fig = tfdml.analysis.plot_worst_queries(WORST, n=4, k=6)
    assert fig.axes[3 * 7].get_title(loc="left") == "query 1: AP 0.525"


# -- plot_retrieval -----------------------------------------------------------------------------


def test_plot_retrieval_frames_texts_and_images():
    results = _results()
    queries, gallery = _images(3, seed=1), _images(8, rgb=True, seed=2)
    fig = tfdml.analysis.plot_retrieval(results, queries, gallery, k=3)
    assert len(fig.axes) == 3 * 4
    expected = [["correct", "wrong", "correct"], ["correct", "wrong", None],
                ["wrong", "wrong", "correct"]]
    for r in range(3):
        assert _frame(_tile(fig, r, 0)) == {COLORS["query"]}
        assert _tile(fig, r, 0).get_title(loc="left") == f"query {r}"
        np.testing.assert_array_equal(_tile(fig, r, 0).images[0].get_array(), queries[r])
        for c, kind in enumerate(expected[r], start=1):
            ax = _tile(fig, r, c)
            if kind is None:  # the empty slot: blank
                assert not ax.axison and not ax.images and not ax.texts
                assert ax.get_xlabel() == ""
                continue
            assert _frame(ax) == {COLORS[kind]}
            mark = "\u2713" if kind == "correct" else "\u2717"
            assert ax.get_xlabel().startswith(mark + " ")
            position = results.indices[r, c - 1]
            np.testing.assert_array_equal(ax.images[0].get_array(), display(gallery[position]))
    assert _tile(fig, 0, 1).get_xlabel() == "\u2713 0.9\nlabel 0\nid g4"
    assert _tile(fig, 1, 2).get_xlabel() == "\u2717 nan\nlabel 0\nid <b>&"  # NaN is shown
    assert _tile(fig, 1, 0).get_xlabel() == "query 1\nlabel 1\nid q1"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing glyph (the marks) would warn
        fig.savefig(io.BytesIO(), format="png", dpi=40)


def test_plot_retrieval_without_labels_or_images():
    fig = tfdml.analysis.plot_retrieval(_results(labels=False), k=2, queries=[2, 0])
    assert len(fig.axes) == 2 * 3
    assert _tile(fig, 0, 0, k=2).get_title(loc="left") == "query 2"
    for r in range(2):
        for c in (1, 2):
            ax = _tile(fig, r, c, k=2)
            assert _frame(ax) == {COLORS["unknown"]} and not ax.images
            assert ax.get_xlabel().startswith("? ")
    assert [t.get_text() for t in _tile(fig, 0, 1, k=2).texts] == ["id g5"]
    fig = tfdml.analysis.plot_retrieval(_results(labels=True, ids=False))
    assert len(fig.axes) == 3 * 4  # the default k: min(results.k, 5)
    assert [t.get_text() for t in _tile(fig, 0, 1).texts] == ["label 0"]
    assert [t.get_text() for t in _tile(fig, 0, 0).texts] == ["label 0"]
    fig = tfdml.analysis.plot_retrieval(_results(labels=False, ids=False), k=1)
    assert [t.get_text() for t in _tile(fig, 0, 1, k=1).texts] == ["item 4"]
    dollars = _results(labels=False)
    dollars.ids[0, 0] = "$a_$"  # bad matplotlib math syntax: drawn as it is
    fig = tfdml.analysis.plot_retrieval(dollars, k=1, queries=[0])
    assert _tile(fig, 0, 1, k=1).get_xlabel() == "? 0.9\nid $a_$"
    fig.savefig(io.BytesIO(), format="png", dpi=30)


def test_display_scaling_of_images():
    grey = np.array([[0.0, 0.5], [1.0, 0.25]])
    np.testing.assert_array_equal(display(grey), [[0, 128], [255, 64]])  # [0, 1]: as it is
    np.testing.assert_array_equal(display(grey[..., None] * 10 - 5), [[0, 128], [255, 64]])
    np.testing.assert_array_equal(display(np.array([[2.0, np.nan]])), [[0, 0]])
    rgb = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    assert display(rgb) is rgb


def test_plot_retrieval_validates_its_arguments():
    results, plot = _results(), tfdml.analysis.plot_retrieval
    with pytest.raises(ValueError, match="query_images"):
        plot(results, query_images=_images(2))
    with pytest.raises(ValueError, match="gallery_images"):
        plot(results, gallery_images=_images(7))  # position 7 is used
    with pytest.raises(ValueError, match="query_images"):
        plot(results, query_images=np.zeros((3, 8, 8, 2)))
    with pytest.raises(ValueError, match="`queries`"):
        plot(results, queries=[0, 3])
    with pytest.raises(ValueError, match="`queries`"):
        plot(results, queries=[-1])
    for k in (0, 4):
        with pytest.raises(ValueError, match="`k`"):
            plot(results, k=k)
    with pytest.raises(ValueError, match="`results`"):
        plot({"indices": results.indices})


# -- retrieval_html -----------------------------------------------------------------------------


class _Page(html.parser.HTMLParser):
    """The parts of the page the tests look at."""

    def __init__(self):
        super().__init__()
        self.rows, self.images, self.cells, self.marks, self.tags = 0, [], [], [], []
        self.text, self._in_tbody, self._in_mark = [], False, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self._in_tbody |= tag == "tbody"
        if tag == "tr" and self._in_tbody:
            self.rows += 1
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "td":
            self.cells.append(attrs["class"].split()[1])
        self._in_mark = tag == "span" and attrs.get("class") == "mark"

    def handle_endtag(self, tag):
        self._in_mark = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_mark:
            self.marks.append(data)


def _parse(path):
    with open(path, encoding="ascii") as f:  # non-ASCII is written as references
        raw = f.read()
    page = _Page()
    page.feed(raw)
    return raw, page


def test_retrieval_html_rows_marks_images_and_escaping(tmp_path):
    from PIL import Image

    queries, gallery = _images(3, seed=1), _images(8, rgb=True, seed=2)
    path = str(tmp_path / "out" / "page.html")
    assert tfdml.analysis.retrieval_html(path, _results(), queries, gallery, k=3,
                                         title="A & B") == path
    raw, page = _parse(path)
    assert page.rows == 3 and len(page.images) == 3 + 8
    assert page.cells.count("query") == 3 and page.cells.count("empty") == 1
    assert page.cells.count("correct") == 4 and page.cells.count("wrong") == 4
    assert page.marks.count("\u2713 correct") == 4 and page.marks.count("\u2717 wrong") == 4
    assert "<b>&" not in raw and "b" not in page.tags  # the id is text, not markup
    assert "id <b>&" in page.text and "score nan" in page.text
    assert "<script" not in raw and "A &amp; B" in raw
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    first = Image.open(io.BytesIO(base64.b64decode(page.images[0].split(",", 1)[1])))
    np.testing.assert_array_equal(np.asarray(first), queries[0])
    neighbour = Image.open(io.BytesIO(base64.b64decode(page.images[1].split(",", 1)[1])))
    np.testing.assert_array_equal(np.asarray(neighbour), display(gallery[4]))
    assert os.listdir(tmp_path / "out") == ["page.html"]  # no temporary file left


def test_retrieval_html_without_labels_or_images(tmp_path):
    path = tmp_path / "page.html"
    tfdml.analysis.retrieval_html(path, _results(labels=False), queries=[1], k=2)
    _, page = _parse(path)
    assert page.rows == 1 and not page.images
    assert page.cells == ["query", "unknown", "unknown"]
    assert page.marks == ["query", "? unknown", "? unknown"]
    assert "id <b>&" in page.text
    with pytest.raises(ValueError, match="`k`"):
        tfdml.analysis.retrieval_html(path, _results(), k=9)


# -- projector_export ---------------------------------------------------------------------------


def _tensorboard_config(path):
    projector = pytest.importorskip("tensorboard.plugins.projector.projector_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    with open(path) as f:
        return text_format.Parse(f.read(), projector.ProjectorConfig())


def _read_tsv(path):
    """As TensorBoard reads a tensor file: floats split on tabs, then float32."""
    with open(path) as f:
        rows = [list(map(float, line.rstrip("\n").split("\t"))) for line in f if line.strip()]
    return np.array(rows, dtype="float32")


def test_projector_export_files(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    x[0] = [1 / 3, -0.0, 1e-30, 3.4e38]
    images = _images(5)
    logdir = str(tmp_path / "proj")
    paths = tfdml.analysis.projector_export(logdir, x, labels=[0, 1, 1, 2, 0],
                                            ids=["a", "b", "c", "d", "<e>"], images=images,
                                            name="emb")
    names = ["emb.tsv", "metadata.tsv", "sprite.png", "projector_config.pbtxt"]
    assert paths == [os.path.join(logdir, n) for n in names]
    assert sorted(os.listdir(logdir)) == sorted(names)  # no temporary file left
    read = _read_tsv(paths[0])
    assert read.tobytes() == x.tobytes()  # every float32 exactly, -0.0 included
    with open(paths[1]) as f:
        assert f.read() == "label\tid\n0\ta\n1\tb\n1\tc\n2\td\n0\t<e>\n"
    from PIL import Image

    sprite = np.asarray(Image.open(paths[2]))
    assert sprite.shape == (24, 24, 3)  # 3 x 3 thumbnails of 8 x 8
    np.testing.assert_array_equal(sprite[8:16, 8:16], np.repeat(images[4][..., None], 3, -1))
    np.testing.assert_array_equal(sprite[16:, :], 255)  # unused cells
    config = _tensorboard_config(paths[3])
    (embedding,) = config.embeddings
    assert embedding.tensor_name == "emb" and embedding.tensor_path == "emb.tsv"
    assert list(embedding.tensor_shape) == [5, 4]
    assert embedding.metadata_path == "metadata.tsv"
    assert embedding.sprite.image_path == "sprite.png"
    assert list(embedding.sprite.single_image_dim) == [8, 8]


def test_projector_export_metadata_columns_and_thumbnails(tmp_path):
    x = np.eye(3, dtype=np.float64)
    paths = tfdml.analysis.projector_export(tmp_path / "a", x, labels=np.array([3, 1, 2]))
    with open(paths[1]) as f:
        assert f.read() == "3\n1\n2\n"  # one column: no header
    paths = tfdml.analysis.projector_export(tmp_path / "b", x, ids=[b"x", "y", 7])
    with open(paths[1]) as f:
        assert f.read() == "x\ny\n7\n"
    paths = tfdml.analysis.projector_export(tmp_path / "c", x)
    assert [os.path.basename(p) for p in paths] == ["embeddings.tsv", "projector_config.pbtxt"]
    config = _tensorboard_config(paths[-1])
    assert config.embeddings[0].metadata_path == "" and not config.embeddings[0].HasField("sprite")

    rgb = _images(3, rgb=True)[:, :, :6]  # 8 high, 6 wide
    paths = tfdml.analysis.projector_export(tmp_path / "d", x, images=rgb, thumbnail_size=4)
    from PIL import Image

    assert np.asarray(Image.open(paths[1])).shape == (2 * 4, 2 * 3, 3)
    assert list(_tensorboard_config(paths[-1]).embeddings[0].sprite.single_image_dim) == [3, 4]
    tall = np.zeros((3, 9000, 2), np.uint8)  # 2 x 9000 does not fit: shrunk to 4096 high
    paths = tfdml.analysis.projector_export(tmp_path / "e", x, images=tall)
    with Image.open(paths[1]) as sprite:
        assert sprite.size == (2, 2 * 4096)


def test_projector_export_refuses_bad_inputs(tmp_path):
    export = tfdml.analysis.projector_export
    x = np.ones((4, 2), np.float32)
    bad = x.copy()
    bad[1, 0], bad[3, 1] = np.nan, np.inf
    with pytest.raises(ValueError, match=r"`embeddings`.*indices 1, 3"):
        export(tmp_path, bad)
    with pytest.raises(ValueError, match="`labels`"):
        export(tmp_path, x, labels=[1, 2, 3])
    with pytest.raises(ValueError, match="`ids`"):
        export(tmp_path, x, labels=[1, 2, 3, 4], ids=["a", "b\tc", "d", "e"])
    with pytest.raises(ValueError, match="`ids`"):
        export(tmp_path, x, ids=["a", "b\nc", "d", "e"])
    with pytest.raises(ValueError, match="`ids`.*blank"):
        export(tmp_path, x, ids=["a", "", "d", "e"])
    with pytest.raises(ValueError, match="`images`"):
        export(tmp_path, x, images=_images(3))
    with pytest.raises(ValueError, match="`thumbnail_size`"):
        export(tmp_path, x, images=_images(4), thumbnail_size=5000)
    with pytest.raises(ValueError, match="`name`"):
        export(tmp_path, x, name="a/b")
    with pytest.raises(ValueError, match="`embeddings`"):
        export(tmp_path, np.ones(3))
    assert os.listdir(tmp_path) == []  # nothing written by a refused export


def test_tensorboard_projector_plugin_serves_the_export(tmp_path):
    """TensorBoard's own projector plugin (its HTTP routes) reads what was written."""
    plugin_module = pytest.importorskip("tensorboard.plugins.projector.projector_plugin")
    base_plugin = pytest.importorskip("tensorboard.plugins.base_plugin")
    werkzeug_test = pytest.importorskip("werkzeug.test")
    x = np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32)
    tfdml.analysis.projector_export(tmp_path, x, ids=[f"i{j}" for j in range(10)],
                                    images=_images(10))

    class NoRuns:
        def list_runs(self, ctx, experiment_id):
            return []

    plugin = plugin_module.ProjectorPlugin(base_plugin.TBContext(logdir=str(tmp_path),
                                                                 data_provider=NoRuns()))
    apps = plugin.get_plugin_apps()

    def get(route, **query):
        environ = werkzeug_test.EnvironBuilder(path=route, query_string=query).get_environ()
        status = []
        body = b"".join(apps[route](environ, lambda s, h, e=None: status.append(s)))
        assert status == ["200 OK"], (route, body)
        return body

    assert get("/runs") == b'["."]'
    assert b'"singleImageDim"' in get("/info", run=".")
    tensor = get("/tensor", run=".", name="embeddings")
    assert np.frombuffer(tensor, np.float32).tobytes() == x.tobytes()
    assert get("/metadata", run=".", name="embeddings").decode().splitlines()[:2] == ["i0", "i1"]
    assert get("/sprite_image", run=".", name="embeddings")[:8] == b"\x89PNG\r\n\x1a\n"
