"""metrics.jsonl and TensorBoard events, on a local path and through TensorFlow's file layer.

`ram://` is TensorFlow's in-memory file system: it is reached through the same tf.io.gfile
layer as gs://, so a writer that works there works on a gs:// workdir (no GCS client needed).
"""

import os

import pytest
import tensorflow as tf

from linvit_jax.runtime import metrics as metrics_lib


def _events(logdir: str) -> dict[str, list[tuple[int, float]]]:
  files = [f for f in tf.io.gfile.listdir(logdir) if f.startswith("events.out.tfevents")]
  assert len(files) == 1, files
  out: dict[str, list[tuple[int, float]]] = {}
  for raw in tf.data.TFRecordDataset(os.path.join(logdir, files[0])):
    event = tf.compat.v1.Event.FromString(raw.numpy())
    for v in event.summary.value:
      value = float(tf.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
      out.setdefault(v.tag, []).append((event.step, value))
  return out


@pytest.mark.parametrize("root", ["local", "ram"])
def test_scalars_reach_jsonl_and_tensorboard(root, tmp_path):
  logdir = str(tmp_path / "stage") if root == "local" else f"ram://metrics_test_{os.getpid()}/stage"
  writer = metrics_lib.MetricWriter(logdir)
  writer.write(1, {"loss": 2.5, "lr": 1e-3, "nonfinite": False})
  writer.write(2, {"loss": float("nan"), "lr": 2e-3, "nonfinite": True})
  writer.close()
  rows = metrics_lib.read_jsonl(os.path.join(logdir, metrics_lib.METRICS_FILE))
  assert rows == [
      {"step": 1, "loss": 2.5, "lr": 1e-3, "nonfinite": 0},
      {"step": 2, "loss": None, "lr": 2e-3, "nonfinite": 1},
  ]
  events = _events(logdir)
  assert events["loss"] == [(1, 2.5)]  # the non-finite loss is not an event
  assert [s for s, _ in events["lr"]] == [1, 2]
  assert events["lr"][1][1] == pytest.approx(2e-3)
  assert events["nonfinite"] == [(1, 0.0), (2, 1.0)]


def test_resume_trims_rows_past_the_checkpoint(tmp_path):
  logdir = str(tmp_path / "stage")
  writer = metrics_lib.MetricWriter(logdir, tensorboard=False)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  writer.close()
  writer = metrics_lib.MetricWriter(logdir, tensorboard=False, resume_step=2)
  writer.write(3, {"loss": 30.0})
  writer.close()
  rows = metrics_lib.read_jsonl(os.path.join(logdir, metrics_lib.METRICS_FILE))
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
  assert not any(f.startswith("events") for f in os.listdir(logdir))
