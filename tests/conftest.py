"""Shared test setup: `load_script("01_attention")` imports a numbered script (names start with a digit,
so no plain import). pytest.ini puts code/lecture06 on the path; `paths` adds lecture 5's code.

Under pytest-xdist (`make test`: -n auto --dist loadgroup) a module's tests run on one worker, so that a
module-scoped fixture (a training run over three seeds) is computed once, not once on every worker; and the
groups that take longest start first, so that no worker is left alone with one of them at the end. There each
worker has its share of the cores: a fixture trains its runs in the worker itself, one after another (threads.WORKERS,
here 1 on two cores), not in processes of its own that would share a core with the other worker, which cost
~10% more CPU. The scripts' quick runs inherit the setting."""
import os

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("LECTURE06_WORKERS", str(max(1, (os.cpu_count() or 1)
                                                       // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
import threads  # noqa: F401  (first: one BLAS thread, set before any test module loads numpy, as in the scripts)

import atexit
import gc
import importlib.metadata
import importlib.util
import sys

import pytest

import paths

LECTURE06 = paths.HERE

# At exit (after pytest's own last collections), spare the interpreter a last walk over the ~350,000 objects
# that torch and the tests leave behind: 1.3 s per xdist worker, during which the other waits, as
# common.main does for a script
atexit.register(gc.freeze)


def load_script(name: str):
    """Import code/lecture06/<name>.py (e.g. "01_attention") once and return the module."""
    name = name[:-3] if name.endswith(".py") else name
    module_name = f"script_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = os.path.join(LECTURE06, f"{name}.py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_script: no script {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


# The longest groups, longest first: the fixtures that train over seeds (test_04's two have a group each), and
# test_outputs' quick runs of every script, under torch's slower generic kernels
LONGEST_FIRST = ("test_04 400 steps", "test_04 75 steps", "test_outputs", "test_07_sentiment",
                 "test_05_training_recipe", "test_transformer")


def _group(item) -> str:
    return item.get_closest_marker("xdist_group").args[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: the rest keep their order


def pytest_collection_finish(session):
    """xdist marks a test's group by appending "@group" to its id; check that it did."""
    if getattr(session.config.option, "loadgroup", False) and session.items and "@" not in session.items[0].nodeid:
        raise pytest.UsageError(
            f"pytest-xdist {importlib.metadata.version('pytest-xdist')} cannot group tests under pytest "
            f"{pytest.__version__}: install requirements.txt's versions (make test does)")
    # What exists now (modules, torch's 300,000 objects) lives to the end: no garbage collection need walk it again
    gc.freeze()


@pytest.fixture
def script():
    """The fixture form of load_script: `def test_x(script): m = script("01_attention")`."""
    return load_script
