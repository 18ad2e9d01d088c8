"""The host side of a stage's metrics: read one step late, logged, shown, and guarded.

`MetricsDrain` reads each step's device metrics one step late (so the device keeps working while
the host prepares the next batch), advances the tqdm bar, writes rows to metrics.jsonl and
TensorBoard (runtime.metrics.MetricWriter) and stops the stage with `NonFiniteLossError` after
`max_nonfinite_in_a_row` non-finite steps in a row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tqdm

from linvit_jax.runtime import metrics as metrics_lib
from linvit_jax.runtime.errors import UserError


class NonFiniteLossError(UserError, FloatingPointError):
  """The loss or gradients stayed non-finite for `max_nonfinite_in_a_row` steps."""


class MetricsDrain:
  """A stage's metrics on the host: each step's are read one step late (`push`), so the device
  keeps working while the host prepares the next batch. Reading a step advances the progress bar,
  logs a row every `log_every` steps (and at the first, the last and every non-finite step) and
  stops the stage after `max_nonfinite_in_a_row` non-finite steps in a row. Every row also goes to
  `history`, the rows run_stage returns."""

  def __init__(
      self,
      name: str,
      cfg: Mapping[str, Any],
      start: int,
      writer: metrics_lib.MetricWriter,
      history: list[dict],
      *,
      show_progress: bool,
  ):
    self.name, self.start, self.total = name, start, int(cfg["steps"])
    self.log_every = max(int(cfg["log_every"]), 1)
    self.history = history
    self._max_bad = int(cfg["max_nonfinite_in_a_row"])
    self._batch_size = int(cfg["batch_size"])
    self._writer = writer
    self.bar = tqdm.tqdm(
        total=self.total,
        initial=start,
        desc=name,
        dynamic_ncols=True,
        mininterval=1.0,
        disable=not show_progress,
    )
    self._since = (time.perf_counter(), start)  # (time, step) of the last row: its rate
    self._pending = None  # (step, device metrics) not read yet
    self.step_flops: float | None = None  # the step's FLOPs (train._step_flops), once known

  def push(self, step: int, device_metrics: Mapping[str, jax.Array]) -> None:
    """Queues `step`'s metrics after reading the previous step's."""
    self.drain()
    self._pending = (step, device_metrics)

  def drain(self) -> None:
    """Reads the queued step's metrics now (before a checkpoint, or when the stage stops)."""
    if self._pending is not None:
      self._read(*self._pending)
      self._pending = None

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Logs a row of other scalars (an evaluation's) at `step`."""
    self.history.append(self._writer.write(step, scalars))

  def close(self) -> None:
    self.bar.close()

  def _read(self, step: int, device_metrics: Mapping[str, jax.Array]) -> None:
    m = {k: np.asarray(v) for k, v in jax.device_get(device_metrics).items()}
    self.bar.update(1)
    bad = bool(m["nonfinite"])
    if step % self.log_every == 0 or step == self.total or step == self.start + 1 or bad:
      now, (then, then_step) = time.perf_counter(), self._since
      rate = (step - then_step) / max(now - then, 1e-9)
      self._since = (now, step)
      row = {**m, "steps_per_sec": rate, "examples_per_sec": rate * self._batch_size}
      if self.step_flops:  # XLA's count of the step: what the rate achieves in FLOP/s
        row.update(step_gflops=self.step_flops / 1e9, gflops_per_sec=rate * self.step_flops / 1e9)
      self.write(step, row)
      self.bar.set_postfix(loss=f"{float(m['loss']):.4g}", refresh=False)
    if bad:
      self._skipped(step, m)

  def _skipped(self, step: int, m: Mapping[str, np.ndarray]) -> None:
    in_a_row = int(m["nonfinite_in_a_row"])
    logging.warning(
        "stage %r step %d: non-finite loss %s / grad norm %s; update skipped "
        "(%d in a row, %d in total)",
        self.name,
        step,
        m["loss"],
        m["grad_norm"],
        in_a_row,
        int(m["nonfinite_total"]),
    )
    if in_a_row >= self._max_bad:
      self._writer.flush()
      raise NonFiniteLossError(
          f"stage {self.name!r}: the loss or its gradients were non-finite for {in_a_row} steps "
          f"in a row (steps {step - in_a_row + 1}..{step}); those updates were skipped, so the "
          f"params are those of step {step - in_a_row}. Lower optimizer.lr, add "
          f"optimizer.grad_clip, check the data, or raise stage.max_nonfinite_in_a_row "
          f"(={self._max_bad})."
      )
