"""Where things are, answered in one place: the repository root and figures/."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIGURES = os.path.join(ROOT, "figures")
