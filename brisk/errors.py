"""The two kinds of user mistake brisk reports as one line (exit status 2): a config and a data problem.

On the ground floor so that every room can raise them without importing the config or data rooms.
"""


class ConfigError(ValueError):
    """A config key, type or path is wrong; the message names it."""


class DataError(ValueError):
    """A data problem; the message names the file and line."""
