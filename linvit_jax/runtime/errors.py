"""The one base of every error that is the user's to fix (a config, a checkpoint, data, the disk).

The CLI prints such an error's message as one `error: …` line and exits 2; anything else is a bug
and keeps its traceback. Each error also keeps its standard base (ValueError, OSError, ...), so
library callers can catch it either way.

No imports beyond the standard library: the CLI imports this module before JAX.
"""

from __future__ import annotations

import errno
import sys


class UserError(Exception):
  """An error whose message names what the user should fix; no traceback at the CLI."""


class ConfigError(UserError, ValueError):
  """A config that cannot run, found before any compute; the message names the field."""


class WorkdirWriteError(UserError, OSError):
  """Checkpoints or metrics could not be written: disk full, quota, read-only or no permission."""

  def __init__(self, message: str, code: int):
    super().__init__(message)
    self.errno = code

  def __str__(self) -> str:
    return self.args[0]


# errno → what the user should read; orbax/tensorstore report these inside other exception types,
# so `disk_error_code` also recognises their strerror text.
DISK_ERRORS = {
    errno.ENOSPC: "the disk is full (No space left on device)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
}
_DISK_MESSAGES = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "Read-only file system": errno.EROFS,
    "Permission denied": errno.EACCES,
}


def disk_error_code(e: BaseException | None) -> int | None:
  """The errno of a disk problem (a key of DISK_ERRORS) anywhere in e's cause/context chain, or
  None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    code = getattr(e, "errno", None)
    if code in DISK_ERRORS:
      return code
    for text, code in _DISK_MESSAGES.items():
      if text in str(e):
        return code
    e = e.__cause__ or e.__context__
  return None


# An `error:` line longer than this is shortened in the middle (its start says what is wrong, its
# end usually says the fix).
MAX_LINE = 400


def one_line(text: str, limit: int = MAX_LINE) -> str:
  """`text` on one line (whitespace collapsed), at most `limit` characters."""
  text = " ".join(str(text).split())
  if len(text) <= limit:
    return text
  tail = limit // 4
  return f"{text[: limit - tail - 3]} … {text[-tail:]}"


def shorten(text: str, limit: int = 60) -> str:
  """`text` (a path, a JSON value) kept to about `limit` characters for an error line: its start
  and its last 12 characters."""
  return text if len(text) <= limit else f"{text[: limit - 20]}…{text[-12:]}"


def photo_writer_error(e: ImportError | OSError) -> UserError:
  """A photo writer's failure (sample_photos, debian_photos) as one user-facing line: a missing
  package says which; a file error says where it could not write."""
  if isinstance(e, ImportError):
    return UserError(str(e))
  where = f"cannot write {e.filename!r}: " if e.filename else ""
  return UserError(f"{where}{e.strerror or e}")


def say(e: UserError) -> int:
  """A command line's user error as one `error:` line on stderr; returns its exit code, 2."""
  print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
  return 2
