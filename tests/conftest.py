"""Shared test setup: `load_script("01_attention")` imports a numbered script (names start with a
digit, so no plain import). The code is the installed package (make venv: `from lecture06 import
transformer`); pytest.ini puts only tests/ on the path. How the suite shares the machine (xdist
groups, worker counts, garbage collection) is tests/scheduling.py's business."""
# first: one BLAS thread, set before any test module loads numpy, as in the scripts
from lecture06 import threads  # noqa: F401

import importlib.util
import os
import sys

import pytest

from lecture06 import paths

pytest_plugins = ["scheduling"]

LECTURE06 = paths.HERE


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


@pytest.fixture
def script():
    """The fixture form of load_script: `def test_x(script): m = script("01_attention")`."""
    return load_script
