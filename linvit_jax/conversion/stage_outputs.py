"""What a stage writes to disk, and how it is closed: its orbax checkpoint manager and metrics
writer, closed together however the stage ends; a full or unwritable disk becomes an
`errors.WorkdirWriteError` naming the directory, raised once the previous checkpoint is known to
be intact.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import orbax.checkpoint as ocp

from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.runtime import errors
from linvit_jax.runtime import metrics as metrics_lib


def checkpoint_manager(directory: str, max_to_keep: int) -> ocp.CheckpointManager:
  """An async orbax manager for `directory` that discards a write cut short by a kill."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep,
      create=True,
      cleanup_tmp_directories=True,  # a write cut short by a kill is discarded on restart
      enable_async_checkpointing=True,
  )
  return ocp.CheckpointManager(
      os.path.abspath(directory) if "://" not in directory else directory, options=options
  )


class Outputs:
  """What stage `name` writes to: its checkpoint manager (`<stage_dir>/checkpoints`) and, once
  the start step is known, its metrics writer; closed together however the stage ends."""

  def __init__(self, name: str, stage_dir: str, max_to_keep: int):
    self.name, self.stage_dir = name, stage_dir
    self.manager = checkpoint_manager(os.path.join(stage_dir, "checkpoints"), max_to_keep)
    self.writer: metrics_lib.MetricWriter | None = None

  def close(self, *, failed: bool) -> None:
    """Waits for pending saves and closes; when the stage already failed, a second error here
    (typically the same full disk) is logged instead of hiding the first one."""
    writer = self.writer
    for close in (
        self.manager.wait_until_finished,
        self.manager.close,
        writer.close if writer is not None else None,
    ):
      if close is None:
        continue
      try:
        close()
      except Exception as e:
        if not failed:
          raise
        logging.warning("while stopping after an error: %s: %s", type(e).__name__, e)


@contextlib.contextmanager
def closing(outputs: Outputs) -> Iterator[None]:
  """Closes the stage's outputs however it ends (the last save completes here); a full or
  unwritable disk becomes an errors.WorkdirWriteError naming the directory, raised once the
  previous checkpoint is known to be intact."""
  try:
    yield
  except Exception as e:
    outputs.close(failed=True)
    code = None if isinstance(e, CheckpointError) else errors.disk_error_code(e)
    if code is None:
      raise
    raise _write_error(outputs.name, outputs.stage_dir, code) from e
  except BaseException:  # Ctrl-C (already checkpointed by the loop), SystemExit
    outputs.close(failed=True)
    raise
  try:
    outputs.close(failed=False)
  except Exception as e:
    code = errors.disk_error_code(e)
    if code is None:
      raise
    raise _write_error(outputs.name, outputs.stage_dir, code) from e


def _write_error(name: str, stage_dir: str, code: int) -> errors.WorkdirWriteError:
  try:  # what is on disk now (a fresh read-only manager; the stage's own one is closed)
    with ocp.CheckpointManager(
        os.path.join(stage_dir, "checkpoints"), options=ocp.CheckpointManagerOptions(read_only=True)
    ) as m:
      steps = m.all_steps()
  except Exception:
    steps = []
  kept = (
      f"the last complete checkpoint (step {max(steps)}) is intact and a rerun resumes from it"
      if steps
      else "no complete checkpoint of this stage exists yet"
  )
  return errors.WorkdirWriteError(
      f"stage {name!r}: cannot write checkpoints/metrics in {stage_dir!r}: "
      f"{errors.DISK_ERRORS[code]}. "
      f"Free space or pass another --workdir; {kept}.",
      code,
  )
