# Two commands set everything up on a fresh machine with Python 3.11: `make demo`, `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-all lint format reports clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[all]'
	@touch $(STAMP)

demo: $(STAMP)  ## the main job on the embedded Llama-3-scale scenario
	$(VENV)/bin/ckptsim demo

test: $(STAMP)  ## the default suite (slow tests excluded), then lint
	$(PY) -m pytest -q
	$(VENV)/bin/ruff check simulator tests experiments

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

lint: $(STAMP)
	$(VENV)/bin/ruff check simulator tests experiments
	$(VENV)/bin/ruff format --check simulator tests experiments

format: $(STAMP)
	$(VENV)/bin/ruff format simulator tests experiments
	$(VENV)/bin/ruff check --fix simulator tests experiments

reports: $(STAMP)
	$(PY) -m experiments.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
