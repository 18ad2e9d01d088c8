"""What every benchmark here shares: interleaved timing, the matmul reference, FLOPs, memory.

Why interleaved: this machine is shared, so absolute times drift by 2-10x within minutes. Every
figure we report is therefore a ratio of cases timed round-robin in one run (round r runs the
reference matmul, case A, the reference, case B, the reference, ...), first call (warm-up)
excluded: ratios are taken within each round and the median over rounds is reported, and each
case's "% of the matmul rate" uses the reference calls right next to it.

FLOPs are counted analytically (2 per multiply-add, matmuls and attention contractions only;
elementwise work is overhead we want to see, not count). A backward pass is counted as twice its
forward (the usual 3x for forward+backward), for every operator alike.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.models.variants import decode_variant

REFERENCE = "matmul"  # case name of the reference matmul inside every timing group
REFERENCE_N = 2048  # n×n @ n×n float32: large enough for the BLAS to run at its best
GB = 1e9


# ----------------------------------------------------------------------------- timing


def reference_matmul(n: int = REFERENCE_N) -> tuple[Callable[[], Any], float]:
  """A zero-argument case for the n³ float32 matmul and its FLOPs."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  return (lambda: f(a, b)), 2.0 * n**3


@dataclasses.dataclass
class Timings:
  """Per case, one entry per round. `ref_*` is the reference matmul timed right before and right
  after that case's call in the same round (their mean): on a machine whose load changes by the
  second, a case is compared with the reference measured next to it, not minutes away."""

  wall: dict[str, list[float]]
  cpu: dict[str, list[float]]  # process CPU seconds (all threads) per call
  ref_wall: dict[str, list[float]]
  ref_cpu: dict[str, list[float]]


def _timed_call(fn: Callable[[], Any]) -> tuple[float, float]:
  c0, t0 = time.process_time(), time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0, time.process_time() - c0


def time_interleaved(
    cases: Mapping[str, Callable[[], Any]],
    reps: int,
    warmup: int = 1,
    reference: Callable[[], Any] | None = None,
) -> Timings:
  """Times zero-argument cases round-robin, `reps` rounds after `warmup` untimed ones; every call
  is blocked on. With a `reference`, each round runs ref, A, ref, B, ref, ... so that every case
  has a (timed) reference call on both sides."""
  if reps < 1:
    raise ValueError(f"reps must be >= 1, got {reps}")
  for _ in range(warmup):
    for fn in list(cases.values()) + ([reference] if reference else []):
      jax.block_until_ready(fn())
  t = Timings(
      {n: [] for n in cases}, {n: [] for n in cases}, {n: [] for n in cases}, {n: [] for n in cases}
  )
  for _ in range(reps):
    before = _timed_call(reference) if reference else None
    for name, fn in cases.items():
      wall, cpu = _timed_call(fn)
      t.wall[name].append(wall)
      t.cpu[name].append(cpu)
      if reference:
        # One untimed call first: right after a case that freed gigabytes, the next call pays for
        # the allocator and the kernel reclaiming memory, which is not the matmul's speed.
        jax.block_until_ready(reference())
        after = _timed_call(reference)
        t.ref_wall[name].append((before[0] + after[0]) / 2)
        t.ref_cpu[name].append((before[1] + after[1]) / 2)
        before = after
  return t


def efficiency(flops: float, secs: list[float], ref_flops: float, ref_secs: list[float]) -> float:
  """Median over rounds of (this case's FLOP rate) / (the adjacent reference's FLOP rate)."""
  return float(np.median([(flops / s) / (ref_flops / r) for s, r in zip(secs, ref_secs)]))


def median_ratio(num: list[float], den: list[float]) -> float:
  """Median over rounds of num[r] / den[r] (both timed in the same round)."""
  return float(np.median(np.asarray(num) / np.asarray(den)))


def median(xs: list[float]) -> float:
  return float(np.median(np.asarray(xs)))


# ----------------------------------------------------------------------------- FLOPs


def vit_dims(variant: str) -> dict[str, int]:
  v = decode_variant(variant)
  width = v["width"]
  return dict(
      width=width,
      depth=v["depth"],
      heads=v["num_heads"],
      mlp=v.get("mlp_dim") or 4 * width,
      patch=v["patch_size"][0],
      head_dim=width // v["num_heads"],
  )


def tokens_for(image_size: int, patch: int = 16, cls_token: bool = True) -> int:
  return (image_size // patch) ** 2 + int(cls_token)


def num_features(spec: attn_lib.AttentionSpec, head_dim: int) -> int:
  """Width F of φ(x) per head, as feature_maps.py builds it."""
  if spec.feature_map in ("elu1", "relu"):
    return head_dim
  if spec.feature_map == "hedgehog":
    return 2 * (spec.num_features or head_dim)
  if spec.feature_map == "favor":
    return spec.num_features or 2 * head_dim
  raise ValueError(f"no FLOP count for feature map {spec.feature_map!r}")


def attention_core_flops(spec: attn_lib.AttentionSpec, n: int, heads: int, head_dim: int) -> float:
  """Forward FLOPs of `attend(q, k, v)` (plus the feature maps) for one image of n tokens."""
  if spec.kind in ("softmax", "chunked_softmax"):
    keys = n
    side = int(round((n - 1) ** 0.5))  # counted for one cls token and a square grid, else all n
    if spec.key_grid and side * side == n - 1:  # the cls key and the pooled patch keys
      keys = 1 + attention_ops.pooled_grid_side(side, spec.key_grid) ** 2
    return 2 * 2.0 * n * keys * heads * head_dim  # q·kᵀ and weights·v
  f = num_features(spec, head_dim)
  core = 2 * 2.0 * n * heads * f * head_dim + 2 * 2.0 * n * heads * f  # φ(k)ᵀv, φ(q)·kv; sums
  if spec.feature_map == "hedgehog":
    core += 2 * 2.0 * n * heads * head_dim * (f // 2)  # q and k through W [Dh, F/2]
  elif spec.feature_map == "favor":
    core += 2 * 2.0 * n * heads * head_dim * f  # q and k through W [F, Dh]
  return core


def attention_layer_flops(spec: attn_lib.AttentionSpec, n: int, width: int, heads: int) -> float:
  """Forward FLOPs of one attention sublayer (q, k, v, out projections + core), one image."""
  return 4 * 2.0 * n * width * width + attention_core_flops(spec, n, heads, width // heads)


def vit_flops(
    spec: attn_lib.AttentionSpec,
    image_size: int,
    variant: str = "S/16",
    num_classes: int = 1000,
    cls_token: bool = True,
) -> float:
  """Forward FLOPs of the whole ViT (patch embedding, blocks, head) for one image."""
  d = vit_dims(variant)
  n = tokens_for(image_size, d["patch"], cls_token)
  patches = tokens_for(image_size, d["patch"], cls_token=False)
  stem = 2.0 * patches * d["patch"] ** 2 * 3 * d["width"]
  block = (
      attention_layer_flops(spec, n, d["width"], d["heads"]) + 2 * 2.0 * n * d["width"] * d["mlp"]
  )
  return stem + d["depth"] * block + 2.0 * d["width"] * num_classes


# ----------------------------------------------------------------------------- memory


def memory_stats(compiled: Any) -> dict[str, float]:
  """XLA's own accounting for one call of a compiled executable (nothing runs): bytes of
  arguments, outputs, temporaries, and the peak of its buffer assignment."""
  stats = compiled.memory_analysis()
  out = dict(
      argument=stats.argument_size_in_bytes,
      output=stats.output_size_in_bytes,
      alias=stats.alias_size_in_bytes,
      temp=stats.temp_size_in_bytes,
  )
  peak = getattr(stats, "peak_memory_in_bytes", 0) or 0
  out["peak"] = max(peak, out["argument"] + out["output"] + out["temp"] - out["alias"])
  return {k: float(v) for k, v in out.items()}


def peak_rss_bytes() -> float:
  """This process's peak resident set size so far (Linux reports KiB)."""
  return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def run_probe(module: str, probe: Mapping[str, Any], timeout_s: float = 900) -> dict[str, Any]:
  """Runs `python -m <module> --probe '<json>'` in a fresh process (peak RSS only ever grows, so
  each configuration needs its own) and returns the JSON line it prints last."""
  env = dict(os.environ)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run(
      [sys.executable, "-m", module, "--probe", json.dumps(dict(probe))],
      capture_output=True,
      text=True,
      timeout=timeout_s,
      env=env,
      cwd=repo,
  )
  if proc.returncode != 0:
    return {"error": f"probe exited {proc.returncode}: {proc.stderr.strip()[-400:]}"}
  return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- formatting


def fmt_bytes(b: float | None) -> str:
  if b is None or (isinstance(b, float) and np.isnan(b)):
    return "–"
  if b >= GB:
    return f"{b / GB:.2f} GB"
  return f"{b / 1e6:.0f} MB"


def fmt(x: float | None, spec: str = ".2f") -> str:
  if x is None or (isinstance(x, float) and np.isnan(x)):
    return "–"
  return format(x, spec)


def machine_summary() -> dict[str, Any]:
  dev = jax.devices()[0]
  return dict(
      backend=jax.default_backend(),
      device=getattr(dev, "device_kind", str(dev)),
      num_devices=jax.device_count(),
      cpus=os.cpu_count(),
      jax=jax.__version__,
      load_avg=os.getloadavg() if hasattr(os, "getloadavg") else None,
  )


def git_commit(repo: str) -> str:
  """The short hash of `repo`'s HEAD, or "unknown" outside a checkout (what a result records)."""
  out = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
  )
  return out.stdout.strip() or "unknown"


def save_result(result: Mapping[str, Any], path: str, table: Callable[[Any], str]) -> None:
  """Writes a bench's result JSON to `path` (its folder made) and prints its markdown table."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print(table(result))


def result_footer(result: Mapping[str, Any], what: str = "") -> str:
  """The line under a bench table: the machine, jax, commit, date, `what` was timed, the load
  average at the start, and the rounds and batch the medians are over."""
  m = result["machine"]
  load = ", ".join(f"{x:.2f}" for x in m["load_avg"] or ())
  return (
      f"\n{m['backend']} {m['device']} ({m['cpus']} CPUs), jax {m['jax']}, commit "
      f"{result['commit']}, {result['date']}; {what + '; ' if what else ''}load average at the "
      f"start {load}; median of {result['reps']} interleaved rounds, batch "
      f"{result.get('batch', 1)}.\n"
  )


def load_result(path: str) -> dict[str, Any]:
  """A bench's result JSON, as save_result wrote it (for --table)."""
  with open(path) as f:
    return json.load(f)
