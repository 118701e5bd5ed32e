"""Errors a user can cause and fix: the CLI prints them as one line and exits non-zero."""


class EdgeschedError(Exception):
    """A problem the user can act on; its message says what to do."""


class ConfigError(EdgeschedError):
    """A configuration value is missing, of the wrong type, or out of range."""


class DataError(EdgeschedError):
    """A data set is missing, unreadable, or not in the expected format."""
