"""The README's "Use the modules from Python" block runs as it stands, from the repository's root,
in a fresh Python (what a student pastes)."""
import os
import re
import subprocess
import sys

import paths

SECTION = "## Use the modules from Python"


def readme_code() -> str:
    with open(os.path.join(paths.ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return code


def test_the_readmes_python_block_trains_a_step_decodes_and_translates():
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", readme_code()], cwd=paths.ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    printed = done.stdout.splitlines()
    assert re.fullmatch(r"loss \d\.\d{3}", printed[0])
    assert "(2, 9, 20)" in printed
