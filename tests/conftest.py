"""Suite-wide collection order: the long end-to-end runs first.

`make test` runs the suite on two pytest-xdist workers, which take tests roughly in
collection order; a multi-minute learning run collected last would leave one worker
alone at the end. Moving the ``e2e`` tests to the front lets the short tests fill in
around them; the Ray ones last among them (one worker runs that whole group). Within each
group the order is unchanged.

The calibration cache (profiles of models on this machine, see hybridflow/compiler/calibrate.py)
goes to a folder of the test session, not the user's ~/.cache: a profile measured while the
suite loads the machine would otherwise make later real runs predict from it.
"""
from __future__ import annotations

import os
import tempfile

os.environ["HYBRIDFLOW_CACHE"] = os.environ.get("HYBRIDFLOW_TEST_CACHE") or tempfile.mkdtemp(prefix="hybridflow-test-cache-")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        if item.get_closest_marker("e2e") is None:
            return 2
        return 1 if "/ray/" in item.nodeid else 0

    items.sort(key=rank)
