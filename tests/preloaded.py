"""Runs scripts as `python SCRIPT ARGS` would, each in a child forked from this process, which
imported numpy and torch (and torch._dynamo, which torch.optim imports on first use) once: about 5 s
of CPU that every fresh process pays again. tests/outputs.py starts one of these per environment and
sends it one job per line, {"argv": [script, args...], "stdout": file, "stderr": file}; it answers
each with the child's exit status. numpy and torch read their environment (float kernels, threads)
as they load, so every child runs in the environment this process was started with.
"""
import json
import os
import runpy
import sys
import traceback

import numpy  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401


def run(argv: list, stdout: str, stderr: str) -> int:
    """In the child: the script as __main__, started from
    the root directory, its output into the two files."""
    for fd, name in ((1, stdout), (2, stderr)):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.chdir("/")
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:   # what the interpreter would do with it
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def main():
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            os._exit(run(**json.loads(line)))
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    main()
