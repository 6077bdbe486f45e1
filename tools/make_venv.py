"""Builds .venv for the Makefile, with the Python that
runs this file: `make venv` (every target calls it).

1. Checks, before anything is made, that this Python and this platform have a torch 2.13.0 wheel:
   Python 3.11-3.14 (numpy 2.4 needs 3.11) on Linux (x86_64, aarch64; glibc 2.28+), Windows
   (x86_64), macOS 14+ on Apple silicon.
2. Records in .venv/.installed (the stamp) which interpreter and torch index made .venv. When
   PYTHON= or TORCH_INDEX= is given to make (on its command line or in the environment) and asks for
   another, .venv is made again; without them the .venv there is used, and if it was made with
   another Python this says so. A requirements.txt or pyproject.toml newer than the stamp is
   installed into .venv.
3. On Linux, where PyPI's torch is the CUDA build (~4.8 GB of venv with its nvidia packages),
   installs torch from TORCH_INDEX (PyTorch's CPU-only index by default, ~1.1 GB of venv) if that
   index answers within 5 s, and from the ordinary index if it does not. TORCH_INDEX=default (or
   empty) always uses the ordinary index.
4. Installs the course's package (pyproject.toml: lecture05, lecture06) into .venv in editable
   mode, after requirements.txt's pinned versions, so that `from lecture06 import transformer`
   works in it from any directory.
5. Removes .venv if anything fails or is interrupted,
   so that no half-made environment is left behind.

Usage: python tools/make_venv.py VENV TORCH_INDEX [GOAL]
       (the Makefile passes $(VENV), $(TORCH_INDEX), the goal)
This file runs under whatever PYTHON names, however old: it keeps to syntax old Pythons parse (no
f-strings), so that they reach the version check and its message.
"""
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading

OLDEST, NEWEST = (3, 11), (3, 14)   # torch 2.13.0 has wheels for 3.10-3.14, numpy 2.4.6 for 3.11+
PLATFORMS = ("Linux x86_64/aarch64 (glibc 2.28+), Windows x86_64, macOS 14+ on Apple silicon "
             "(none for Intel Macs)")
PROBE_SECONDS = 5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = os.path.join(ROOT, "requirements.txt")
PROJECT = os.path.join(ROOT, "pyproject.toml")
KEYS = ("python", "torch index")                               # what the stamp records
VARIABLE = {"python": "PYTHON", "torch index": "TORCH_INDEX"}  # the make variable that chooses each


def say(message):
    print("make venv: " + message)
    sys.stdout.flush()


def refuse(message):
    sys.stderr.write("make venv: " + message + "\n")
    sys.exit(1)


def check_python(goal):
    """Python 3.11-3.14: one line naming the range and how to choose another interpreter."""
    version = sys.version_info[:2]
    if OLDEST <= version <= NEWEST:
        return
    refuse("Python %s (%s) cannot run this code: it needs Python %d.%d-%d.%d, the versions "
           "torch 2.13.0 and numpy 2.4.6 have wheels for; choose another interpreter, "
           "e.g. `make %s PYTHON=python3.12`"
           % ((platform.python_version(), sys.executable) + OLDEST + NEWEST + (goal,)))


def check_platform():
    system, machine = platform.system(), platform.machine().lower()
    if system == "Linux" and machine in ("x86_64", "amd64", "aarch64", "arm64"):
        libc, libc_version = platform.libc_ver()
        if libc == "glibc" and tuple(int(p) for p in libc_version.split(".")[:2]) < (2, 28):
            refuse("torch 2.13.0's Linux wheels need glibc 2.28 or newer; this system has glibc %s"
                   % libc_version)
        if libc not in ("glibc", ""):
            refuse("torch 2.13.0's Linux wheels need glibc; this system's C library is %s" % libc)
        return
    if system == "Darwin" and machine == "arm64":
        release = platform.mac_ver()[0]
        if release and int(release.split(".")[0]) < 14:
            refuse("torch 2.13.0's macOS wheels need macOS 14 or newer; this is macOS %s" % release)
        return
    if system == "Windows" and machine in ("amd64", "x86_64"):
        return
    if system == "Darwin" and machine == "x86_64":
        refuse("torch 2.13.0 has no wheel for Intel Macs (x86_64); on Apple silicon, use an arm64 "
               "Python, not one running under Rosetta (%s is x86_64)" % sys.executable)
    refuse("torch 2.13.0 has no wheel for %s %s; it has wheels for %s"
           % (system, machine, PLATFORMS))


def venv_python(venv):
    if os.name == "nt":
        return os.path.join(venv, "Scripts", "python.exe")
    return os.path.join(venv, "bin", "python")


def requirements():
    """requirements.txt's requirements ('torch==2.13.0', ...), without comments and spaces."""
    with open(REQUIREMENTS) as f:
        lines = [line.split("#")[0].replace(" ", "").strip() for line in f]
    return [line for line in lines if line]


def torch_requirement():
    """torch's line in requirements.txt, e.g.
    'torch==2.13.0': the one place its version is pinned."""
    for requirement in requirements():
        if requirement.lower().startswith("torch=="):
            return requirement
    refuse("requirements.txt pins no torch version (a line `torch==X.Y.Z`)")


def reachable(index):
    """None if `index`/torch/ answers within PROBE_SECONDS, else why not. The probe runs in a thread
    that is abandoned after the deadline, so a hanging DNS lookup or connection cannot hold the
    build up."""
    import urllib.request
    url = index.rstrip("/") + "/torch/"
    outcome = []

    def probe():
        try:
            urllib.request.urlopen(url, timeout=PROBE_SECONDS).close()
            outcome.append(None)
        except Exception as error:
            # DNS, connection, TLS, HTTP status: all mean "use the ordinary index"
            outcome.append(str(getattr(error, "reason", error)) or type(error).__name__)

    thread = threading.Thread(target=probe)
    thread.daemon = True
    thread.start()
    thread.join(PROBE_SECONDS)
    return outcome[0] if outcome else "no answer within %d s" % PROBE_SECONDS


def remove(venv):
    if os.path.islink(venv):  # a link to an environment elsewhere: drop the link, never its target
        os.unlink(venv)
    elif os.path.exists(venv):
        shutil.rmtree(venv)


def pip(python, *args):
    command = (python, "-m", "pip") + args
    if subprocess.call(command) != 0:
        raise RuntimeError("`%s` failed" % " ".join(command))


def read_stamp(stamp):
    """{'python': ..., 'torch index': ...} as the stamp records them, {} for a stamp that records
    nothing (an older Makefile's), None if there is no stamp: .venv is then unfinished or was not
    made here."""
    if not os.path.isfile(stamp):
        return None
    record = {}
    for line in open(stamp):
        key, sep, value = line.partition(": ")
        if sep:
            record[key.strip()] = value.strip()
    return record


def describe(key, value):
    if value is None:
        return "a %s its stamp does not record" % ("Python" if key == "python" else "torch index")
    return (value if key == "python"
            else "torch from " + ("the ordinary index" if value == "default" else value))


def write_stamp(stamp, record):
    with open(stamp, "w") as f:
        for key in KEYS:
            if key in record:  # a stamp from an older Makefile records nothing, and that stays so
                f.write("%s: %s\n" % (key, record[key]))


def install(venv, stamp, record, fresh, torch):
    names = [re.split("[=<>!~;[]", requirement)[0] for requirement in requirements()]
    say("installing %s into %s (requirements.txt): this takes a minute or two, most of it torch"
        % (", ".join(names), venv))
    python = venv_python(venv)
    if fresh:
        remove(venv)
        subprocess.check_call((sys.executable, "-m", "venv", venv))
        pip(python, "install", "--quiet", "--upgrade", "pip")
    else:
        os.remove(stamp)               # unfinished until the stamp is written again
    torch_index = record.get("torch index", "default")
    if not sys.platform.startswith("linux"):
        pass  # macOS's and Windows's builds on the ordinary index are CPU-only
    elif torch_index == "default":
        say("%s from the ordinary index (TORCH_INDEX=default): on Linux PyPI's is the CUDA build"
            % torch)
    else:
        why_not = reachable(torch_index)
        if why_not is None:
            say("%s: the CPU-only build, from %s" % (torch, torch_index))
            try:
                pip(python, "install", "--quiet", "--index-url", torch_index, torch)
            except RuntimeError:
                say("%s: installing from %s failed (above), so torch comes from the ordinary index"
                    % (torch, torch_index))
        else:
            say("%s: %s did not answer (%s), so torch comes from the ordinary index, where Linux's "
                "build is the CUDA one (~4.8 GB of venv); TORCH_INDEX=URL names another index"
                % (torch, torch_index, why_not))
    pip(python, "install", "--quiet", "-r", REQUIREMENTS)
    # the pinned versions are in: the package's own dependencies (ranges) need nothing more
    pip(python, "install", "--quiet", "--no-deps", "--editable", ROOT)
    write_stamp(stamp, record)
    torch_version = subprocess.check_output(
        (python, "-c", "import importlib.metadata as m, platform; "
                       "print(platform.python_version(), m.version('torch'))"))
    say("%s is ready: Python %s, torch %s" % ((venv,) + tuple(torch_version.decode().split())))


def main():
    venv, torch_index = sys.argv[1], sys.argv[2].strip() or "default"
    goal = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else "all"
    given = sys.argv[4].split() if len(sys.argv) > 4 else []  # PYTHON, TORCH_INDEX if given to make
    stamp = os.path.join(venv, ".installed")
    wanted = {"python": "%s %s %s" % (platform.python_implementation(), platform.python_version(),
                                      os.path.realpath(sys.executable)),
              "torch index": torch_index}
    made = read_stamp(stamp)
    fresh = made is None
    if made is not None:
        differ = [key for key in KEYS if made.get(key) != wanted[key]]
        forced = [key for key in differ if VARIABLE[key] in given]
        if forced:  # PYTHON= or TORCH_INDEX= asks for something else: make .venv again
            fresh = True
            why = "; ".join("%s was made with %s, %s= names %s"
                            % (venv, describe(k, made.get(k)), VARIABLE[k], describe(k, wanted[k]))
                            for k in forced)
            why += ": making it again"
        else:  # the defaults: keep the .venv there is, and say what it was made with
            for key in differ:
                say("using %s as it is, made with %s (make ... %s=... makes it again)"
                    % (venv, describe(key, made.get(key)), VARIABLE[key]))
            newer = [os.path.basename(path) for path in (REQUIREMENTS, PROJECT)
                     if os.path.getmtime(path) > os.path.getmtime(stamp)]
            if not newer:
                return
            say("%s changed since %s was made: installing it" % (" and ".join(newer), venv))
            wanted = dict((key, made[key]) for key in KEYS if key in made)
    if fresh:
        check_python(goal)             # before anything is removed or made
        check_platform()
        if made is not None:
            say(why)
        elif os.path.lexists(venv):
            say("%s has no stamp (unfinished, or not made by this Makefile): making it again"
                % venv)
        else:
            say("making %s with %s" % (venv, wanted["python"]))
    torch = torch_requirement()

    def terminated(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, terminated)
    try:
        install(venv, stamp, wanted, fresh, torch)
    except (Exception, KeyboardInterrupt) as error:
        # pip failed, Ctrl-C, kill: leave no half-made environment
        remove(venv)
        why = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
        refuse("building %s failed (%s); removed it" % (venv, why))


if __name__ == "__main__":
    main()
