"""Ctrl-C and SIGTERM (pre-emption) while training: finish the step, save, say how to resume.

The first SIGINT or SIGTERM only sets a flag; the loop looks at it after each step (Trainer.done), writes a
checkpoint the usual way (asynchronously, waited for at the end) and returns; `brisk train` then prints one
line with the step reached and the command that resumes, and exits 128 + the signal number (130 for
SIGINT, 143 for SIGTERM), as a shell does for a process the signal ended. A second signal abandons the run
at once: SIGINT raises KeyboardInterrupt, SIGTERM takes its default action.

The DataLoader's workers ignore SIGINT (brisk.data.loader), which Ctrl-C sends to every process of the
terminal's group: the main process decides, and a worker must not die of it and fail the loader first.
Handlers are installed by one process alone (not under torch.distributed: a signal seen by one rank would
stop it at another step than the others, and the collectives of the next step would wait forever).
"""

from __future__ import annotations

import logging
import shlex
import signal
import threading

log = logging.getLogger("brisk")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """``with StopOnSignal() as stop:`` ... ``stop.requested`` after each step; ``stop.signum`` says which."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # the second signal: abandon the run now
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.signum = signum
        log.warning("%s: stopping after this step and saving a checkpoint (send it again to abandon the run "
                    "without saving)", self.name)

    def _restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def __enter__(self) -> StopOnSignal:
        if self.enabled:
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        self._restore()


def resume_command(argv: list[str], output_dir: str) -> str:
    """The `brisk train` command line that continues this run: its own arguments (the folder made explicit),
    plus train.resume=true."""
    items = [a for a in argv if not a.startswith(("train.resume=", "train.overwrite=", "train.output_dir="))]
    return "brisk train " + shlex.join([*items, f"train.output_dir={output_dir}", "train.resume=true"])
