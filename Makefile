# Lecture 6 companion code. Every target makes its own virtual environment on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SCRIPTS := $(sort $(wildcard code/lecture06/0[1-7]_*.py))

.PHONY: all test figures bench golden clean help

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

all: $(STAMP)  ## run every script; tables go to figures/NN_output.txt, figures to figures/
	@for s in $(SCRIPTS); do \
	  n=$$(basename $$s | cut -c1-2); \
	  echo "== $$s"; \
	  $(PY) $$s --figures figures > figures/$${n}_output.txt || exit 1; \
	done

figures: all  ## same as all: every figure is written by its script

test: $(STAMP)  ## the test suite
	$(PY) -m pytest -q -n auto --dist loadgroup --no-loadscope-reorder tests

bench: $(STAMP)  ## time one training step, tensor.py against PyTorch
	$(PY) code/lecture06/bench_step.py

golden: $(STAMP)  ## regenerate tests/golden/ (the expected quick outputs) from fresh runs
	$(PY) tests/outputs.py --update

clean:  ## remove the environment and caches (figures are committed and kept)
	rm -rf $(VENV) .pytest_cache tests/__pycache__ code/*/__pycache__
