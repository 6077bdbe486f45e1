"""The project's one checked style rule: no line over 100 characters (counted as characters, not
bytes) in any .py file under code/, tests/ or tools/, nor in the Makefile."""
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 100


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
