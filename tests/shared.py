"""A module fixture's value computed once per test run, whichever xdist workers need it: the first to ask computes
it, the others read it from the run's temporary root, which they share (the pattern pytest-xdist documents for
fixtures that must run once).  Without xdist it is computed in place."""

import json
import os
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def once(tmp_path_factory, name: str, compute: Callable[[Path], object]):
    """compute(folder) -> a JSON value, from the first worker to ask; ``folder`` is shared by every worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # this run's popen-gw* folders sit side by side in it
    path = root / f"{name}.json"
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            folder = root / name
            folder.mkdir()
            path.write_text(json.dumps(compute(folder)))
        return json.loads(path.read_text())
