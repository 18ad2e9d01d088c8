"""Scalar metrics of a stage: one JSON object per line (metrics.jsonl) plus TensorBoard events.

Only the main process writes (`enabled=False` elsewhere). The jsonl file is the source of truth
(a resumed stage trims it back to its checkpoint and appends); TensorBoard is for looking at.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _is_remote(path: str) -> bool:
  return "://" in path


def _open(path: str, mode: str):
  if _is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (gs:// needs tf.io.gfile)
    return tf.io.gfile.GFile(path, mode)
  return open(path, mode)


def _exists(path: str) -> bool:
  if _is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.exists(path)
  return os.path.exists(path)


def _makedirs(path: str) -> None:
  if _is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.io.gfile.makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def _scalar(v: Any) -> float | int | None:
  v = v.item() if hasattr(v, "item") else v
  if isinstance(v, bool):
    return int(v)
  if isinstance(v, int):
    return v
  v = float(v)
  return v if math.isfinite(v) else None  # strict JSON has no NaN/Inf; null says "non-finite"


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The logged rows of a metrics.jsonl ([] if it does not exist); a torn last line is dropped."""
  if not _exists(path):
    return []
  rows = []
  with _open(path, "r") as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break  # a write cut short by a kill: everything after it is suspect
  return rows


class MetricWriter:
  """Writes `{"step": s, **scalars}` rows to `<logdir>/metrics.jsonl` and TensorBoard events."""

  def __init__(self, logdir: str, *, enabled: bool = True, tensorboard: bool = True,
               resume_step: int = 0):
    """`resume_step`: keep only rows up to this step (a killed run logged past its checkpoint)."""
    self.path = os.path.join(logdir, METRICS_FILE)
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    _makedirs(logdir)
    if _exists(self.path):  # rewrite: drops rows past the checkpoint and a torn last line
      kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
      with _open(self.path + ".tmp", "w") as f:
        for r in kept:
          f.write(json.dumps(r) + "\n")
      if _is_remote(self.path):
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        tf.io.gfile.rename(self.path + ".tmp", self.path, overwrite=True)
      else:
        os.replace(self.path + ".tmp", self.path)
    self._file = _open(self.path, "a")
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
        self._tb = SummaryWriter(logdir=logdir, flush_secs=30)
      except Exception as e:  # pylint: disable=broad-except  (TensorBoard is optional)
        logging.warning("TensorBoard events disabled for %s: %s", logdir, e)

  def write(self, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
    """Logs one row and returns it (as plain Python numbers)."""
    row = {"step": int(step)}
    row.update({k: _scalar(v) for k, v in scalars.items()})
    if not self.enabled:
      return row
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in row.items():
        if k != "step" and v is not None:
          self._tb.add_scalar(k, v, global_step=step)
    return row

  def flush(self) -> None:
    if self.enabled:
      self._file.flush()
      if self._tb is not None:
        self._tb.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    self.enabled = False
    try:
      self._file.close()
    finally:
      if self._tb is not None:
        try:
          self._tb.close()
        except OSError:
          # e.g. a full disk: tensorboardX would retry the same flush at exit and print a
          # traceback there; mark its writers closed (the jsonl file is the source of truth).
          for fw in (getattr(self._tb, "all_writers", None) or {}).values():
            _abandon(getattr(fw, "event_writer", None))
          raise


def _abandon(event_writer: Any) -> None:
  """Stops a tensorboardX EventFileWriter whose final flush failed, without flushing again (best
  effort, private fields: its worker thread and exit hook would otherwise print tracebacks)."""
  if event_writer is None:
    return
  # pylint: disable=protected-access
  for stop in (lambda: event_writer._worker.stop(), lambda: event_writer._event_queue.close()):
    try:
      stop()
    except Exception:  # pylint: disable=broad-except
      pass
  event_writer._closed = True
