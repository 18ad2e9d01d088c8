"""The targets of issue #13 as (target, measured, verdict) rows, computed from the benchmark JSON,
never typed by hand: the linear ViT's speed-up over softmax and chunked softmax at 1024 px, the
default map's parity at 224 px, the share of the matmul rate, peak memory, the distillation
step's cost.
"""

from __future__ import annotations

from bench import speed_rows
from bench.common import fmt_bytes

TARGET_LINEAR = "elu1"  # "linear" in the targets: the plain kernel map; the others are reported
Row = tuple[str, str, str]

DEFAULT_MAP = "hedgehog"  # the feature map configs/demo.py, ablation.py and imagenet_vit.py use


def targets(speed: dict | None, steps: dict | None) -> list[Row]:
  """(target, measured, verdict) rows of issue #13, computed from the JSON, never typed by hand."""
  out = []
  if speed:
    out += _speedup_targets(speed)
    out.append(_default_map_target(speed))
    out += _matmul_share_targets(speed)
    out += _memory_targets(speed)
  if steps:
    d = next(r for r in steps["rows"] if r["name"] == "distill_step")
    out.append(
        (
            "ViT-S/16 distillation step cost vs a plain student fwd+bwd (for reference)",
            f"{d['cost_vs_student_fwdbwd']:.2f}×",
            "reported",
        )
    )
  return out


def _speedup_targets(speed: dict) -> list[Row]:
  """The linear ViT (elu1 and the default map) ≥ 5× softmax and ≥ 2× chunked at 1024 px."""
  out = []
  for other, factor, label in (("softmax", 5, "softmax"), ("chunked_softmax", 2, "chunked")):
    parts, verdicts = [], []
    for op in ("elu1", DEFAULT_MAP):
      for mode in ("fwd", "fwdbwd"):
        lin, ref = (speed_rows.find(speed, "vit", mode, 1024, o) for o in (op, other))
        if speed_rows.timed(lin) and speed_rows.timed(ref):
          x = speed_rows.speedup(lin, ref)
          parts.append(f"{op} {mode} {x:.2f}×")
          verdicts.append(x >= factor)
    out.append(
        (
            f"linear ViT ≥ {factor}× {label} images/s at 1024 px",
            ", ".join(parts) or "n/a",
            verdict(verdicts),
        )
    )
  return out


def _default_map_target(speed: dict) -> Row:
  """The default feature map at ≥ 0.95× softmax's images/s at 224 px."""
  parts, verdicts = [], []
  for mode in ("fwd", "fwdbwd"):
    lin, ref = (speed_rows.find(speed, "vit", mode, 224, o) for o in (DEFAULT_MAP, "softmax"))
    if speed_rows.timed(lin) and speed_rows.timed(ref):
      x = speed_rows.speedup(lin, ref)
      parts.append(f"{DEFAULT_MAP} {mode} {x:.2f}×")
      verdicts.append(x >= 0.95)
  return (
      f"default map ({DEFAULT_MAP}) ≥ 0.95× softmax images/s at 224 px",
      ", ".join(parts) or "n/a",
      verdict(verdicts),
  )


def _matmul_share_targets(speed: dict) -> list[Row]:
  """The linear ViT at ≥ 90 % (fwd) / 80 % (fwd+bwd) of the matmul rate at ≥ 448 px."""
  out = []
  for mode, floor in (("fwd", 90), ("fwdbwd", 80)):
    parts, verdicts = [], []
    for size in sorted({r["size"] for r in speed["rows"] if r["size"] >= 448}):
      r = speed_rows.find(speed, "vit", mode, size, TARGET_LINEAR)
      if speed_rows.timed(r):
        parts.append(f"{size}px {r['pct_matmul']:.0f} %")
        verdicts.append(r["pct_matmul"] >= floor)
    out.append(
        (
            f"linear ({TARGET_LINEAR}) ViT {mode} ≥ {floor} % of the matmul rate at ≥ 448 px",
            ", ".join(parts) or "n/a",
            verdict(verdicts),
        )
    )
  return out


def _memory_targets(speed: dict) -> list[Row]:
  """Peak memory (XLA memory_analysis) of the linear ViT at 1792 px and of chunked softmax's
  fwd+bwd at 1024 px, against softmax's."""
  out = []
  for size, op, mode, limit, label in (
      (1792, TARGET_LINEAR, "fwd", 1 / 5, "linear ViT peak memory at 1792 px ≤ 1/5 of softmax's"),
      (
          1024,
          "chunked_softmax",
          "fwdbwd",
          1 / 4,
          "chunked softmax ViT fwd+bwd peak memory at 1024 px ≤ 1/4 of softmax's",
      ),
  ):
    parts, verdicts = [], []
    modes = ("fwd", "fwdbwd") if op == TARGET_LINEAR else (mode,)
    for m in modes:
      a, ref = (speed_rows.find(speed, "vit", m, size, o) for o in (op, "softmax"))
      if a and ref and "memory" in a and "memory" in ref:
        x = a["memory"]["peak"] / ref["memory"]["peak"]
        parts.append(
            f"{m} {100 * x:.1f} % ({fmt_bytes(a['memory']['peak'])} vs "
            f"{fmt_bytes(ref['memory']['peak'])})"
        )
        verdicts.append(x <= limit)
    out.append((label + " (XLA memory_analysis)", ", ".join(parts) or "n/a", verdict(verdicts)))
  return out


def distill_real_target(real: dict | None) -> list[Row]:
  """The distill_attention step on the real ViT-S/14 at ≥ 5 images/s (bench_distill_real)."""
  if not real:
    return []
  by = {r["name"]: r for r in real["rows"]}
  d = by["distill_step"]
  return [
      (
          f"distill_attention step on the real ViT-S/14 (257 tokens, batch {real['batch']}) "
          "≥ 5 images/s",
          f"{d['images_per_s']:.2f} images/s (minimal step {by['minimal_step']['images_per_s']:.2f}"
          f", teacher forward alone {by['teacher_fwd']['images_per_s']:.2f})",
          "met" if d["images_per_s"] >= 5 else "not met",
      )
  ]


def verdict(vs: list[bool]) -> str:
  """met / not met / met in k of n / not measured."""
  if not vs:
    return "not measured"
  if all(vs):
    return "met"
  if not any(vs):
    return "not met"
  return f"met in {sum(vs)} of {len(vs)}"
