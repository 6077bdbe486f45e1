"""How far the runs that runner.map waits for have got: a tqdm bar on stderr, on a terminal only
(never in a file or a test's capture), called what common.main calls the part ("part 4")."""
from __future__ import annotations

import sys

from tqdm import tqdm

tqdm.monitor_interval = 0   # no monitor thread: a process that runs one thread can fork its workers

label = ""   # what the bar calls the wait; common._show_progress sets it


def bar(total: int) -> tqdm:
    """A bar counting `total` runs, shown once the wait has lasted half a second."""
    return tqdm(total=total, desc=label, unit=" runs", file=sys.stderr,
                disable=not sys.stderr.isatty(), delay=0.5, miniters=0, leave=False)
