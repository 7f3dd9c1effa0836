"""The quick start and the digits example scripts under JAX and PyTorch, with TensorFlow absent.

Each backend runs in a child process where ``import tensorflow`` fails
(``sys.modules["tensorflow"] = None``), as where TensorFlow is not installed:

* the README's quick start: its glyph block on 100 generated characters for 3 steps, then
  its CUB-200 block on a tiny fake CUB-200-2011 (JPEG files written with Pillow), with
  small sizes, a tiny network in place of ResNet-50 and one short epoch;
* `examples/digits_demo.py`, `examples/digits_losses.py` and
  `examples/class_collapse/digits_even_odd.py`, with fewer epochs and steps (the first two
  print the raw-pixel baseline next to the untrained and trained networks).
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # runs an example script

REPO = pathlib.Path(__file__).resolve().parents[2]


def quick_start_blocks():
    """The README's quick start: the glyph block (no download), then the CUB-200 block."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Quick start"):readme.index("## The demo")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the README's quick start should have two Python blocks"
    return blocks


def _replace(code, replacements):
    for old, new in replacements:
        assert old in code, f"the README's quick start no longer has {old!r}"
        code = code.replace(old, new)
    return code


def _shrunk_quick_start(cub_dir):
    """The quick start with sizes a test can afford; fails if the README changed shape."""
    glyphs, cub = quick_start_blocks()
    assert len(glyphs.strip().splitlines()) <= 25  # copy-and-run: under 25 lines
    glyphs = _replace(glyphs, [
        ('load("glyphs", "train", dtype="float32")',
         'load("glyphs", "train", dtype="float32", num_classes=100, samples_per_class=8)'),
        ('load("glyphs", "test", dtype="float32")',
         'load("glyphs", "test", dtype="float32", num_classes=100, samples_per_class=8)'),
        ("classes_per_batch=16, samples_per_class=4", "classes_per_batch=4, samples_per_class=4"),
        ("epochs=10, steps_per_epoch=100", "epochs=1, steps_per_epoch=3"),
    ])
    cub = _replace(cub, [
        ('"~/data/CUB_200_2011"', repr(str(cub_dir))),
        ("train_transform(224, 256,", "train_transform(32, 36,"),
        ("eval_transform(224, 256,", "eval_transform(32, 36,"),
        ("PKDataset(train, 16, 8,", "PKDataset(train, 3, 2,"),
        # a tiny network: ResNets take minutes on 2 CPU cores (their build under every
        # backend is tested in test_models.py)
        ('tfdml.models.build_embedding_model("resnet50", embedding_dim=512)',
         'keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3, strides=4), '
         'keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(8), '
         'tfdml.layers.L2Normalization()])'),
        ("epochs=40, steps_per_epoch=100", "epochs=1, steps_per_epoch=2"),
        ("EvalDataset(test, 128,", "EvalDataset(test, 4,"),
    ])
    return glyphs + "\nprint('glyph quick start ok')\n" + cub


CHILD = textwrap.dedent("""
    import os, sys
    sys.modules["tensorflow"] = None  # as if TensorFlow were not installed
    import numpy as np
    from PIL import Image

    cub = os.path.join(sys.argv[1], "CUB_200_2011")
    rng = np.random.default_rng(0)
    images, labels, names = [], [], []
    for c in (1, 2, 3, 101, 102, 103):
        folder = f"{c:03d}.Bird_{c}"
        names.append(f"{c} {folder}")
        os.makedirs(os.path.join(cub, "images", folder), exist_ok=True)
        for k in range(4):
            rel = f"{folder}/{k}.jpg"
            size = (40 + 3 * k, 50 - 2 * k, 3)  # files of several sizes
            Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)).save(
                os.path.join(cub, "images", rel))
            images.append(f"{len(images) + 1} {rel}")
            labels.append(f"{len(labels) + 1} {c}")
    for name, lines in (("images", images), ("image_class_labels", labels), ("classes", names)):
        with open(os.path.join(cub, name + ".txt"), "w") as f:
            f.write("\\n".join(lines) + "\\n")

    exec(compile(sys.argv[2], "README quick start", "exec"))
    assert embeddings.shape == (12, 8) and set(recalls) == {1, 2, 4, 8}
    print("quick start ok", keras.backend.backend(), "tensorflow" in sys.modules and
          sys.modules["tensorflow"] is not None)

    import runpy
    for script, args in (("examples/digits_demo.py", ["--epochs", "2", "--steps-per-epoch", "5"]),
                         ("examples/digits_losses.py",
                          ["--epochs", "1", "--steps-per-epoch", "3"]),
                         ("examples/class_collapse/digits_even_odd.py",
                          ["--quick", "--no-plots"])):
        sys.argv = [script, *args]
        runpy.run_path(script, run_name="__main__")
        print("script ok", script)
""")


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_quick_start_and_demo_scripts_without_tensorflow(backend, tmp_path):
    pytest.importorskip(backend)
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.pop("XLA_FLAGS", None)
    code = _shrunk_quick_start(tmp_path / "CUB_200_2011")
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), code], env=env,
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    out = result.stdout
    assert f"quick start ok {backend} False" in out, out
    assert "glyph quick start ok" in out and "trained    " in out, out
    for script in ("digits_demo.py", "digits_losses.py", "digits_even_odd.py"):
        assert "script ok examples/" in out and script in out, out
    assert "Recall@1" in out and "| TripletNCALoss(order=2), EPHN |" in out, out
    assert "raw pixels       R@1" in out and "| raw pixels |" in out, out
