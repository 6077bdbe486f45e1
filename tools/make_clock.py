"""make all's clock: each script's time, and how long make all has left, from when each script
finished in the last complete make all on this machine (saved in figures/timed/); without such a
run, nothing. It prints on make's stdout, never into a script's output.

    make_clock.py now                              the time, for `done`
    make_clock.py start DIR                        the time, for `done` and `finish`, make all's
                                                   recording in DIR begun afresh
    make_clock.py done NN STARTED DIR [ALL_STARTED]
                                                   "NN done in X s"; under make all (ALL_STARTED)
                                                   also the time left, and when NN finished is
                                                   recorded
    make_clock.py finish ALL_STARTED DIR           "make all done in X s"; this run's record saved
"""
from __future__ import annotations

import os
import sys
import time

# "NN seconds" a line: when script NN finished, in seconds after make all started
SAVED = "make_all_seconds"
RECORDING = SAVED + ".partial"   # this make all's, saved once every script has finished


def saved_times(folder: str) -> dict:
    """{NN: seconds after make all started when script NN finished} in the last complete make all
    on this machine; {} if there was none."""
    try:
        with open(os.path.join(folder, SAVED), encoding="utf-8") as f:
            return {number: float(seconds) for number, seconds in (line.split() for line in f)}
    except (OSError, ValueError):   # none saved, or a line that is not "NN seconds"
        return {}


def done_line(number: str, seconds: float, under_make_all: bool, saved: dict) -> str:
    """What make prints when script `number` has taken `seconds`: under make all, the time the
    last complete make all took after that script finished, if it ran it and did not end there."""
    line = f"{number} done in {seconds:.1f} s"
    left = max(saved.values()) - saved[number] if number in saved else 0.0
    if under_make_all and left >= 0.5:
        line += f"; make all: about {left:.0f} s left, as in its last run here"
    return line


def main(argv: list) -> None:
    now = time.time()
    if argv[0] == "now":
        print(f"{now:.3f}")
    elif argv[0] == "start":
        if os.path.exists(os.path.join(argv[1], RECORDING)):   # an interrupted make all's
            os.remove(os.path.join(argv[1], RECORDING))
        print(f"{now:.3f}")
    elif argv[0] == "done":
        number, started, folder, *all_started = argv[1:]
        # one write, its newline with it: two scripts may finish at once (make -j2), and under
        # PYTHONUNBUFFERED print writes the newline apart, where the other's line can land
        sys.stdout.write(done_line(number, now - float(started), bool(all_started),
                                   saved_times(folder)) + "\n")
        if all_started:   # one short append each, for the same reason
            with open(os.path.join(folder, RECORDING), "a", encoding="utf-8") as f:
                f.write(f"{number} {now - float(all_started[0]):.1f}\n")
    elif argv[0] == "finish":
        all_started, folder = argv[1:]
        print(f"make all done in {now - float(all_started):.1f} s")
        os.replace(os.path.join(folder, RECORDING), os.path.join(folder, SAVED))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
