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
JSON files into RESULTS.md and the plots.

The ViT is big_vision's ViT-S/16 with a cls token (197 tokens at 224 px), built with scan=True and
remat_policy="everything_saveable": one compiled block instead of twelve (compiles ~3x faster on
this machine), the same FLOPs and saved activations as the unrolled model (no recomputation).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from bench import common
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.models import vit
from linvit_jax.runtime import gfile

OPERATORS = {
    "softmax": attn_lib.AttentionSpec(kind="softmax"),
    "chunked_softmax": attn_lib.AttentionSpec(kind="chunked_softmax"),
    "elu1": attn_lib.AttentionSpec(kind="linear", feature_map="elu1"),
    "relu": attn_lib.AttentionSpec(kind="linear", feature_map="relu"),
    "hedgehog": attn_lib.AttentionSpec(kind="linear", feature_map="hedgehog"),
    "favor": attn_lib.AttentionSpec(kind="linear", feature_map="favor"),
    # GPU only: softmax whose aggregation is cuDNN's fused flash attention (bf16).
    "cudnn": attn_lib.AttentionSpec(kind="softmax"),
}
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


# ----------------------------------------------------------------------------- cases


@contextlib.contextmanager
def _cudnn_softmax(enabled: bool) -> Iterator[None]:
  """While tracing, softmax attention becomes cuDNN's fused kernel (bf16 in, bf16 out)."""
  if not enabled:
    yield
    return
  original = attention_ops.softmax_attention

  def cudnn(q, k, v):
    dt = q.dtype
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    return jax.nn.dot_product_attention(q, k, v, implementation="cudnn").astype(dt)

  attention_ops.softmax_attention = cudnn
  try:
    yield
  finally:
    attention_ops.softmax_attention = original


@dataclasses.dataclass
class Case:
  lowered: Any  # traced and lowered, not yet compiled
  args: tuple
  flops: float  # analytic FLOPs of one call
  lower_s: float
  fn: Any = None  # the AOT-compiled executable, after compile()
  memory: dict[str, float] | None = None
  compile_s: float = 0.0

  def compile(self) -> Case:
    t0 = time.perf_counter()
    self.fn = self.lowered.compile()
    self.compile_s = self.lower_s + time.perf_counter() - t0
    self.memory = common.memory_stats(self.fn)
    self.lowered = None
    return self

  def __call__(self):
    return self.fn(*self.args)


def build(what: str, op: str, size: int, batch: int, mode: str, **kw: Any) -> Case:
  """Compiles one (what, operator, size, batch, mode) and counts its FLOPs; runs nothing."""
  return lower(what, op, size, batch, mode, **kw).compile()


def lower(
    what: str,
    op: str,
    size: int,
    batch: int,
    mode: str,
    *,
    variant: str = "S/16",
    dtype: str = "float32",
    seed: int = 0,
) -> Case:
  """Traces and lowers one case (serially: tracing is Python, and the cuDNN swap is global);
  `Case.compile()` may then run in a thread pool."""
  spec = OPERATORS[op]
  dims = common.vit_dims(variant)
  n = common.tokens_for(size, dims["patch"])
  rng = jax.random.PRNGKey(seed)
  k_init, k_x, k_ct = jax.random.split(rng, 3)
  if what == "layer":
    module = attn_lib.Attention(num_heads=dims["heads"], spec=spec, dtype_mm=dtype)
    x = jax.random.normal(k_x, (batch, n, dims["width"]), jnp.float32)
    params = jax.jit(module.init)(k_init, x)
    fwd_flops = common.attention_layer_flops(spec, n, dims["width"], dims["heads"])
    if mode == "fwd":
      fn, args = jax.jit(module.apply), (params, x)
    else:
      # A fixed random cotangent: a real backward (d params and d input), nothing XLA can fold.
      ct = jax.random.normal(k_ct, x.shape, jnp.float32)
      fn = jax.jit(lambda p, x, ct: jax.vjp(module.apply, p, x)[1](ct))
      args = (params, x, ct)
  elif what == "vit":
    model = vit.Model(
        1000,
        variant=variant,
        attention=spec,
        pool_type="tok",
        scan=True,
        remat_policy="everything_saveable",
        dtype_mm=dtype,
    )
    images = jax.random.normal(k_x, (batch, size, size, 3), jnp.float32)
    labels = jax.random.randint(k_ct, (batch,), 0, 1000)
    params = jax.jit(model.init)(k_init, images[:1])
    fwd_flops = common.vit_flops(spec, size, variant)
    if mode == "fwd":
      fn, args = jax.jit(lambda p, im: model.apply(p, im)[0]), (params, images)
    else:

      def loss(p, im, y):
        logits = model.apply(p, im)[0].astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], -1))

      fn, args = jax.jit(jax.value_and_grad(loss)), (params, images, labels)
  else:
    raise ValueError(f"unknown benchmark target {what!r}; known: layer, vit")
  t0 = time.perf_counter()
  with _cudnn_softmax(op == "cudnn"):
    lowered = fn.lower(*args)
  flops = batch * fwd_flops * (1 if mode == "fwd" else 3)
  return Case(lowered, args, flops, time.perf_counter() - t0)


def _assumed_efficiency(op: str) -> float:
  """For the 'would this fit the time budget' estimate only (softmax's exp is costly on CPU)."""
  return 0.5 if op in LINEAR else 0.25


# ----------------------------------------------------------------------------- the sweep


def run_group(
    g: Group,
    *,
    ref: Callable[[], Any],
    ref_flops: float,
    ref_rate: float,
    max_bytes: float,
    case_budget_s: float,
    variant: str,
    dtype: str,
    log: Callable[[str], None],
    compile_workers: int = 1,
) -> list[dict[str, Any]]:
  rows, cases, built = [], {}, {}
  n = common.tokens_for(g.size)
  ops = tuple(g.run) + tuple(g.memory)

  def failed(op: str, stage: str, e: Exception) -> None:
    # A failed lowering/compile is a result to report, not a crash.
    built[op] = f"n/a ({stage} failed: {type(e).__name__}: {str(e)[:160]})"

  for op in ops:
    try:
      built[op] = lower(g.what, op, g.size, g.batch, g.mode, variant=variant, dtype=dtype)
    except Exception as e:  # noqa: BLE001
      failed(op, "lowering", e)

  def compile_one(op: str) -> None:
    try:
      built[op].compile()
    except Exception as e:  # noqa: BLE001
      failed(op, "compile", e)

  todo = [op for op in ops if isinstance(built[op], Case)]
  if compile_workers > 1:
    with concurrent.futures.ThreadPoolExecutor(compile_workers) as pool:
      list(pool.map(compile_one, todo))
  else:
    for op in todo:
      compile_one(op)

  for op in ops:
    row = dict(what=g.what, op=op, size=g.size, tokens=n, batch=g.batch, mode=g.mode)
    case = built.pop(op)
    if not isinstance(case, Case):
      row.update(status=case)
      rows.append(row)
      log(f"  {g.what} {g.size}px {g.mode} {op}: {row['status']}")
      continue
    row.update(flops=case.flops, memory=case.memory, compile_s=case.compile_s)
    est_s = case.flops / (ref_rate * _assumed_efficiency(op))
    if op not in g.run:
      row["status"] = "memory only (not in this plan's timed set)"
    elif case.memory["peak"] > max_bytes:
      row["status"] = (
          f"n/a (out of memory: XLA peak {case.memory['peak'] / common.GB:.1f} GB > "
          f"{max_bytes / common.GB:.0f} GB budget)"
      )
    elif est_s * (g.reps + 1) > case_budget_s:
      row["status"] = (
          f"n/a (time: ~{est_s:.0f} s/call estimated, {g.reps + 1} calls > "
          f"{case_budget_s:.0f} s budget)"
      )
    else:
      row["status"] = "ok"
      cases[op] = case
    rows.append(row)
    log(
        f"  {g.what} {g.size}px b{g.batch} {g.mode} {op}: compiled in {case.compile_s:.1f}s, "
        f"XLA peak {common.fmt_bytes(case.memory['peak'])}, {row['status']}"
    )
    del case
  if cases:
    t0 = time.perf_counter()
    t = common.time_interleaved(cases, reps=g.reps, reference=ref)
    log(f"  timed {len(cases)} operators x {g.reps} rounds in {time.perf_counter() - t0:.0f}s")
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
  cases.clear()
  gc.collect()
  return rows


def probe(spec: dict[str, Any]) -> dict[str, Any]:
  """Runs inside a fresh process: build, run twice, report peak RSS (and the RSS before)."""
  before = common.peak_rss_bytes()
  case = build(
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


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
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
  args = p.parse_args(argv)

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

  a = jax.random.normal(jax.random.PRNGKey(0), (ref_n, ref_n), jnp.float32).astype(dtype)
  mm = jax.jit(jnp.matmul)
  ref = lambda: mm(a, a)  # noqa: E731
  ref_flops = 2.0 * ref_n**3
  ref_rate = ref_flops / common.median(common.time_interleaved({"m": ref}, reps=5).wall["m"])
  log(f"reference matmul {ref_n}^3 {dtype}: {ref_rate / 1e9:.1f} GFLOP/s")
  est_rate = args.assumed_gflops * 1e9 if args.assumed_gflops else ref_rate

  groups = PLANS[args.plan]()
  if args.only:
    keep = {tuple(x.split(":")) for x in args.only.split(",")}
    groups = [g for g in groups if (g.what, str(g.size)) in keep or (g.what,) in keep]
  rows, probes = [], []
  if args.resume and os.path.exists(out_path):
    with open(out_path) as f:
      rows = json.load(f)["rows"]
    done = {(r["what"], r["size"], r["mode"]) for r in rows}
    groups = [g for g in groups if (g.what, g.size, g.mode) not in done]
    log(f"resuming: {len(done)} groups kept from {out_path}, {len(groups)} to run")

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
        ref=ref,
        ref_flops=ref_flops,
        ref_rate=est_rate,
        max_bytes=args.max_gb * common.GB,
        case_budget_s=args.case_budget_s,
        variant=args.variant,
        dtype=dtype,
        log=log,
        compile_workers=args.compile_workers,
    )
    save(done=False)

  if not args.no_probes and PROBES[args.plan]:
    idle = common.run_probe(
        "bench.bench_speed", dict(what="layer", op="elu1", size=32, batch=1, mode="fwd")
    )
    probes.append(dict(idle, label="baseline (jax + a 5-token layer)"))
    for what, op, size, batch, mode in PROBES[args.plan]:
      log(f"[{time.time() - t_start:5.0f}s] RSS probe {what} {op} {size}px b{batch} {mode}")
      probes.append(
          common.run_probe(
              "bench.bench_speed",
              dict(
                  what=what,
                  op=op,
                  size=size,
                  batch=batch,
                  mode=mode,
                  dtype=dtype,
                  variant=args.variant,
              ),
          )
      )

  result = save(done=True)
  log(f"wrote {out_path} after {result['wall_s']:.0f}s")
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
