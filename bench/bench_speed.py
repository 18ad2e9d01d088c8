"""Speed and memory of softmax vs chunked softmax vs linear attention, one layer and whole ViT.

    python -m bench.bench_speed                      # the CPU plan (see PLANS), ~20-30 min here
    python -m bench.bench_speed --plan gpu           # the issue's full grid + cuDNN flash baseline
    python -m bench.bench_speed --plan smoke         # seconds; what tests/test_bench_smoke.py runs

For each (what ∈ {layer, vit}, image size, mode ∈ {fwd, fwdbwd}) it compiles every operator once
(AOT), reads XLA's `memory_analysis()`, and times the operators that fit round-robin together with
the reference matmul (see common.py for why). Operators whose XLA peak exceeds --max-gb, or whose
estimated run time exceeds --case-budget-s, are compiled but not run; the report says which and
why. Peak RSS needs a fresh process per point, so a few representative points run as `--probe`
subprocesses. Everything lands in one JSON (bench/results/<plan>_speed.json); report.py turns the
JSON files into RESULTS.md and the plots. One case (lowered, compiled, its FLOPs and memory)
is speed_cases.py's.

The ViT is big_vision's ViT-S/16 with a cls token (197 tokens at 224 px), built with scan=True and
remat_policy="everything_saveable": one compiled block instead of twelve (compiles ~3x faster on
this machine), the same FLOPs and saved activations as the unrolled model (no recomputation).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from bench import common
from bench import speed_cases
from linvit_jax.runtime import gfile

LINEAR = ("elu1", "relu", "hedgehog", "favor")
ALL_CPU = ("softmax", "chunked_softmax") + LINEAR
SIZES = (224, 448, 896, 1024, 1792)
MODES = ("fwd", "fwdbwd")


@dataclasses.dataclass(frozen=True)
class Group:
  """One interleaved timing group: these operators, timed together with the matmul."""

  what: str  # "layer" | "vit"
  size: int  # image side in pixels (the layer gets the ViT's token count)
  batch: int
  mode: str  # "fwd" | "fwdbwd"
  run: tuple[str, ...]  # operators to time
  memory: tuple[str, ...] = ()  # extra operators to compile for memory_analysis only
  reps: int = 5


def _plan_cpu() -> list[Group]:
  """What fits ~25 minutes on 2 idle CPU cores (~110-170 GFLOP/s matmul). The whole ViT runs
  batch 8 at 224 px and batch 1 above (a ViT-S forward+backward at 1024 px is ~40 s per image
  for softmax here); it times every operator at 224 px and above that what the targets need,
  compiling softmax / chunked / elu1 everywhere for their memory. Single layers (batch 8 / 1) at
  224 and 1024 px, every operator. Above 448 px fewer rounds (the cases are seconds each)."""
  groups = []
  for size, batch in ((224, 8), (1024, 1)):
    for mode in MODES:
      groups.append(Group("layer", size, batch, mode, run=ALL_CPU, reps=7 if size <= 448 else 5))
  vit_run = {
      224: ALL_CPU,
      448: ("softmax", "chunked_softmax", "elu1", "hedgehog"),
      896: ("elu1", "hedgehog"),
      1024: ("softmax", "chunked_softmax", "elu1", "hedgehog"),
      1792: ("elu1", "hedgehog"),
  }
  for size in SIZES:
    for mode in MODES:
      run = vit_run[size]
      memory = tuple(op for op in ("softmax", "chunked_softmax", "elu1") if op not in run)
      # relu costs what elu1 costs and favor what hedgehog costs (same shapes, an elementwise map
      # or a Dh x F projection); the 224 px groups and the layer sweep compare all four.
      reps = 5 if size <= 448 else (3 if mode == "fwd" else 2)
      groups.append(
          Group("vit", size, 8 if size == 224 else 1, mode, run=run, memory=memory, reps=reps)
      )
  return groups


def _plan_gpu() -> list[Group]:
  """The issue's grid: batch 8 (1 at 1792 px), every operator incl. cuDNN flash attention."""
  ops = ("softmax", "cudnn", "chunked_softmax") + LINEAR
  return [
      Group(what, size, 1 if size == 1792 else 8, mode, run=ops)
      for what in ("layer", "vit")
      for size in SIZES
      for mode in MODES
  ]


def _plan_smoke() -> list[Group]:
  """Toy model ("mu/16": width 32, 2 heads, depth 1) for the smoke test: every code path (timed,
  memory-only, a 4097-token layer compiled but not run, the whole ViT) in few compiles."""
  return [
      Group("layer", 64, 2, "fwd", run=("softmax", "elu1"), memory=("favor",), reps=2),
      Group(
          "layer", 1024, 1, "fwdbwd", run=("elu1",), memory=("softmax", "chunked_softmax"), reps=2
      ),
      Group("vit", 64, 1, "fwd", run=("softmax", "elu1"), reps=2),
  ]


PLANS: dict[str, Callable[[], list[Group]]] = {
    "cpu": _plan_cpu,
    "gpu": _plan_gpu,
    "smoke": _plan_smoke,
}

# Representative points for per-process peak RSS (what, op, size, batch, mode).
PROBES = {
    "cpu": [
        ("layer", "softmax", 1792, 1, "fwd"),
        ("layer", "elu1", 1792, 1, "fwd"),
        ("vit", "softmax", 224, 8, "fwdbwd"),
        ("vit", "elu1", 224, 8, "fwdbwd"),
        ("vit", "elu1", 1792, 1, "fwdbwd"),
    ],
    "gpu": [],  # device memory is what matters there: memory_analysis covers it
    "smoke": [("layer", "elu1", 64, 2, "fwd")],
}


def _assumed_efficiency(op: str) -> float:
  """For the 'would this fit the time budget' estimate only (softmax's exp is costly on CPU)."""
  return 0.5 if op in LINEAR else 0.25


# ----------------------------------------------------------------------------- the sweep


@dataclasses.dataclass(frozen=True)
class Budget:
  """The sweep's reference and limits: the matmul timed with every group, its FLOPs, the rate
  that estimates a case's run time, and the memory and time a case may take to be run."""

  ref: Callable[[], Any]
  ref_flops: float
  ref_rate: float
  max_bytes: float
  case_budget_s: float


def run_group(
    g: Group,
    *,
    budget: Budget,
    variant: str,
    dtype: str,
    log: Callable[[str], None],
    compile_workers: int = 1,
) -> list[dict[str, Any]]:
  """One group's rows: every operator lowered and compiled (a failure is a row, not a crash),
  those within the budget timed round-robin with the reference matmul."""
  n = common.tokens_for(g.size)
  ops = tuple(g.run) + tuple(g.memory)
  built = _compiled(g, ops, variant, dtype, compile_workers)
  rows, cases = [], {}
  for op in ops:
    row = dict(what=g.what, op=op, size=g.size, tokens=n, batch=g.batch, mode=g.mode)
    case = built.pop(op)
    if not isinstance(case, speed_cases.Case):
      row.update(status=case)
      rows.append(row)
      log(f"  {g.what} {g.size}px {g.mode} {op}: {row['status']}")
      continue
    row.update(flops=case.flops, memory=case.memory, compile_s=case.compile_s)
    row["status"] = _status(g, op, case, budget)
    if row["status"] == "ok":
      cases[op] = case
    rows.append(row)
    log(
        f"  {g.what} {g.size}px b{g.batch} {g.mode} {op}: compiled in {case.compile_s:.1f}s, "
        f"XLA peak {common.fmt_bytes(case.memory['peak'])}, {row['status']}"
    )
    del case
  if cases:
    _time(g, cases, rows, budget, log)
  cases.clear()
  gc.collect()
  return rows


def _compiled(
    g: Group, ops: Sequence[str], variant: str, dtype: str, compile_workers: int
) -> dict[str, speed_cases.Case | str]:
  """op -> its compiled Case, or why it failed ("n/a (... failed: ...)"). Lowered serially
  (tracing is Python), compiled by `compile_workers` threads."""
  built: dict[str, speed_cases.Case | str] = {}

  def failed(op: str, stage: str, e: Exception) -> None:
    # A failed lowering/compile is a result to report, not a crash.
    built[op] = f"n/a ({stage} failed: {type(e).__name__}: {str(e)[:160]})"

  for op in ops:
    try:
      built[op] = speed_cases.lower(
          g.what, op, g.size, g.batch, g.mode, variant=variant, dtype=dtype
      )
    except Exception as e:  # noqa: BLE001
      failed(op, "lowering", e)

  def compile_one(op: str) -> None:
    try:
      built[op].compile()
    except Exception as e:  # noqa: BLE001
      failed(op, "compile", e)

  todo = [op for op in ops if isinstance(built[op], speed_cases.Case)]
  if compile_workers > 1:
    with concurrent.futures.ThreadPoolExecutor(compile_workers) as pool:
      list(pool.map(compile_one, todo))
  else:
    for op in todo:
      compile_one(op)
  return built


def _status(g: Group, op: str, case: speed_cases.Case, budget: Budget) -> str:
  """ "ok" for a case to time, else why it is not run (memory only, memory or time budget)."""
  est_s = case.flops / (budget.ref_rate * _assumed_efficiency(op))
  if op not in g.run:
    return "memory only (not in this plan's timed set)"
  if case.memory["peak"] > budget.max_bytes:
    return (
        f"n/a (out of memory: XLA peak {case.memory['peak'] / common.GB:.1f} GB > "
        f"{budget.max_bytes / common.GB:.0f} GB budget)"
    )
  if est_s * (g.reps + 1) > budget.case_budget_s:
    return (
        f"n/a (time: ~{est_s:.0f} s/call estimated, {g.reps + 1} calls > "
        f"{budget.case_budget_s:.0f} s budget)"
    )
  return "ok"


def _time(
    g: Group,
    cases: dict[str, speed_cases.Case],
    rows: list[dict[str, Any]],
    budget: Budget,
    log: Callable[[str], None],
) -> None:
  """Times `cases` round-robin with the matmul and adds the timings to their rows."""
  t0 = time.perf_counter()
  t = common.time_interleaved(cases, reps=g.reps, reference=budget.ref)
  log(f"  timed {len(cases)} operators x {g.reps} rounds in {time.perf_counter() - t0:.0f}s")
  ref_flops = budget.ref_flops
  for row in rows:
    op = row["op"]
    if op not in cases:
      continue
    s = common.median(t.wall[op])
    row.update(
        times_s=t.wall[op],
        cpu_s=t.cpu[op],
        matmul_times_s=t.ref_wall[op],
        matmul_cpu_s=t.ref_cpu[op],
        ms=1e3 * s,
        images_per_s=g.batch / s,
        gflops=row["flops"] / s / 1e9,
        matmul_gflops=ref_flops / common.median(t.ref_wall[op]) / 1e9,
        pct_matmul=100 * common.efficiency(row["flops"], t.wall[op], ref_flops, t.ref_wall[op]),
        pct_matmul_cpu_time=100
        * common.efficiency(row["flops"], t.cpu[op], ref_flops, t.ref_cpu[op]),
        speedup_vs_softmax=(
            common.median_ratio(t.wall["softmax"], t.wall[op]) if "softmax" in t.wall else None
        ),
    )


def probe(spec: dict[str, Any]) -> dict[str, Any]:
  """Runs inside a fresh process: build, run twice, report peak RSS (and the RSS before)."""
  before = common.peak_rss_bytes()
  case = speed_cases.build(
      spec["what"],
      spec["op"],
      spec["size"],
      spec["batch"],
      spec["mode"],
      variant=spec.get("variant", "S/16"),
      dtype=spec.get("dtype", "float32"),
  )
  compiled_rss = common.peak_rss_bytes()
  for _ in range(2):
    jax.block_until_ready(case())
  return dict(
      spec,
      peak_rss=common.peak_rss_bytes(),
      rss_after_import=before,
      rss_after_compile=compiled_rss,
      xla_peak=case.memory["peak"],
  )


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--plan", default="cpu", choices=sorted(PLANS))
  p.add_argument("--out", default=None, help="JSON path (default bench/results/<plan>_speed.json)")
  p.add_argument("--only", default=None, help="comma list of what:size filters, e.g. layer:224")
  p.add_argument(
      "--max-gb",
      type=float,
      default=10.0,
      help="do not run a case whose XLA peak exceeds this (shared 24 GB machine)",
  )
  p.add_argument(
      "--case-budget-s",
      type=float,
      default=200.0,
      help="do not run a case whose estimated warm-up + reps time exceeds this",
  )
  p.add_argument(
      "--assumed-gflops",
      type=float,
      default=None,
      help="matmul rate for the time estimate (default: the one measured at start, "
      "which a busy shared machine underestimates)",
  )
  p.add_argument("--dtype", default=None, help="matmul dtype (default float32; bfloat16 on gpu)")
  p.add_argument("--ref-n", type=int, default=None, help="reference matmul size")
  p.add_argument("--variant", default="S/16")
  p.add_argument("--no-probes", action="store_true")
  p.add_argument(
      "--resume",
      action="store_true",
      help="keep the groups already in --out (each group is self-contained: its "
      "operators and matmul were interleaved together) and run the rest",
  )
  p.add_argument(
      "--compile-workers",
      type=int,
      default=1,
      help="compile a group's operators in parallel threads (GPU hosts: 8)",
  )
  p.add_argument("--probe", default=None, help=argparse.SUPPRESS)
  return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = _parser().parse_args(argv)
  if args.probe:
    print(json.dumps(probe(json.loads(args.probe))))
    return {}

  gpu = args.plan == "gpu"
  if args.plan == "smoke" and args.variant == "S/16":
    args.variant = "mu/16"
  dtype = args.dtype or ("bfloat16" if gpu else "float32")
  ref_n = args.ref_n or (8192 if gpu else 256 if args.plan == "smoke" else common.REFERENCE_N)
  out_path = args.out or os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results", f"{args.plan}_speed.json"
  )
  log = lambda s: print(s, flush=True)  # noqa: E731
  t_start = time.time()
  budget, ref_rate = _reference(args, ref_n, dtype, log)
  rows, groups = _resumed(args, out_path, log)
  probes = []

  def save(done: bool) -> dict[str, Any]:  # after every group: a crash keeps what was measured
    result = dict(
        plan=args.plan,
        dtype=dtype,
        variant=args.variant,
        machine=common.machine_summary(),
        reference=dict(n=ref_n, gflops_at_start=ref_rate / 1e9),
        max_gb=args.max_gb,
        case_budget_s=args.case_budget_s,
        complete=done,
        wall_s=time.time() - t_start,
        rows=rows,
        probes=probes,
        date=time.strftime("%Y-%m-%d %H:%M"),
    )
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with gfile.atomic_open(out_path) as f:
      json.dump(result, f, indent=1)
    return result

  for g in groups:
    log(f"[{time.time() - t_start:5.0f}s] {g.what} {g.size}px batch {g.batch} {g.mode}")
    rows += run_group(
        g,
        budget=budget,
        variant=args.variant,
        dtype=dtype,
        log=log,
        compile_workers=args.compile_workers,
    )
    save(done=False)
  if not args.no_probes and PROBES[args.plan]:
    probes += _rss_probes(
        args.plan, dtype, args.variant, lambda s: log(f"[{time.time() - t_start:5.0f}s] {s}")
    )
  result = save(done=True)
  log(f"wrote {out_path} after {result['wall_s']:.0f}s")
  return result


def _reference(
    args: argparse.Namespace, ref_n: int, dtype: str, log: Callable[[str], None]
) -> tuple[Budget, float]:
  """(the sweep's budget, the matmul rate measured at start): the ref_n³ reference matmul is
  timed once here; --assumed-gflops, when given, replaces that rate in the time estimates."""
  a = jax.random.normal(jax.random.PRNGKey(0), (ref_n, ref_n), jnp.float32).astype(dtype)
  mm = jax.jit(jnp.matmul)
  ref = lambda: mm(a, a)  # noqa: E731
  ref_flops = 2.0 * ref_n**3
  ref_rate = ref_flops / common.median(common.time_interleaved({"m": ref}, reps=5).wall["m"])
  log(f"reference matmul {ref_n}^3 {dtype}: {ref_rate / 1e9:.1f} GFLOP/s")
  est_rate = args.assumed_gflops * 1e9 if args.assumed_gflops else ref_rate
  budget = Budget(
      ref=ref,
      ref_flops=ref_flops,
      ref_rate=est_rate,
      max_bytes=args.max_gb * common.GB,
      case_budget_s=args.case_budget_s,
  )
  return budget, ref_rate


def _resumed(
    args: argparse.Namespace, out_path: str, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[Group]]:
  """(the rows kept from --out with --resume, the plan's groups still to run, filtered by
  --only: "what:size" or "what" items)."""
  groups = PLANS[args.plan]()
  if args.only:
    keep = {tuple(x.split(":")) for x in args.only.split(",")}
    groups = [g for g in groups if (g.what, str(g.size)) in keep or (g.what,) in keep]
  if not (args.resume and os.path.exists(out_path)):
    return [], groups
  with open(out_path) as f:
    rows = json.load(f)["rows"]
  done = {(r["what"], r["size"], r["mode"]) for r in rows}
  groups = [g for g in groups if (g.what, g.size, g.mode) not in done]
  log(f"resuming: {len(done)} groups kept from {out_path}, {len(groups)} to run")
  return rows, groups


def _rss_probes(
    plan: str, dtype: str, variant: str, log: Callable[[str], None]
) -> list[dict[str, Any]]:
  """Peak RSS of the plan's PROBES points, each in a fresh process, after an idle baseline."""
  idle = common.run_probe(
      "bench.bench_speed", dict(what="layer", op="elu1", size=32, batch=1, mode="fwd")
  )
  probes = [dict(idle, label="baseline (jax + a 5-token layer)")]
  for what, op, size, batch, mode in PROBES[plan]:
    log(f"RSS probe {what} {op} {size}px b{batch} {mode}")
    spec = dict(what=what, op=op, size=size, batch=batch, mode=mode, dtype=dtype, variant=variant)
    probes.append(common.run_probe("bench.bench_speed", spec))
  return probes


if __name__ == "__main__":
  main(sys.argv[1:])
