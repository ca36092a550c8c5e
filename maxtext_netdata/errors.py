"""Errors reported to the user as one line, without a traceback (the CLI catches these)."""


class ConfigError(ValueError):
  """A configuration that cannot be used, with a message meant for the user."""


class DataError(ValueError):
  """Bad input data; the message names the file and, where known, the row."""


class UserError(Exception):
  """A bad request on the command line (an option out of range, a missing input)."""
