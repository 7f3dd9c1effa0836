"""tfdml._tensorflow: the TensorFlow shell says what to install when TensorFlow is missing.

Each check runs in a child process where ``import tensorflow`` fails
(``sys.modules["tensorflow"] = None``). The TensorFlow-only modules under another backend
are checked by ``tests/test_backends.py``, which imports the core without TensorFlow.
"""

import os
import subprocess
import sys

import pytest

from tfdml._install import TENSORFLOW_INSTALL

pytestmark = pytest.mark.slow  # fresh Python processes importing TensorFlow


def _child(code, backend):
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)


def test_default_tensorflow_backend_without_tensorflow_says_what_to_do():
    code = 'import sys; sys.modules["tensorflow"] = None; import tfdml'
    result = _child(code, "tensorflow")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), result.stderr[-2000:]
    assert 'pip install ".[cpu]"' in last and "KERAS_BACKEND=jax" in last, last


def test_tensorflow_module_under_jax_names_the_wheels():
    pytest.importorskip("jax")
    code = ('import sys; sys.modules["tensorflow"] = None\n'
            "import tfdml\n"
            "try:\n    tfdml.data.pk_batches\nexcept ImportError as err:\n    print(err)")
    result = _child(code, "jax")
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'pip install ".[cpu]"' in result.stdout, result.stdout
    assert TENSORFLOW_INSTALL in result.stdout, result.stdout


def test_get_preprocess_without_tensorflow_names_the_wheels():
    pytest.importorskip("jax")
    code = ('import sys; sys.modules["tensorflow"] = None\n'
            "import tfdml\n"
            "try:\n    tfdml.models.get_preprocess('resnet50')\n"
            "except ImportError as err:\n    print(type(err).__name__, err)")
    result = _child(code, "jax")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ImportError "), result.stdout
    assert "models.get_preprocess" in result.stdout and TENSORFLOW_INSTALL in result.stdout
