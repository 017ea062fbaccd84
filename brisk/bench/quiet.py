"""Keep torch.profiler's own chatter off the user's terminal.

Kineto (the profiler's C++ side) writes "USDT:<time> ... profiler_start" / "profiler_stop" lines straight
to file descriptor 2, with no switch to turn them off (KINETO_LOG_LEVEL does not). While a profiler runs,
fd 2 goes to a temporary file; afterwards every other line written there is passed on unchanged.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager


@contextmanager
def without_profiler_chatter():
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except ValueError:
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = b"".join(line for line in tmp if not line.startswith(b"USDT:"))
            if kept:
                os.write(2, kept)
