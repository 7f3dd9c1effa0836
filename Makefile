# Each target creates (or reuses) a virtual environment in .venv and installs
# what it needs. TF selects the TensorFlow distribution: `make test TF=tensorflow`
# for the full wheel (GPU builds), tensorflow-cpu by default.
PYTHON ?= python3
TF ?= cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TF)

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONHASHSEED ?= 0

.PHONY: demo test test-backend test-slow lint docs bench bench-retrieval bench-pipeline venv clean

venv: $(STAMP)

# keras-hub (the `hub` extra: ViT, DINOv2, CLIP, SigLIP backbones, tests/test_models_hub.py)
# without its declared dependencies, which pull the full tensorflow wheel and tensorflow-text:
# importing keras_hub and building its vision backbones needs absl-py, packaging, regex, rich
# and tokenizers (keras-hub 0.32 imports it at import time), and downloading a preset from
# Kaggle kagglehub; not tensorflow-text nor sentencepiece (text models only).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,$(TF)]"
	$(BIN)/python -m pip install --quiet --no-deps "keras-hub==0.32.0"
	$(BIN)/python -m pip install --quiet absl-py kagglehub packaging regex rich tokenizers
	rm -f $(VENV)/.installed-* $(BACKENDS_STAMP)
	touch $(STAMP)

# The glyph demo: raw pixels, the untrained network and the trained embedding on 400 unseen
# characters (about 1.5 minutes on 2 cores; each backend's numbers in docs/experiments.md).
demo: $(STAMP)
	$(BIN)/python examples/glyphs/demo.py

# The other Keras backends for the multi-backend tests: JAX (CPU) and PyTorch 2.13 (the
# CPU wheel where the machine provides it; PyPI's default torch build is a CUDA one). It
# builds on $(STAMP), so keras-hub is there for the keras-hub tests marked `multibackend`.
BACKENDS_STAMP := $(VENV)/.backends-installed
JAX ?= jax[cpu]>=0.4.30
TORCH ?= torch==2.13.0

$(BACKENDS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet "$(JAX)" "$(TORCH)"
	touch $(BACKENDS_STAMP)

# Two tiers, each run whole: no test is left to chance or to a later commit.
#
# `make test` (CI, every commit; MEASURED below) is the fast tier: every test not marked
# `slow` under TensorFlow, then under JAX and under PyTorch the fixed set marked `core`
# (tests/conftest.py CORE: every loss configuration against the float64 record, eager and
# compiled; every miner, op, distance and retrieval metric against its reference). Test
# files go to the worker processes (pytest-xdist, one per CPU, at most 4) whole
# (`--dist loadfile`), so a file's compiled functions and fixtures are made once.
#
# `make test-slow` is the slow tier, run before an issue is resolved: the tests marked
# `slow` (example scripts, subprocesses, real training) under TensorFlow, and the other
# backend-generic tests (marked `multibackend`, not `core`) under JAX and PyTorch.
#
# Measured on 2 cores, `bash .ci/run` from a fresh clone (install, lint and docs included):
# 759 s. TensorFlow 463 s (4,102 tests), JAX 154 s (424), PyTorch 25 s (424), the rest
# (install, `make lint`, `make docs`) about 2 minutes. Still about 40 s over the 12-minute
# aim. A parametrized check keeps one configuration per code path in the fast tier and the
# others in the slow one (tests/support/harness.py: slow_beyond).
PYTEST := $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

test: $(STAMP) $(BACKENDS_STAMP)
	$(PYTEST)
	KERAS_BACKEND=jax $(PYTEST) -m "core and not slow"
	KERAS_BACKEND=torch $(PYTEST) -m "core and not slow"

test-slow: $(STAMP) $(BACKENDS_STAMP)
	$(PYTEST) -m slow
	KERAS_BACKEND=jax $(PYTEST) -m "multibackend and not (core and not slow)"
	KERAS_BACKEND=torch $(PYTEST) -m "multibackend and not (core and not slow)"

# One backend's part of both tiers: `make test-backend KERAS_BACKEND=jax`.
test-backend: $(STAMP) $(BACKENDS_STAMP)
	KERAS_BACKEND=$(KERAS_BACKEND) $(PYTEST) -m "multibackend"

lint: $(STAMP)
	$(BIN)/ruff check tfdml tests examples benchmarks

# The documentation site (mkdocs.yml, docs/) into site/: the guides and an API reference
# rendered from the docstrings. --strict: a warning (a broken link, a docstring that cannot
# be read) fails, and so does a public name on no API page or without a docstring
# (docs/hooks.py). 16 to 45 s on 2 cores (the venv in place).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/loss_speed.py

bench-retrieval: $(STAMP)
	$(BIN)/python benchmarks/retrieval_speed.py

bench-pipeline: $(STAMP)
	$(BIN)/python benchmarks/pipeline_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
