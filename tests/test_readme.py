"""The README's "Use the modules from Python" block runs as it stands, in a fresh Python (what a
student pastes), from the repository's root and from any other directory: the modules are the
installed package, not files beside it."""
import os
import re
import subprocess
import sys

import pytest

from lecture06 import paths

SECTION = "## Use the modules from Python"


def readme_code() -> str:
    with open(os.path.join(paths.ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return code


def run_python(code: str, directory: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("directory", [paths.ROOT, "/"])
def test_the_readmes_python_block_trains_a_step_decodes_and_translates(directory):
    done = run_python(readme_code(), directory)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    printed = done.stdout.splitlines()
    assert printed[0] == "DecoderLM(" and "  (ln): LayerNorm(dim=32, eps=1e-05)" in printed
    assert re.fullmatch(r"loss \d\.\d{3}", printed[printed.index(")") + 1])
    assert "(2, 9, 20)" in printed
