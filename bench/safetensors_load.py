"""Wall time and peak memory of reading a real ViT-S/14 .safetensors through the library.

    python -m bench.safetensors_load [--repo CHECKOUT] [--repeats 3] [--out OUT.json]

The shared DINOv2-style ViT-S/14 (../shared/fixtures/real/dinov2s14_focus_bv.npz, 21.6 M params)
is written once into a temporary timm folder (config.json + model.safetensors, timm's tensor
names), in float32 (86 MB) and in bfloat16 (43 MB). Two paths are measured on each:

  reader  `read_safetensors(file)` alone: the library's .safetensors reader, outside any
          checkpoint record (models/foreign_files.py; models/foreign.py before issue 50);
  import  `checkpoint_record.read(folder)`: what a run does with `init=` a model folder: every
          file read once inside gfile.read_once, parsed, converted to big_vision's layout and
          digested.

Each measurement is a fresh Python process (nothing cached in it; the file is in the OS page
cache after the first): `wall_s` times the call alone (imports excluded), `maxrss_mb` is the
process's peak resident memory (ru_maxrss) at the end and `rss_before_mb` its resident memory just
before the call (imports and interpreter); `hwm_mb` is the same peak from /proc/self/status
(VmHWM, the process's own), and `added_mb = hwm_mb - rss_before_mb` what the read added.
The median of `--repeats` processes is reported. `--repo` names the checkout whose linvit_jax is
measured (default: this one), so one copy of this script measures any commit whose reader is
called `read_safetensors` in linvit_jax.models.foreign_files or linvit_jax.models.foreign. The
JSON records that checkout's commit. Times mean something on a quiet machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "..", "shared", "fixtures", "real", "dinov2s14_focus_bv.npz")
DTYPES = ("float32", "bfloat16")
PATHS = ("reader", "import")
_MEAN, _STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--repo", default=REPO, help="the checkout whose linvit_jax is measured")
  p.add_argument("--fixture", default=FIXTURE, help="a big_vision ViT .npz (no head, cls token)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "safetensors_load.json"))
  p.add_argument("--measure", nargs=2, metavar=("PATH", "TARGET"), help=argparse.SUPPRESS)
  p.add_argument("--prepare", nargs=2, metavar=("FOLDER", "DTYPE"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.measure:  # inside a fresh process: one measurement, printed as JSON
    print(json.dumps(_measure(*args.measure)))
    return {}
  if args.prepare:
    write_timm_folder(args.fixture, *args.prepare)
    return {}
  repo = os.path.abspath(args.repo)
  rows = []
  with tempfile.TemporaryDirectory(prefix="safetensors_load_") as tmp:
    for dtype in DTYPES:
      # In a process of its own: a child's ru_maxrss starts from its parent's resident memory
      # at the fork (Linux keeps the high-water mark across exec), so this one stays small.
      folder = os.path.join(tmp, dtype)
      _python(repo, ["--fixture", args.fixture, "--prepare", folder, dtype])
      weights = os.path.join(folder, "model.safetensors")
      for path in PATHS:
        target = weights if path == "reader" else folder
        runs = [_run_fresh(repo, path, target) for _ in range(args.repeats)]
        rows.append(_row(dtype, path, os.path.getsize(weights), runs))
        print(json.dumps(rows[-1]["median"] | {"dtype": dtype, "path": path}), flush=True)
  result = {
      "commit": _commit(repo),
      "repo": repo,
      "date": time.ctime(),
      "load_avg": os.getloadavg(),
      "python": sys.version.split()[0],
      "safetensors": _version("safetensors"),
      "rows": rows,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  return result


def write_timm_folder(npz: str, folder: str, dtype: str) -> str:
  """A big_vision ViT (cls token, learned posemb without the cls slot, no head) as a timm folder:
  config.json + model.safetensors in timm's names and torch's layouts, cast to `dtype`."""
  import ml_dtypes
  import numpy as np
  from safetensors.numpy import save_file

  p = dict(np.load(npz))
  width = p["embedding/kernel"].shape[-1]
  heads = p["Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"].shape[1]
  depth = 1 + max(int(k.split("/")[1][len("encoderblock_") :]) for k in p if "/encoderblock_" in k)
  t = {
      "patch_embed.proj.weight": p["embedding/kernel"].transpose(3, 2, 0, 1),
      "patch_embed.proj.bias": p["embedding/bias"],
      "cls_token": p["cls"],
      "pos_embed": p["pos_embedding"],
      "norm.weight": p["Transformer/encoder_norm/scale"],
      "norm.bias": p["Transformer/encoder_norm/bias"],
  }
  for i in range(depth):
    b, a = (
        f"Transformer/encoderblock_{i}/",
        f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_0/",
    )
    qkv = [p[f"{a}{n}/kernel"].reshape(width, width).T for n in ("query", "key", "value")]
    t |= {
        f"blocks.{i}.norm1.weight": p[b + "LayerNorm_0/scale"],
        f"blocks.{i}.norm1.bias": p[b + "LayerNorm_0/bias"],
        f"blocks.{i}.norm2.weight": p[b + "LayerNorm_1/scale"],
        f"blocks.{i}.norm2.bias": p[b + "LayerNorm_1/bias"],
        f"blocks.{i}.attn.qkv.weight": np.concatenate(qkv, axis=0),
        f"blocks.{i}.attn.qkv.bias": np.concatenate(
            [p[f"{a}{n}/bias"].reshape(-1) for n in ("query", "key", "value")]
        ),
        f"blocks.{i}.attn.proj.weight": p[a + "out/kernel"].reshape(width, width).T,
        f"blocks.{i}.attn.proj.bias": p[a + "out/bias"],
        f"blocks.{i}.mlp.fc1.weight": p[b + "MlpBlock_0/Dense_0/kernel"].T,
        f"blocks.{i}.mlp.fc1.bias": p[b + "MlpBlock_0/Dense_0/bias"],
        f"blocks.{i}.mlp.fc2.weight": p[b + "MlpBlock_0/Dense_1/kernel"].T,
        f"blocks.{i}.mlp.fc2.bias": p[b + "MlpBlock_0/Dense_1/bias"],
    }
  cast = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
  os.makedirs(folder, exist_ok=True)
  save_file(
      {k: np.ascontiguousarray(v.astype(cast)) for k, v in t.items()}, f"{folder}/model.safetensors"
  )
  config = {
      "architecture": "vit_small_patch14_dinov2",
      "global_pool": "token",
      "model_args": {"num_heads": int(heads), "act_layer": "gelu"},
      "pretrained_cfg": {"mean": _MEAN, "std": _STD},
  }
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f)
  return folder


def _measure(path: str, target: str) -> dict[str, float]:
  """One measurement in this (fresh) process: everything imported first, then the call timed."""
  import numpy as np  # noqa: F401  (imported before the baseline, as the readers import it)

  if path == "reader":
    try:
      from linvit_jax.models.foreign_files import read_safetensors
    except ImportError:  # before issue 50 the reader lived in foreign.py
      from linvit_jax.models.foreign import read_safetensors
    call = lambda: read_safetensors(target)  # noqa: E731
  else:
    from linvit_jax.models import checkpoint_record

    call = lambda: checkpoint_record.read(target)  # noqa: E731
  before = _rss_mb()
  start = time.perf_counter()
  result = call()
  wall = time.perf_counter() - start
  del result
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
  return {"wall_s": wall, "maxrss_mb": peak, "hwm_mb": _hwm_mb(), "rss_before_mb": before}


def _hwm_mb() -> float:
  """VmHWM: this process's own peak resident memory (its address space's, unlike ru_maxrss,
  which also holds the parent's resident memory at the fork)."""
  with open("/proc/self/status") as f:
    line = next(x for x in f if x.startswith("VmHWM:"))
  return int(line.split()[1]) / 1024


def _rss_mb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _run_fresh(repo: str, path: str, target: str) -> dict[str, float]:
  return json.loads(_python(repo, ["--measure", path, target]).strip().splitlines()[-1])


def _python(repo: str, args: list[str]) -> str:
  """This script run with `args` in a fresh process importing `repo`'s linvit_jax; its stdout."""
  env = dict(os.environ, PYTHONPATH=repo, JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), *args],
      cwd=repo,
      env=env,
      capture_output=True,
      text=True,
      check=False,
  )
  if out.returncode:
    raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()[-2000:]}")
  return out.stdout


def _row(dtype: str, path: str, size: int, runs: list[dict[str, float]]) -> dict[str, Any]:
  median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
  median["added_mb"] = statistics.median(r["hwm_mb"] - r["rss_before_mb"] for r in runs)
  return {"dtype": dtype, "path": path, "file_mb": size / 2**20, "median": median, "runs": runs}


def _commit(repo: str) -> str:
  out = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
  )
  return out.stdout.strip() or "unknown"


def _version(package: str) -> str:
  from importlib import metadata

  return metadata.version(package)


if __name__ == "__main__":
  main()
