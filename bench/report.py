"""bench/results/*.json -> bench/RESULTS.md and bench/*.png (no measuring here).

python -m bench.report                 # after bench_speed / bench_steps (cpu and/or gpu)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from bench import speed_rows
from bench import targets
from bench.common import GB
from bench.common import fmt
from bench.common import fmt_bytes
from linvit_jax.evaluation import plots

HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- tables


def speed_table(speed: dict, what: str) -> str:
  head = (
      "| px | tokens | batch | mode | operator | ms / call | images/s | × softmax images/s | "
      "GFLOP/s | % of matmul | (CPU-time %) | XLA peak | |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  )
  lines = [head]
  for r in speed_rows.rows(speed, what):
    if speed_rows.timed(r):
      ratio = r.get("speedup_vs_softmax")
      cells = [
          fmt(r["ms"], ".1f"),
          fmt(r["images_per_s"], ".2f"),
          fmt(ratio, ".2f") if ratio else "–",
          fmt(r["gflops"], ".1f"),
          fmt(r["pct_matmul"], ".0f") + " %",
          fmt(r.get("pct_matmul_cpu_time"), ".0f") + " %",
      ]
      note = ""
    else:
      cells = [r.get("status", "n/a").split(" (")[0]] + ["–"] * 5
      note = r.get("status", "")
      note = note[note.find("(") + 1 : -1] if "(" in note else note
    mem = fmt_bytes(r["memory"]["peak"]) if "memory" in r else "–"
    lines.append(
        f"| {r['size']} | {r['tokens']} | {r['batch']} | {r['mode']} | {r['op']} | "
        + " | ".join(cells)
        + f" | {mem} | {note} |"
    )
  return "\n".join(lines)


def probes_table(speed: dict) -> str:
  lines = [
      "| what | operator | px | batch | mode | peak RSS | XLA peak |",
      "|---|---|---|---|---|---|---|",
  ]
  for p in speed.get("probes", []):
    if "error" in p:
      lines.append(f"| {p.get('label', '?')} | | | | | {p['error'][:80]} | |")
      continue
    label = p.get("label")
    what = label or p["what"]
    lines.append(
        f"| {what} | {p['op']} | {p['size']} | {p['batch']} | {p['mode']} | "
        f"{fmt_bytes(p['peak_rss'])} | {fmt_bytes(p.get('xla_peak'))} |"
    )
  return "\n".join(lines)


def steps_table(steps: dict) -> str:
  lines = [
      "| step | ms | images/s | GFLOP/s | % of matmul | (CPU-time %) | × student fwd+bwd "
      "| XLA peak |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for r in steps["rows"]:
    lines.append(
        f"| {r['name']} | {r['ms']:.0f} | {r['images_per_s']:.2f} | {r['gflops']:.1f} | "
        f"{r['pct_matmul']:.0f} % | {fmt(r.get('pct_matmul_cpu_time'), '.0f')} % | "
        f"{r['cost_vs_student_fwdbwd']:.2f} | {fmt_bytes(r['memory']['peak'])} |"
    )
  return "\n".join(lines)


def summary_table(speed: dict) -> str:
  """The ten-second table: per image size, images/s of each operator and memory, whole ViT."""
  lines = [
      "| mode | px | tokens | batch | softmax img/s | chunked img/s | elu1 img/s | "
      f"{targets.DEFAULT_MAP} img/s | elu1 × softmax | elu1 × chunked | "
      "XLA peak softmax / chunked / elu1 |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode, label in (("fwd", "inference"), ("fwdbwd", "training (fwd+bwd)")):
    for size in sorted({r["size"] for r in speed["rows"] if r["what"] == "vit"}):
      r = {op: speed_rows.find(speed, "vit", mode, size, op) for op in speed_rows.ORDER}
      if not any(r.values()):
        continue
      any_row = next(x for x in r.values() if x)

      def ips(op, r=r):
        return fmt(r[op]["images_per_s"], ".2f") if speed_rows.timed(r[op]) else "–"

      def ratio(a, b, r=r):
        return (
            f"{speed_rows.speedup(r[a], r[b]):.2f}×"
            if speed_rows.timed(r[a]) and speed_rows.timed(r[b])
            else "–"
        )

      mem = " / ".join(
          fmt_bytes(r[op]["memory"]["peak"]) if r[op] and "memory" in r[op] else "–"
          for op in ("softmax", "chunked_softmax", "elu1")
      )
      lines.append(
          f"| {label} | {size} | {any_row['tokens']} | {any_row['batch']} | {ips('softmax')} | "
          f"{ips('chunked_softmax')} | {ips('elu1')} | {ips(targets.DEFAULT_MAP)} | "
          f"{ratio('elu1', 'softmax')} | {ratio('elu1', 'chunked_softmax')} | {mem} |"
      )
  return "\n".join(lines)


def distill_real_section(real: dict) -> str:
  lines = [
      f"### The distillation step on the real ViT-S/14 ({real['init']}, {real['image_size']} px, "
      f"batch {real['batch']}, student `{real['feature_map']}`)\n",
      f"`python -m bench.bench_distill_real`, {real['date']}; reference matmul "
      f"{real['matmul_gflops']:.0f} GFLOP/s in the same rounds.\n",
      "| case | ms | images/s | × distill_step |",
      "|---|---|---|---|",
  ]
  for r in real["rows"]:
    lines.append(
        f"| {r['name']} | {r['ms']:.0f} | {r['images_per_s']:.2f} | {r['vs_distill_step']:.2f} |"
    )
  lines += ["", "| share | % |", "|---|---|"]
  lines += [f"| {k} | {100 * v:.0f} |" for k, v in real["shares"].items()]
  return "\n".join(lines) + "\n"


def eval_section(before: dict | None, after: dict | None) -> str:
  if not (before and after):
    return ""
  lines = [
      "### The demo's evaluation pieces, before and after jitting (`python -m bench.bench_eval`)\n",
      f"Seconds on the first call (trace + compile + run: what a run pays) and on a second call; "
      f"before = commit {before['commit']}, after = {after['commit']}.\n",
      "| piece | before, first call | after, first call | before, second | after, second |",
      "|---|---|---|---|---|",
  ]
  for name in after["rows"]:
    b, a = before["rows"].get(name), after["rows"][name]
    if b:
      lines.append(
          f"| {name} | {b['first_s']:.2f} | {a['first_s']:.2f} | {b['second_s']:.2f} | "
          f"{a['second_s']:.2f} |"
      )
  return "\n".join(lines) + "\n"


def safetensors_section(before: dict | None, after: dict | None) -> str:
  """The safetensors reader before and after the package swap (`python -m bench.safetensors_load`
  run on both commits, one after the other on the same quiet machine)."""
  if not (before and after):
    return ""
  lines = [
      "### Reading the ViT-S/14 from .safetensors, before and after the `safetensors` package "
      "(`python -m bench.safetensors_load`)\n",
      f"Median of {len(after['rows'][0]['runs'])} fresh processes each; before = commit "
      f"{before['commit']} (a hand-written reader), after = {after['commit']} (`safe_open` for a "
      "file, `safetensors.deserialize` for bytes read once). reader: the file alone; import: "
      "`checkpoint_record.read(folder)`, what `init=` a timm folder costs a run (read once, "
      "digested, converted). Added MB: the process's peak resident memory minus its memory "
      "before the call.\n",
      "| dtype | path | file MB | before s | after s | after / before | before added MB | "
      "after added MB |",
      "|---|---|---|---|---|---|---|---|",
  ]
  old = {(r["dtype"], r["path"]): r for r in before["rows"]}
  for r in after["rows"]:
    b = old.get((r["dtype"], r["path"]))
    if b:
      bm, am = b["median"], r["median"]
      lines.append(
          f"| {r['dtype']} | {r['path']} | {r['file_mb']:.0f} | {bm['wall_s']:.3f} | "
          f"{am['wall_s']:.3f} | {am['wall_s'] / bm['wall_s']:.2f} | {bm['added_mb']:.0f} | "
          f"{am['added_mb']:.0f} |"
      )
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- plots


def plot(speed: dict, path_speed: str, path_memory: str) -> None:
  """cpu_speed.png (images/s vs tokens) and cpu_memory.png (peak GB per image vs tokens)."""
  softmax_like = [op for op in speed_rows.ORDER if op not in speed_rows.LINEAR]

  def title(what: str) -> str:
    return "one attention layer" if what == "layer" else f"ViT-{speed['variant']}"

  panels = []
  for what in ("layer", "vit"):
    for mode in ("fwd", "fwdbwd"):
      series = {
          op: [
              (r["tokens"], r["images_per_s"])
              for r in speed_rows.rows(speed, what, mode)
              if r["op"] == op and speed_rows.timed(r)
          ]
          for op in speed_rows.ORDER
      }
      panels.append(
          dict(
              series=series,
              dashed=softmax_like,
              title=f"{title(what)}, {mode}",
              xlabel="tokens" if what == "vit" else "",
              ylabel="images/s",
          )
      )
  machine = speed["machine"]
  plots.plot_lines(
      panels,
      path_speed,
      size=(11, 8),
      title=f"{machine['backend']} ({machine['device']}), {speed['dtype']}: images/s vs tokens "
      "(batch differs per size; see RESULTS.md)",
  )
  panels = [
      dict(
          series={
              op: [
                  (r["tokens"], r["memory"]["peak"] / r["batch"] / GB)
                  for r in speed_rows.rows(speed, what, "fwdbwd")
                  if r["op"] == op and "memory" in r
              ]
              for op in speed_rows.ORDER
          },
          dashed=softmax_like,
          title=title(what),
          xlabel="tokens",
          ylabel="XLA peak GB per image (fwd+bwd)",
      )
      for what in ("layer", "vit")
  ]
  plots.plot_lines(panels, path_memory)


# ----------------------------------------------------------------------------- document


def _matmul_summary(speed: dict) -> str:
  rates = [r["matmul_gflops"] for r in speed["rows"] if "matmul_gflops" in r]
  if not rates:
    return "no timed groups"
  return (
      f"{speed['reference']['n']}³ {speed['dtype']} matmul: median {np.median(rates):.0f} "
      f"GFLOP/s over the timing groups (range {min(rates):.0f}–{max(rates):.0f}; "
      f"{speed['reference']['gflops_at_start']:.0f} at start)"
  )


def section(
    speed: dict | None, steps: dict | None, title: str, plot_prefix: str, out_dir: str
) -> str:
  parts = [f"## {title}\n"]
  if speed:
    m = speed["machine"]
    parts.append(
        f"Measured {speed['date']}: {m['backend']} / {m['device']} ×{m['num_devices']}, "
        f"{m['cpus']} CPUs, jax {m['jax']}, {speed['dtype']}, load average at start "
        f"{', '.join(f'{x:.1f}' for x in m['load_avg'] or ())}; whole run "
        f"{speed['wall_s'] / 60:.0f} min{'' if speed.get('complete', True) else ' (INCOMPLETE)'}."
        f"\nReference: {_matmul_summary(speed)}.\n"
    )
    v = speed.get("variant", "S/16")
    for what, name in (
        ("layer", f"One attention layer (ViT-{v} dims)"),
        ("vit", f"Whole ViT-{v} (cls token, 1000 classes)"),
    ):
      parts.append(f"### {name}\n\n{speed_table(speed, what)}\n")
    if speed.get("probes"):
      parts.append(
          "### Peak RSS, one fresh process per point (compile + 2 calls)\n\n"
          + probes_table(speed)
          + "\n"
      )
    sp, mp = f"{plot_prefix}_speed.png", f"{plot_prefix}_memory.png"
    plot(speed, os.path.join(out_dir, sp), os.path.join(out_dir, mp))
    parts.append(f"![images/s vs tokens]({sp})\n\n![peak memory vs tokens]({mp})\n")
  if steps:
    parts.append(
        f"### Training steps: ViT-S/16 at {steps['image_size']} px, batch "
        f"{steps['batch']}, student `{steps['feature_map']}`\n\n"
        f"Implementation measured: {steps['implementation']}. Reference matmul in the "
        f"same rounds: {steps['matmul_gflops']:.0f} GFLOP/s.\n\n{steps_table(steps)}\n"
    )
  return "\n".join(parts)


# RESULTS.md's title and how to read its numbers.
_HEADER = (
    "# Benchmarks: linear vs softmax attention\n",
    "Generated by `python -m bench.report` from `bench/results/*.json` (written by "
    "`bench/bench_speed.py` and `bench/bench_steps.py`; `bench/gpu.sh` on a CUDA machine). "
    "Input-pipeline throughput: see [RESULTS_input.md](RESULTS_input.md).\n",
    "How to read the numbers: every time is the median of ≥ 5 interleaved rounds (each round "
    "runs the reference matmul, then each operator of its group followed by the reference "
    "again), first call excluded; "
    "ratios are medians over rounds of within-round ratios, and % of the matmul rate uses "
    "the reference calls timed right before and after each case (CPU-time %: the same with "
    "process CPU seconds, insensitive to time lost to other processes). FLOPs are "
    "analytic (matmuls and attention contractions, ×3 for fwd+bwd). 'XLA peak' is the "
    "compiled program's `memory_analysis()` (arguments + outputs + temporaries), known "
    "without running it; cases above the memory or time budget show `n/a` with the reason.\n",
)


def write(results_dir: str, out_dir: str, notes_path: str | None = None) -> str:
  cpu_speed = speed_rows.load(os.path.join(results_dir, "cpu_speed.json"))
  cpu_steps = speed_rows.load(os.path.join(results_dir, "cpu_steps.json"))
  gpu_speed = speed_rows.load(os.path.join(results_dir, "gpu_speed.json"))
  gpu_steps = speed_rows.load(os.path.join(results_dir, "gpu_steps.json"))
  doc = list(_HEADER)
  real = speed_rows.load(os.path.join(results_dir, "distill_real.json"))
  ev_before = speed_rows.load(os.path.join(results_dir, "eval_before.json"))
  ev_after = speed_rows.load(os.path.join(results_dir, "eval_after.json"))
  for label, speed in (("CPU", cpu_speed), ("GPU", gpu_speed)):
    if speed:
      doc.append(
          f"## Whole ViT-{speed.get('variant', 'S/16')}, {label}: images/s and memory\n\n"
          + summary_table(speed)
          + "\n"
      )
  for label, speed, steps in (("CPU", cpu_speed, cpu_steps), ("GPU", gpu_speed, gpu_steps)):
    rows = targets.targets(speed, steps) + (
        targets.distill_real_target(real) if label == "CPU" else []
    )
    if rows:
      doc.append(f"## Targets ({label}, computed from the tables below)\n")
      doc.append("| target | measured | verdict |\n|---|---|---|")
      doc += [f"| {t} | {m} | **{v}** |" for t, m, v in rows]
      doc.append("")
  if notes_path and os.path.exists(notes_path):  # the analysis, after the tables it explains
    with open(notes_path) as f:
      doc.append(f.read().strip() + "\n")
  if cpu_speed or cpu_steps:
    doc.append(section(cpu_speed, cpu_steps, "CPU (this machine)", "cpu", out_dir))
  if real:
    doc.append(distill_real_section(real))
  if ev_before and ev_after:
    doc.append(eval_section(ev_before, ev_after))
  st_before = speed_rows.load(os.path.join(results_dir, "safetensors_load_before.json"))
  st_after = speed_rows.load(os.path.join(results_dir, "safetensors_load_after.json"))
  if st_before and st_after:
    doc.append(safetensors_section(st_before, st_after))
  if gpu_speed or gpu_steps:
    doc.append(section(gpu_speed, gpu_steps, "GPU (bench/gpu.sh)", "gpu", out_dir))
  else:
    doc.append(
        "## GPU\n\nNot measured yet: no GPU was lent to this task. `bench/gpu.sh` runs the "
        "same scripts with the issue's full grid (batch 8, 1 at 1792 px, every operator, "
        "bf16) plus cuDNN flash attention (`jax.nn.dot_product_attention(implementation="
        '"cudnn")`) as the softmax baseline, and regenerates this file.\n'
    )
  text = "\n".join(doc)
  path = os.path.join(out_dir, "RESULTS.md")
  with open(path, "w") as f:
    f.write(text)
  return path


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--results", default=os.path.join(HERE, "results"))
  p.add_argument("--out", default=HERE)
  p.add_argument(
      "--notes",
      default=os.path.join(HERE, "results", "notes.md"),
      help="hand-written analysis inserted after the header (optional)",
  )
  args = p.parse_args(argv)
  print("wrote", write(args.results, args.out, args.notes))


if __name__ == "__main__":
  main(sys.argv[1:])
