"""The error raised for bad input data."""


class DataError(ValueError):
  """Bad input data; the message names the file and, where known, the row."""
