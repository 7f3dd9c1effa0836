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

.PHONY: demo test test-slow lint bench bench-retrieval bench-pipeline venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,$(TF)]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/digits_demo.py
	MPLBACKEND=Agg $(BIN)/python examples/class_collapse/digits_even_odd.py

# Tests run in parallel worker processes (pytest-xdist), one per CPU, at most 4.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check tfdml tests examples benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/loss_speed.py

bench-retrieval: $(STAMP)
	$(BIN)/python benchmarks/retrieval_speed.py

bench-pipeline: $(STAMP)
	$(BIN)/python benchmarks/pipeline_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
