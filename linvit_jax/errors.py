"""The one base of every error that is the user's to fix (a config, a checkpoint, data, the disk).

The CLI prints such an error's message as one `error: …` line and exits 2; anything else is a bug
and keeps its traceback. Each error also keeps its standard base (ValueError, OSError, ...), so
library callers can catch it either way.
"""


class UserError(Exception):
  """An error whose message names what the user should fix; no traceback at the CLI."""
