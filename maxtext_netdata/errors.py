"""Errors reported to the user as one line, without a traceback (the CLI catches these)."""


class ConfigError(ValueError):
  """A configuration that cannot be used, with a message meant for the user."""


class DataError(ValueError):
  """Bad input data; the message names the file and, where known, the row."""


class UserError(Exception):
  """A bad request on the command line (an option out of range, a missing input)."""


def first_line(error: BaseException) -> str:
  """The first line of an exception's message (its type's name when it has none), for a
  one-line report of an error raised by a library that writes several."""
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


class WritesTo:
  """`with WritesTo(path):` a block writing `path`, a file or a folder.

  A failed `write()`, `fallocate()` or Arrow file write raises OSError with the cause
  (errno) but no file name; leaving this block, such an error gets `path` as its file name,
  so that the CLI's one-line report can say what could not be written.
  """

  def __init__(self, path):
    self.path = str(path)

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, traceback) -> bool:
    if isinstance(exc, OSError) and exc.filename is None:
      exc.filename = self.path
    return False
