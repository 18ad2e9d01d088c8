"""Scalar metrics of a stage: one JSON object per line (metrics.jsonl) plus TensorBoard events.

Only the main process writes (`enabled=False` elsewhere). The jsonl file is the source of truth
(a resumed stage trims it back to its checkpoint and appends); TensorBoard is for looking at.
Both go through TensorFlow's file layer (linvit_jax.runtime.gfile / tf.summary) for remote paths, so a gs://
workdir gets its events with the packages we install (tensorflow-cpu, no separate GCS client).
View them with `pip install tensorboard` and `tensorboard --logdir <workdir>`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from linvit_jax.runtime import gfile

METRICS_FILE = "metrics.jsonl"


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
  if not gfile.exists(path):
    return []
  rows = []
  with gfile.open(path, "r") as f:
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

  def __init__(
      self, logdir: str, *, enabled: bool = True, tensorboard: bool = True, resume_step: int = 0
  ):
    """`resume_step`: keep only rows up to this step (a killed run logged past its checkpoint)."""
    self.path = os.path.join(logdir, METRICS_FILE)
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    gfile.makedirs(logdir)
    if gfile.exists(self.path):  # rewrite: drops rows past the checkpoint and a torn last line
      kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
      gfile.write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
    self._file = gfile.open(self.path, "a")
    if tensorboard:
      try:
        self._tb = _SummaryWriter(logdir)
      except Exception as e:  # (TensorBoard is optional)
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
      self._tb.scalars(int(step), {k: v for k, v in row.items() if k != "step" and v is not None})
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
        self._tb.close()


class _SummaryWriter:
  """TensorBoard scalars through TensorFlow's own summary writer: one events file per stage
  directory, written through tf.io.gfile (local, gs://, and every other registered scheme)."""

  def __init__(self, logdir: str):
    import tensorflow as tf  # (only when events are wanted)

    self._tf = tf
    self._writer = tf.summary.create_file_writer(logdir, flush_millis=30_000)
    # tf.summary.scalar lives in the `tensorboard` package (not installed with tensorflow-cpu);
    # its event is tf.summary.write with the scalars plugin's metadata, which core TF has.
    self._metadata = tf.compat.v1.SummaryMetadata(
        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
    ).SerializeToString()

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    with self._writer.as_default(step=step):
      for k, v in values.items():
        self._tf.summary.write(
            k, self._tf.constant(v, self._tf.float32), step=step, metadata=self._metadata
        )

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    try:
      self._writer.close()
    except self._tf.errors.OpError as e:  # e.g. a full disk: an OSError, as the jsonl file's
      raise OSError(f"TensorBoard events: {e.message}") from e


def top1_hits(logits: Any, labels: Any) -> Any:
  """Per-example top-1 hits as float32 [B] (a stage's accuracy metric and evaluation's top-1):
  one-hot or multi-hot labels [B, C] count a hit when the top-scoring class is positive, integer
  labels [B] when it is equal."""
  import jax.numpy as jnp  # (this module is otherwise jax-free)

  pred = jnp.argmax(logits, axis=-1)
  if labels.ndim == 2:
    hit = jnp.take_along_axis(labels, pred[:, None], axis=-1)[:, 0] > 0
  else:
    hit = pred == labels
  return hit.astype(jnp.float32)
