"""The course's code is one installed package (pyproject.toml; make venv installs it editable):
`from lecture06 import transformer`, `from lecture05.tensor import Tensor`. None of its modules is
importable by its bare name, so a package on the index that owns one (transformers imports
`kernels`, a package of that name) finds its own, and nothing of ours changes sys.path."""
import glob
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

from lecture06 import paths

MODULES = {package: sorted(os.path.basename(path)[:-3]
                           for path in glob.glob(os.path.join(paths.ROOT, "code", package, "*.py"))
                           if not os.path.basename(path)[0].isdigit()
                           and os.path.basename(path) != "__init__.py")
           for package in ("lecture05", "lecture06")}


@pytest.mark.parametrize("package", sorted(MODULES))
def test_every_module_imports_by_its_package_name(package):
    for name in MODULES[package]:
        module = importlib.import_module(f"{package}.{name}")
        assert module.__file__ == os.path.join(paths.ROOT, "code", package, f"{name}.py")


def test_no_module_of_ours_is_importable_by_its_bare_name():
    """No folder of ours that holds modules is on sys.path (the installed package's root, code/,
    holds the two packages only): `kernels`, `common`, `tensor` are the index's names to own."""
    ours = [os.path.join(paths.ROOT, "code", package) for package in MODULES]
    assert not [folder for folder in sys.path if os.path.abspath(folder or ".") in ours]
    for name in MODULES["lecture05"] + MODULES["lecture06"]:
        spec = importlib.util.find_spec(name)
        assert spec is None or not spec.origin.startswith(os.path.join(paths.ROOT, "code")), name


def test_huggingface_imports_beside_the_package():
    """transformers 5 imports the `kernels` package; with our modules on sys.path by bare name it
    got ours (ImportError: cannot import name 'CUDAProperties' from 'kernels'). Run where a student
    has transformers installed; it is no requirement of this course."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed here (pip install transformers runs this)")
    code = ("from lecture06 import transformer, kernels\n"
            "import transformers\n"
            "from transformers import GPT2LMHeadModel\n"
            "print(kernels.__name__, GPT2LMHeadModel.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=paths.ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "lecture06.kernels GPT2LMHeadModel\n"
