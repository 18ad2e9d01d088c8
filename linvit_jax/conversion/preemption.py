"""Ctrl-C and preemption (SIGTERM) during a stage: stop at a step boundary, checkpointed.

Ctrl-C (SIGINT) or SIGTERM (how Cloud TPU VMs and most schedulers announce a preemption) while
`train.run_stage` runs only sets a flag (`DeferredInterrupt`); the runner finishes the current
step, saves a checkpoint of it and raises `StageInterrupted` (a KeyboardInterrupt; the CLI exits
128 + signal: 130 or 143), built by `stage_interrupted`. Rerunning the same command resumes there.
A second signal interrupts at once. In a multi-process run all processes stop at the same step.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp

if TYPE_CHECKING:  # (train imports this module)
  from linvit_jax.conversion.train_step import TrainState

# Signals that stop a stage at the next step boundary, checkpointed: Ctrl-C, and SIGTERM, which
# Cloud TPU VMs (and most schedulers: Kubernetes, SLURM) send some seconds before a preemption.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StageInterrupted(KeyboardInterrupt):
  """Ctrl-C or SIGTERM during a stage; the message says which step was checkpointed.

  A KeyboardInterrupt, so that callers (and the CLI: exit 128 + signum) treat both as Ctrl-C;
  `signum` says which one it was.
  """

  def __init__(self, message: str = "", signum: int = signal.SIGINT):
    super().__init__(message)
    self.signum = signum


class DeferredInterrupt:
  """Ctrl-C or SIGTERM during the loop only sets a flag, acted on between steps: a
  KeyboardInterrupt raised inside the step call would find the state already donated, with nothing
  left to save. A second signal interrupts at once. Processes agree (a collective every `every`
  steps) so that all of them save the same step; only the main thread can take signals
  (elsewhere: plain Ctrl-C, and SIGTERM keeps its previous effect).

  The previous handlers come back afterwards, also one installed outside Python, which
  `signal.signal` cannot reinstall (and reports as SIG_DFL): in a multi-process run JAX's
  preemption notifier holds SIGTERM, and SIG_DFL in its place would make a later SIGTERM kill the
  process at once.
  """

  def __init__(self, every: int):
    self.requested, self.signum, self._every = False, signal.SIGINT, max(every, 1)
    self._previous: dict[int, tuple[Any, Any]] = {}  # signum: (Python handler, C-level action)
    if threading.current_thread() is threading.main_thread():
      for signum in STOP_SIGNALS:
        action = _sigaction(signum)
        self._previous[signum] = (signal.signal(signum, self._handle), action)

  def _handle(self, signum, frame) -> None:
    del frame
    self.signum = signum
    if self.requested:  # the second one: now
      self.restore()
      raise KeyboardInterrupt
    self.requested = True
    if signum == signal.SIGINT:
      logging.warning("Ctrl-C: checkpointing after this step (press it again to stop at once)")
    else:
      name = signal.Signals(signum).name
      logging.warning("%s: checkpointing after this step (a second %s stops at once)", name, name)

  def stop_now(self, step: int, last: bool = False) -> bool:
    """Whether to stop before `step` (`last`: after the final one); a collective every `every`
    steps when there are several processes, so all of them answer the same."""
    if jax.process_count() == 1:
      return self.requested
    if step % self._every and not last:
      return False
    from jax.experimental import multihost_utils
    # Each process's signal (0: none), so that all of them name the same one in their message.
    asked = np.asarray(
        multihost_utils.process_allgather(np.int32(self.signum if self.requested else 0))
    )
    if not asked.any():
      return False
    self.signum = int(asked[asked != 0][0])
    return True

  def restore(self) -> None:
    """Puts the previous handlers back (idempotent)."""
    previous, self._previous = self._previous, {}
    for signum, (handler, action) in previous.items():
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)
      _sigaction(signum, action)  # a handler from outside Python: back in place


def _sigaction(signum: int, action: Any = None) -> Any:
  """Reads (action None) or sets the C-level action of `signum` as an opaque `struct sigaction`
  buffer; None where libc's sigaction cannot be reached (then only Python's handler is kept)."""
  try:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if action is not None:
      libc.sigaction(signum, action, None)
      return action
    buf = ctypes.create_string_buffer(1024)  # larger than struct sigaction anywhere (Linux: 152)
    return buf if libc.sigaction(signum, None, buf) == 0 else None
  except (OSError, AttributeError, TypeError):  # no libc sigaction (Windows)
    return None


def stage_interrupted(
    name: str,
    total: int,
    state: TrainState,
    manager: ocp.CheckpointManager,
    signum: int = signal.SIGINT,
) -> StageInterrupted:
  """Ctrl-C or SIGTERM (`signum`): checkpoints `state` at its step and says where a rerun resumes.

  A KeyboardInterrupt that lands inside the step call (a second signal, or a loop outside the main
  thread) may leave `state` donated (deleted); then nothing new can be saved and the rerun resumes
  from the last periodic checkpoint.
  """
  saved, problem = None, ""
  try:
    leaves = jax.tree.leaves(state)
    if any(getattr(x, "is_deleted", lambda: False)() for x in leaves):
      problem = "the state was mid-update"
    else:
      step = int(jax.device_get(state.step))
      if step not in manager.all_steps():
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
      manager.wait_until_finished()
      saved = step
  except Exception as e:  # (report what is on disk instead)
    problem = f"{type(e).__name__}: {e}"
  by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
  if saved is not None:
    return StageInterrupted(
        f"stage {name!r} interrupted{by} at step {saved} of {total}; "
        "checkpoint saved, rerun the same command to resume",
        signum,
    )
  latest = manager.latest_step()
  where = (
      f"resumes from the last checkpoint, step {latest}"
      if latest is not None
      else "starts this stage again"
  )
  return StageInterrupted(
      f"stage {name!r} interrupted{by} ({problem}); nothing new was saved, "
      f"rerunning the same command {where}",
      signum,
  )
