r"""How far a student's attention weights moved from its teacher's, per layer and per out column.

  .venv/bin/python -m tools.weight_drift --teacher CKPT --student WORKDIR/student.npz [--md OUT]

DINOv2's LayerScale γ₁ is folded into the out projection's columns (column norms 2e-4 … 6 on
the shared ViT-S/14). Adam's steps are scale-free, so a column of norm 1e-3 moves as far in
absolute terms as one of norm 1: its relative change is far larger. This prints, per layer, the
relative change ‖ΔW‖/‖W‖ of q/k/v/out, the median relative change of the out columns in the
smallest and largest tenth by teacher column norm, and the correlation of log column norm with
log relative change (negative: the small columns moved relatively more).
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from linvit_jax.models import vit_checkpoint

_ATTN = (
    r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_0/(query|key|value|out)/kernel"
)


def _flat(path: str) -> dict[str, np.ndarray]:
  params = vit_checkpoint.load_vit_params(None, path, {"scan": False})
  out: dict[str, np.ndarray] = {}

  def walk(tree, prefix=""):
    for k, v in tree.items():
      if isinstance(v, dict):
        walk(v, f"{prefix}{k}/")
      else:
        out[f"{prefix}{k}"] = np.asarray(v, np.float64)

  walk(params)
  return out


def drift(teacher: dict[str, np.ndarray], student: dict[str, np.ndarray]) -> list[dict]:
  """One row per layer: relative change per projection and of the out columns by norm."""
  rows: dict[int, dict] = {}
  for path, w_t in teacher.items():
    m = re.fullmatch(_ATTN, path)
    if not m or path not in student:
      continue
    layer, name = int(m.group(1)), m.group(2)
    w_s = student[path]
    row = rows.setdefault(layer, {"layer": layer})
    row[name] = float(np.linalg.norm(w_s - w_t) / max(np.linalg.norm(w_t), 1e-12))
    if name == "out":  # [H, Dh, D]: a column is one output channel
      t2, s2 = w_t.reshape(-1, w_t.shape[-1]), w_s.reshape(-1, w_s.shape[-1])
      norms = np.linalg.norm(t2, axis=0)
      rel = np.linalg.norm(s2 - t2, axis=0) / np.maximum(norms, 1e-12)
      order = np.argsort(norms)
      tenth = max(1, len(order) // 10)
      row["out_col_norm_min"], row["out_col_norm_max"] = float(norms.min()), float(norms.max())
      row["out_rel_small_cols"] = float(np.median(rel[order[:tenth]]))
      row["out_rel_large_cols"] = float(np.median(rel[order[-tenth:]]))
      row["corr_log_norm_log_rel"] = float(
          np.corrcoef(np.log(norms + 1e-12), np.log(rel + 1e-12))[0, 1]
      )
  return [rows[i] for i in sorted(rows)]


def table(rows: list[dict]) -> str:
  head = (
      "| layer | q | k | v | out | out column norms | out Δ, smallest 10 % columns | "
      "largest 10 % | corr(log norm, log Δ) |\n|---|---|---|---|---|---|---|---|---|"
  )
  lines = [head]
  for r in rows:
    lines.append(
        f"| {r['layer']} | {r.get('query', float('nan')):.3f} | {r.get('key', float('nan')):.3f} "
        f"| {r.get('value', float('nan')):.3f} | {r.get('out', float('nan')):.3f} "
        f"| {r['out_col_norm_min']:.1e} … {r['out_col_norm_max']:.1e} "
        f"| {r['out_rel_small_cols']:.3f} | {r['out_rel_large_cols']:.3f} "
        f"| {r['corr_log_norm_log_rel']:+.2f} |"
    )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--teacher", required=True)
  p.add_argument("--student", required=True)
  p.add_argument("--md", default="", help="also write the table to this file")
  args = p.parse_args(argv)
  rows = drift(_flat(args.teacher), _flat(args.student))
  text = table(rows)
  print(text)
  if args.md:
    with open(args.md, "w") as f:
      f.write(text + "\n")
  return rows


if __name__ == "__main__":
  main()
