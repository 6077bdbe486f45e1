"""The project's checked style rules: no line over 100 characters (counted as characters, not
bytes) in any .py file under code/, tests/ or tools/, nor in the Makefile; and the size caps, so
that a file or a function grows past its cap only when someone raises the cap here, not by
golfing code back under it: transformer.py at most 650 lines, tensor.py 620, runner.py 200, each
numbered script 1,000, every function in code/ 60 (from its `def` line to its last)."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 100
FILE_CAPS = {"code/lecture06/transformer.py": 650, "code/lecture05/tensor.py": 620,
             "code/lecture06/runner.py": 200}
SCRIPT_CAP = 1000
FUNCTION_CAP = 60
# decoding.py's loops (generate, beam search, translate) are read as a lesson: a tighter cap
FUNCTION_CAPS = {"code/lecture06/decoding.py": 50}


def checked_files():
    for folder in ("code", "tests", "tools"):
        yield from sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True))
    yield os.path.join(ROOT, "Makefile")


def test_no_line_is_longer_than_100_characters():
    too_long = []
    for path in checked_files():
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                length = len(line.rstrip("\n"))
                if length > LIMIT:
                    too_long.append(f"{os.path.relpath(path, ROOT)}:{number} ({length} characters)")
    assert not too_long, (f"{len(too_long)} lines over {LIMIT} characters; wrap them:\n"
                          + "\n".join(too_long))


def test_transformer_tensor_runner_and_the_numbered_scripts_stay_within_their_line_caps():
    scripts = sorted(glob.glob(os.path.join(ROOT, "code", "lecture06", "0[0-9]_*.py")))
    caps = FILE_CAPS | {os.path.relpath(path, ROOT): SCRIPT_CAP for path in scripts}
    over = []
    for path, cap in caps.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            lines = f.read().count("\n")            # as `wc -l` counts them
        if lines > cap:
            over.append(f"{path}: {lines} lines, over its cap of {cap}")
    assert len(scripts) >= 8, f"the numbered scripts were not found: {scripts}"
    assert not over, "\n".join(over)


def test_no_function_in_code_is_longer_than_60_lines_nor_in_decoding_py_than_50():
    too_long = []
    for path in sorted(glob.glob(os.path.join(ROOT, "code", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        cap = FUNCTION_CAPS.get(os.path.relpath(path, ROOT), FUNCTION_CAP)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > cap:
                    too_long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}: "
                                    f"{lines} lines, over the cap of {cap}; split it")
    assert not too_long, "\n".join(too_long)
