"""The two kinds of user mistake brisk reports as one line (exit status 2): a config and a data problem.

On the ground floor so that every room can raise them without importing the config or data rooms.
"""


class ConfigError(ValueError):
    """A config key, type or path is wrong; the message names it."""


class DataError(ValueError):
    """A data problem; the message names the file and line. ``skippable``: what data.skip_bad=true would skip and
    count instead ("lines", "samples", "rows"); the message then ends with that hint, and ``problem`` is the
    message without it (a command that takes no data.skip_bad gives its own hint: brisk.eval.testset)."""

    def __init__(self, problem: str, skippable: str | None = None):
        self.problem, self.skippable = problem, skippable
        super().__init__(f"{problem} (set data.skip_bad=true to skip and count such {skippable})" if skippable
                         else problem)
