"""Two rules every numbered script keeps: no function longer than 50 lines (a part reads as a few
short ideas), and each part prints its header before it does any work, so that a student watching
a slow part sees which part it is, not the previous part's output."""
import ast
import glob
import linecache
import os
import sys

import pytest

from lecture06 import common
from conftest import LECTURE06, load_script

SCRIPTS = sorted(os.path.basename(path)[:-3]
                 for path in glob.glob(os.path.join(LECTURE06, "0[1-9]_*.py")))
LONGEST = 50
# frames that belong to the statement that made them: a call from inside one is a call from the
# function the comprehension is written in
COMPREHENSIONS = {"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"}


def test_the_numbered_scripts_are_found():
    assert SCRIPTS == ["01_attention", "02_positions", "03_hw3_modules",
                       "04_residual_layernorm", "05_training_recipe", "06_costs",
                       "07_sentiment", "08_llama_preview", "09_on_a_gpu"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_function_in_the_script_is_longer_than_50_lines(name):
    with open(os.path.join(LECTURE06, f"{name}.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    too_long = [f"{node.name} (line {node.lineno}: {node.end_lineno - node.lineno + 1} lines)"
                for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno + 1 > LONGEST]
    assert not too_long, f"{name}: functions over {LONGEST} lines: {', '.join(too_long)}"


class HeaderReached(Exception):
    """Raised by the stand-in header: the part got as far as its header, all this test needs."""


class WorkBeforeHeader(Exception):
    """Raised at the first function a part calls before its header."""


def caller(frame):
    """The frame that called `frame`, looking through comprehensions to the function they are
    written in."""
    calling = frame.f_back
    while calling is not None and calling.f_code.co_name in COMPREHENSIONS:
        calling = calling.f_back
    return calling


def reads_the_command_line(frame, args) -> bool:
    """Whether the function called in `frame` takes the command line's arguments and nothing else
    (`steps_of(args)`, `part4_plan(args)`): what a header may be worded from."""
    code = frame.f_code
    return (code.co_argcount == 1 and not code.co_kwonlyargcount
            and frame.f_locals.get(code.co_varnames[0]) is args)


def first_thing_a_part_does(show, args, header) -> str:
    """Run show(args) until it calls `header` (a stand-in that raises HeaderReached): "header" if
    that is the first function it calls (common's helpers, comprehensions and functions of `args`
    alone aside), else the line of show that called something first."""
    def watch(frame, event, arg):
        code = frame.f_code
        if (event != "call" or code is header.__code__ or code.co_name in COMPREHENSIONS
                or code.co_filename == common.__file__ or reads_the_command_line(frame, args)):
            return
        calling = caller(frame)
        if calling is not None and calling.f_code is show.__code__:
            line = linecache.getline(calling.f_code.co_filename, calling.f_lineno).strip()
            raise WorkBeforeHeader(f"line {calling.f_lineno}, `{line}`,")

    sys.setprofile(watch)
    try:
        show(args)
    except HeaderReached:
        return "header"
    except WorkBeforeHeader as work:
        return str(work)
    finally:
        sys.setprofile(None)
    return "nothing: the part never printed a header"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_part_prints_its_header_first_before_any_work(name, monkeypatch, capsys):
    script = load_script(name)
    headers = []

    def header(part, doc, *shown):
        headers.append((part, capsys.readouterr().out))
        raise HeaderReached

    monkeypatch.setattr(common, "header", header)
    args = common.parse_args(script.__doc__, script.PARTS, ["--quick", "--no-figures"], seeds=1)
    late = {}
    for number, show in script.PARTS.items():
        capsys.readouterr()
        headers.clear()
        first = first_thing_a_part_does(show, args, header)
        if first != "header":
            late[number] = f"{show.__name__}'s {first} runs before its header"
        elif headers != [(number, "")]:
            late[number] = (f"{show.__name__} printed {headers[0][1]!r} before its header, or "
                            f"named part {headers[0][0]}")
    assert not late, f"{name}: " + "; ".join(f"part {n}: {why}" for n, why in late.items())
