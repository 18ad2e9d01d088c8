"""Images/s per CPU core of the ImageNet-style input pipeline (JPEG decode + inception crop 224).

    python -m bench.bench_input                    # ~2 min here; writes bench/RESULTS_input.md
    python -m bench.bench_input --quick            # seconds, a smoke run (prints, writes nothing)

Data: synthetic 500x375 RGB JPEGs (smooth random fields plus noise, quality 95: near the size of an
average ImageNet JPEG), written as JFT-style TFRecords into a temporary directory, then read
through the real `make_train_iterator` (shuffle, stateless augmentation, batching, numpy).

Per core: the machine is shared, so wall time says little. Each window counts the images delivered
and the CPU seconds this process spent (all tf.data threads) meanwhile; images per CPU second is
the per-core rate, the figure that scales with the cores an input host gives the pipeline. In
steady state the work in flight at the start and at the end of a window cancel. Pipelines are
timed round-robin (fresh iterator, warm-up, window), median over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

from linvit_jax.data import input_pipeline
from linvit_jax.data import jft

LABELS = 'onehot(1000, key="labels")|keep("image", "labels")'
TRAIN_PP = "`decode_jpeg_and_inception_crop(224)`, `flip_lr` (big_vision's train pp)"
UNFUSED_PP = "`decode`, `inception_crop(224)`, `flip_lr`"
PIPELINES = {  # name -> pp string (labels: one random id of 1000 per image)
    "`decode` only (full image, no resize)": 'decode|keep("image", "labels")',
    UNFUSED_PP: f"decode|inception_crop(224)|flip_lr|value_range(-1,1)|{LABELS}",
    TRAIN_PP: f"decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)|{LABELS}",
    "`decode`, `resize_small(256)`, `central_crop(224)` (eval pp)": f"decode|resize_small(256)|central_crop(224)|value_range(-1,1)|{LABELS}",
}


def synthetic_jpegs(n: int, seed: int = 0) -> list[bytes]:
  """Photo-like JPEGs: bicubic-upsampled random 12x16 fields (smooth) plus pixel noise.

  At quality 95 they average ~115 kB, near ImageNet's ~110 kB: decode time scales with the bytes.
  """
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    field = tf.image.resize(
        rng.uniform(0, 255, (12, 16, 3)).astype(np.float32), (375, 500), method="bicubic"
    )
    image = tf.clip_by_value(field + rng.normal(0, 12, (375, 500, 3)), 0, 255)
    out.append(tf.io.encode_jpeg(tf.cast(image, tf.uint8), quality=95).numpy())
  return out


def window(pp: str, data: str, batch: int, warmup: int, batches: int) -> tuple[float, float]:
  """(images per wall second, images per CPU second) of one steady-state window."""
  it = input_pipeline.make_train_iterator(
      dataset=data,
      split="train",
      pp=pp,
      global_batch_size=batch,
      seed=0,
      shuffle_buffer=256,
      process_index=0,
      process_count=1,
  )
  for _ in range(warmup):
    next(it)
  time.sleep(0.5)  # Let prefetching fill up: steady state at the window's start.
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(batches):
    next(it)
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  del it
  n = batch * batches
  return n / wall, n / cpu


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--images", type=int, default=512)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--batches", type=int, default=12, help="timed batches per window")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--quick", action="store_true", help="tiny smoke run, writes nothing")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS_input.md"))
  args = parser.parse_args()
  if args.quick:
    args.images, args.batch, args.batches, args.rounds = 16, 8, 2, 1

  jpegs = synthetic_jpegs(args.images)
  rng = np.random.default_rng(1)
  with tempfile.TemporaryDirectory() as tmp:
    jft.write_tfrecords(
        os.path.join(tmp, "train"), ((j, [int(rng.integers(1000))]) for j in jpegs), num_shards=4
    )
    data = f"jft:{tmp}/train-*.tfrecord"
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in PIPELINES}
    for r in range(args.rounds):
      for name, pp in PIPELINES.items():
        results[name].append(window(pp, data, args.batch, 3, args.batches))
        print(
            f"round {r}: {name}: {results[name][-1][0]:.0f} img/s wall, "
            f"{results[name][-1][1]:.0f} img/CPU-s",
            flush=True,
        )
  text = _results_md(args, np.mean([len(j) for j in jpegs]) / 1e3, results)
  print(text)
  if not args.quick:
    with open(args.out, "w") as f:
      f.write(text)


def _results_md(
    args: argparse.Namespace, mean_kb: float, results: dict[str, list[tuple[float, float]]]
) -> str:
  """RESULTS_input.md: the setup, one row per pipeline (median per-core and wall rates) and
  what the train pipeline's rate means in cores."""
  load = os.getloadavg()[0]
  lines = [
      "# Input pipeline throughput (bench/bench_input.py)",
      "",
      f"Synthetic {args.images} RGB JPEGs of 500x375 (mean {mean_kb:.0f} kB, quality 95) in 4 "
      "JFT-style TFRecord shards, read by `make_train_iterator` (shuffle "
      f"buffer 256, batch {args.batch}, numpy out). Median of {args.rounds} rounds of "
      f"{args.batches} timed batches. Machine: {os.cpu_count()} CPU cores, shared "
      f"(1-min load average {load:.1f} at the end); tensorflow {tf.__version__}.",
      "",
      "**Per core** = images per CPU-second of this process (all tf.data threads), the rate one "
      "core sustains; **wall** = images per second on this (busy) machine, for reference.",
      "",
      "| pipeline (pp) | images/s per core | images/s wall |",
      "|---|---:|---:|",
  ]
  per_core = {}
  for name, values in results.items():
    wall = statistics.median(v[0] for v in values)
    per_core[name] = statistics.median(v[1] for v in values)
    lines.append(f"| {name} | {per_core[name]:.0f} | {wall:.0f} |")
  train = per_core[TRAIN_PP]
  lines += [
      "",
      f"Reading: the train pipeline needs about one core per {train:.0f} images/s of training "
      f"(e.g. {1000 / train:.1f} cores for 1000 images/s). Decoding only the crop window "
      f"(`decode_jpeg_and_inception_crop`) is {train / per_core[UNFUSED_PP]:.2f}x the rate of "
      "decoding the whole image then cropping. On a loaded machine CPU time is inflated "
      "(shared caches, hyper-threads), so these per-core rates are lower bounds.",
  ]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
