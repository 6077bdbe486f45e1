"""Where things are, answered in one place: the repository root, figures/, and lecture 5's code.

Lecture 6 reuses lecture 5's framework (code/lecture05/tensor.py) and data set (reviews.py), which
live in a sibling folder. Importing this module puts that folder on sys.path, so `import tensor`
works in every script, module and test that imports `paths` first; nothing else touches sys.path.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LECTURE05 = os.path.join(ROOT, "code", "lecture05")
FIGURES = os.path.join(ROOT, "figures")

if LECTURE05 not in sys.path:
    sys.path.insert(0, LECTURE05)
