"""How `make test` shares the machine (a pytest plugin that conftest.py loads): xdist groups, their
order, the training processes per test worker, and the garbage collector.

- Each test module is one pytest-xdist group (`--dist loadgroup`), so that its module-scoped
  fixtures (a training run over three seeds) are computed once, on one worker, not once on every
  worker.
- The groups that take longest start first (LONGEST_FIRST; the Makefile's --no-loadscope-reorder
  keeps the order), so that no worker is left alone with one of them at the end.
- Each worker has its share of the cores: runner.py trains a fixture's runs in the worker itself,
  one after another (LECTURE06_WORKERS = cores per worker, 1 on two cores), not in processes of its
  own that would share a core with the other worker (~10% more CPU). The scripts' quick runs inherit
  the setting.
- What exists once the tests are collected (modules, torch's 300,000 objects) lives to the end: it
  is frozen out of garbage collection, so that no collection during the tests walks it again (as
  runner.py does for its workers, where it saves script 07 about 15% of its time).
"""
import importlib.metadata
import os

import pytest

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:   # before runner.py reads it
    os.environ.setdefault("LECTURE06_WORKERS", str(max(
        1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import gc  # noqa: E402

# The longest groups, longest first (CPU seconds per group, whole suite, 2026-12-02: 38 to 12): the
# fixtures that train over seeds (test_04's settled runs have a group), the gradient checks, and
# test_outputs' quick runs of 04 and 05 under torch's slower generic kernels (a group per script)
LONGEST_FIRST = ("test_05_training_recipe", "test_07_sentiment", "test_transformer",
                 "test_outputs 05", "test_outputs 04", "test_03_hw3_modules", "test_04 settled",
                 "test_04_residual_layernorm", "test_decoding", "test_encoder_decoder")


def _group(item) -> str:
    return item.get_closest_marker("xdist_group").args[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    # stable: the rest keep their order
    items.sort(key=lambda item: rank.get(_group(item), len(rank)))


def pytest_collection_finish(session):
    """xdist marks a test's group by appending "@group" to its id; check that it did."""
    if (getattr(session.config.option, "loadgroup", False) and session.items
            and "@" not in session.items[0].nodeid):
        raise pytest.UsageError(
            f"pytest-xdist {importlib.metadata.version('pytest-xdist')} cannot group tests under "
            f"pytest {pytest.__version__}: install requirements.txt's versions (make test does)")
    gc.freeze()
