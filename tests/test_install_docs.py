"""What the README says about installing and the extras, and docs/models.md about saving and
loading models, holds."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import keras
import pytest

import tfdml

REPO = pathlib.Path(__file__).resolve().parents[1]


def _section(text, title):
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"no section {title!r}"
    return match.group(1)


def test_install_commands_work_from_a_clone():
    # tfdml is not on PyPI: `pip install "tfdml[cpu]"` cannot work.
    install = _section((REPO / "README.md").read_text(), "Install")
    commands = re.findall(r"^pip install .*$", install, re.M)
    assert commands, install
    for command in commands:
        assert re.match(r'pip install (-e )?"?\.(\[[a-z,]+\])?"?(\s|$)', command), command
    assert 'pip install ".[cpu]"' in install and "clone of the repository" in install


def test_tensorboard_extra_and_where_tensorboard_is_named():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(r.startswith("tensorboard>=") for r in extras["tensorboard"])
    assert any(r.startswith("tensorboard>=") for r in extras["dev"])
    # keras.callbacks.TensorBoard fails without the package (TensorFlow 2.21 does not
    # install it): wherever the docs name it, they say so.
    for doc in ("README.md", "docs/metrics.md"):
        paragraphs = [p for p in (REPO / doc).read_text().split("\n\n") if "TensorBoard" in p]
        assert paragraphs, doc
        for paragraph in paragraphs:
            assert "`tensorboard`" in paragraph, (doc, paragraph)


def test_losses_are_not_looked_up_by_name():
    # What docs/models.md's "Saving and loading models" says: pass the loss object.
    with pytest.raises(ValueError, match="TripletNCALoss"):
        keras.losses.get("TripletNCALoss")
    saving = _section((REPO / "docs" / "models.md").read_text() + "\n## ",
                      "Saving and loading models")
    assert "import tfdml" in saving and "load_model" in saving
    assert saving.index("import tfdml") < saving.index("load_model(")


@pytest.mark.slow  # a fresh Python process importing TensorFlow
def test_load_model_needs_import_tfdml_first(tmp_path):
    inputs = keras.Input((4,))
    outputs = tfdml.layers.L2Normalization()(keras.layers.Dense(3)(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss=tfdml.losses.TripletNCALoss(order=2))
    path = tmp_path / "embedder.keras"
    model.save(path)
    script = textwrap.dedent(f"""
        import keras
        try:
            keras.models.load_model({str(path)!r})
        except Exception as error:
            print("without tfdml:", type(error).__name__)
        import tfdml
        model = keras.models.load_model({str(path)!r})
        print("with tfdml:", type(model.loss).__name__)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "without tfdml: TypeError" in proc.stdout
    assert "with tfdml: TripletNCALoss" in proc.stdout
