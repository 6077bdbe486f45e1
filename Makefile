# Lecture 6 companion code. Every target makes its own virtual environment on first use.
PYTHON ?= python3
# Where torch comes from on Linux, where PyPI's torch is the CUDA build: PyTorch's CPU-only index if
# it answers within 5 s, else the ordinary index. TORCH_INDEX=URL for a mirror, TORCH_INDEX=default
# for the ordinary index (PyPI: with a GPU, the CUDA build). macOS and Windows always use the
# ordinary index: their builds are CPU-only.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV   := .venv
PY     := $(VENV)/bin/python
TIMED  := figures/timed
SCRIPTS := $(sort $(wildcard code/lecture06/0[1-9]_*.py))

.PHONY: all test seeds check figures bench golden venv clean help

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' Makefile | sed 's/:.*## /\t/'

# Makes .venv when there is none, or when PYTHON or TORCH_INDEX is given (command line or
# environment) and its stamp records another; checks PYTHON (3.11-3.14) and the platform first;
# removes .venv again if pip fails.
GIVEN := \
	$(foreach v,PYTHON TORCH_INDEX,$(if $(filter command line environment,$(origin $(v))),$(v)))
venv:  ## make .venv (only); make venv PYTHON=python3.12 makes it again with that interpreter
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "make: PYTHON=$(PYTHON) is not a command; name a Python 3.11-3.14, e.g. PYTHON=python3.12" \
	  >&2; exit 1; }
	@$(PYTHON) tools/make_venv.py $(VENV) '$(TORCH_INDEX)' '$(firstword $(MAKECMDGOALS))' '$(GIVEN)'

# figures/NN_output.txt (committed) is the script's output without its ⏱ lines, the wall-clock times
# that differ on every run; the full output, ⏱ lines included, goes to figures/timed/NN_output.txt
# (not committed). 01, 02, 03, 06 and 09 compute in one process: they run two at a time, a core each
# (their ⏱ lines timed with no other process on their core); 04, 05, 07 and 08 train on every core,
# so they run one at a time. One at a time throughout took 187 s on 2 cores (DEVELOPING.md).
RUNS := $(SCRIPTS:code/lecture06/%.py=run-%)
ONE_PROCESS := $(filter run-01_% run-02_% run-03_% run-06_% run-09_%,$(RUNS))
.PHONY: $(RUNS)
# "NN done in X s" after each script; under make all also the time left, from when each script
# finished in the last complete make all here (tools/make_clock.py keeps them in $(TIMED))
CLOCK := $(PY) tools/make_clock.py
ALL_STARTED :=

all: venv  ## run every script: figures/*.png, figures/NN_output.txt (⏱ timings in figures/timed/)
	@mkdir -p $(TIMED)
	@started=$$($(CLOCK) start $(TIMED)) && \
	  $(MAKE) --no-print-directory -j2 $(ONE_PROCESS) ALL_STARTED=$$started && \
	  $(MAKE) --no-print-directory -j1 $(filter-out $(ONE_PROCESS),$(RUNS)) ALL_STARTED=$$started && \
	  $(CLOCK) finish $$started $(TIMED)

$(RUNS): run-%:
	@n=$$(echo $* | cut -c1-2); s=code/lecture06/$*.py; started=$$($(CLOCK) now); \
	  echo "== $$s (its tables: figures/$${n}_output.txt)"; \
	  $(PY) $$s --figures figures > $(TIMED)/$${n}_output.txt \
	    || { echo "$$s failed; its output so far: $(TIMED)/$${n}_output.txt" >&2; exit 1; }; \
	  sed '/^[[:space:]]*⏱/d' $(TIMED)/$${n}_output.txt > figures/$${n}_output.txt; \
	  grep '^[[:space:]]*⏱' $(TIMED)/$${n}_output.txt | sed "s/^/$$n /"; \
	  $(CLOCK) done $$n $$started $(TIMED) $(ALL_STARTED)

figures: all  ## same as all: every figure is written by its script

test: venv  ## the test suite, but for the claims counted over 10 seeds (make seeds)
	$(PY) -m pytest -q -n auto --dist loadgroup --no-loadscope-reorder -m "not seeds" tests

# The parts that decide claims over seeds, run at 10 seeds: each verdict and unmarked line compared
# with figures/seeds_output.txt, which it then rewrites; then the tests that need 400-step runs (one
# pytest process: runner.py trains each fixture's stacks side by side on all the cores)
seeds: venv  ## every training claim decided over 10 seeds, into figures/seeds_output.txt (CI too)
	$(PY) tests/outputs.py --seeds
	$(PY) -m pytest -q -p no:xdist -m seeds tests

# Every unmarked line of every full run, as committed: lines that make test's quick runs never print
check: venv  ## every script in full: its unmarked lines and verdicts as in figures/NN_output.txt
	$(PY) tests/outputs.py --full

bench: venv  ## time a training step, tensor.py vs PyTorch; a city-language run, lone vs stacked
	$(PY) code/lecture06/bench_step.py
	$(PY) code/lecture06/bench_city.py

golden: venv  ## regenerate tests/golden/ (the expected quick outputs) from fresh runs
	$(PY) tests/outputs.py --update

clean:  ## remove the environment, caches and figures/timed/ (figures are committed and kept)
	rm -rf $(VENV) $(TIMED) .pytest_cache tests/__pycache__ code/*/__pycache__ tools/__pycache__
