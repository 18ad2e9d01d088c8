"""Every table of figures in README.md and docs/*.md, made from committed results files.

  python tools/docs_tables.py           # rewrite every table in place
  python tools/docs_tables.py --check   # exit 1 naming the first table that differs

A table lives between markers in the Markdown:

  <!-- table:NAME -->
  | ... generated, not edited by hand ... |
  <!-- /table -->

(the README's `<!-- ablation:begin -->` … `<!-- ablation:end -->` block, which
tools/update_token_study_readme.py writes from the ablation's workdirs, is the table `ablation`),
and `TABLES[NAME]` says which committed files (results JSON, or a Markdown file that another tool
generates) it is made from, and how. A marker whose NAME is not registered, or a registered table
that no document holds, is an error too. Figures with no committed results file do not belong in
these tables: say in prose that they cannot be reproduced from this checkout, or leave them out.

FLOP ratios are analytic (`bench.common`'s counts: matmuls and attention contractions), an
estimate of what a compute-bound accelerator would see, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/docs_tables.py` puts tools/, not the root, first
  sys.path.insert(0, str(ROOT))

from bench import common as bench_common  # noqa: E402
from linvit_jax.evaluation import results as results_lib  # noqa: E402
from linvit_jax.models import attention as attention_lib  # noqa: E402

MARKER = re.compile(
    r"(?P<open><!-- (?:table:(?P<name>[\w.-]+)|(?P<alias>ablation):begin) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- (?:/table|ablation:end) -->)",
    re.S,
)
# The documents whose tables are kept: the README and every docs/*.md.
DOCS = ("README.md", "docs/*.md")

Load = Callable[[str], Any]  # repository-relative path -> parsed JSON (or text for .md)


@dataclasses.dataclass(frozen=True)
class Table:
  sources: tuple[str, ...]  # repository-relative files it is made from (committed)
  render: Callable[[Load], str]  # the Markdown between the markers, without the final newline


# ------------------------------------------------------------------------------------------------
# Reading a run's results.json (linvit_jax's run record).


def _run(load: Load, path: str) -> results_lib.Results:
  return results_lib.Results.from_json(load(path))


def _final(r: results_lib.Results) -> results_lib.Fidelity:
  """The fidelity after the last stage a run evaluated (the student as exported)."""
  final = r.final()
  if final is None:
    raise ValueError("results.json has no end-to-end fidelity after a stage")
  return final[1]


def _layers(r: results_lib.Results) -> str:
  cos = [row["cosine"] for row in _final(r).layers]
  return f"{min(cos):.3f}–{max(cos):.3f}"


def _at(r: results_lib.Results, image_size: int) -> dict[str, Any] | None:
  for row in r.resolution or ():
    if row["image_size"] == image_size and "cls_cosine" in row:
      return row
  return None


def _retention(r: results_lib.Results) -> str:
  return "—" if not r.knn else f"{100 * r.knn['retention']:.1f} %"


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:.0f}"


# ------------------------------------------------------------------------------------------------
# The tables.

# The convert_folder default on the shared DINOv2-style ViT-S/14, one fresh run per seed.
DEFAULT_RUNS = (
    # seed, results file, whether timing_s covers the whole run (seed 1 was stopped and resumed)
    (0, "docs/vits14_lora8_w0_results.json", True),
    (1, "docs/vits14_default_seed1_results.json", False),
)


def _default_seeds(load: Load) -> str:
  lines = [
      "| seed | final cls cosine | mean patch cosine | per layer (teacher-forced) "
      "| k-NN top-1, teacher → student (retention) | 448 px, no retraining: cls / patch "
      "| run time on 2 CPU cores |",
      "|---|---|---|---|---|---|---|",
  ]
  for seed, path, whole in DEFAULT_RUNS:
    r = _run(load, path)
    e = _final(r).end_to_end
    knn, big, t = r.knn, _at(r, 448), r.timing_s
    time = (
        f"{_minutes(t['total'])} min ({_minutes(t['distill_attention'])} distillation, "
        f"{_minutes(t['align'])} `align`)"
        if whole
        else "— (stopped and resumed: its timing covers only the resumed part)"
    )
    lines.append(
        f"| [{seed}]({path}) "
        f"| {e['cls_cosine']:.4f} | {e['patch_cosine']:.4f} | {_layers(r)} "
        f"| {100 * knn['teacher_top1']:.1f} → {100 * knn['student_top1']:.1f} % "
        f"({100 * knn['retention']:.1f} %) "
        f"| {big['cls_cosine']:.3f} / {big['patch_cosine']:.3f} | {time} |"
    )
  return "\n".join(lines)


def _default_cost(load: Load) -> str:
  """The cost of the README's conversion command, from seed 0's run (a whole fresh run)."""
  seed, path, whole = DEFAULT_RUNS[0]
  assert whole, f"seed {seed}'s run must be a whole one to time the command"
  r = _run(load, path)
  t = r.timing_s
  rest = t["total"] - t["distill_attention"] - t["align"]
  return (
      f"**What it costs.** The default budget is {r.images_seen:,} training images (random "
      f"crops of your photos, drawn again and again). On this project's 2-core CPU machine a "
      f"ViT-S/14 at 224 px took **{_minutes(t['total'])} minutes** with the defaults "
      f"({_minutes(t['distill_attention'])} of distillation, {_minutes(t['align'])} of `align`, "
      f"{_minutes(rest)} of evaluation and export; [results.json]({path}))."
  )


# ViT-S/14 (DINOv2-small's shape): width 384, 6 heads, MLP 1536, 12 blocks, cls token, no registers.
VITS14 = dict(width=384, heads=6, mlp=1536, patch=14)
SPEED_SIZES = (224, 448, 896)


def _block_flops(spec: attention_lib.AttentionSpec, tokens: int) -> float:
  """Forward FLOPs of one encoder block's attention and MLP for one image (bench's count)."""
  d = VITS14
  mlp = 2 * 2.0 * tokens * d["width"] * d["mlp"]
  return bench_common.attention_layer_flops(spec, tokens, d["width"], d["heads"]) + mlp


def flop_ratio(image_size: int) -> float:
  """softmax ÷ linear (hedgehog_exp: the same shapes as hedgehog) FLOPs of a ViT-S/14 block."""
  tokens = bench_common.tokens_for(image_size, VITS14["patch"])
  softmax = attention_lib.AttentionSpec(kind="softmax")
  linear = attention_lib.AttentionSpec(kind="linear", feature_map="hedgehog")
  return _block_flops(softmax, tokens) / _block_flops(linear, tokens)


LEVERS_SPEED = "docs/levers_speed.json"


def _speed(load: Load) -> str:
  measured = {row["image_size"]: row for row in load(LEVERS_SPEED)}
  lines = [
      "| image size | tokens | measured on 2 CPU cores: student ÷ teacher images/s "
      "| estimate for a GPU/TPU: softmax ÷ linear FLOPs of attention + MLP |",
      "|---|---|---|---|",
  ]
  for size in SPEED_SIZES:
    tokens = bench_common.tokens_for(size, VITS14["patch"])
    lines.append(
        f"| {size} px | {tokens:,} | {measured[size]['center_conv_speedup']:.2f}× "
        f"| {flop_ratio(size):.2f}× |"
    )
  return "\n".join(lines)


# How the default came to be: each row one change, every figure from the run's own results.json.
HISTORY = (
    ("`center_keys` + `conv_v`, distillation only", "center_conv_6k"),
    ("1 + 4,000 images of `align` (every parameter, full rank)", "align_6k4k"),
    ("2, handing on the midpoint of the distilled and the aligned weights", "default_mix"),
    ("3, `align` on mixup views", "align_mixup"),
    (
        "**4, `align` within rank-8 updates, handing on its trained weights: the default**",
        "lora8_w0",
    ),
    ("**5 with `--config.seed=1`** (stopped once and resumed)", "default_seed1"),
    ("4, mixup in the distillation too (`distill_mixup=1`)", "distill_mixup"),
    ("7, `align` within rank-8 updates (midpoint)", "dmix_lora8"),
    ("2, `align` on colour-jittered views", "align_color_6k4k"),
    ("3, the average of `align`'s last 250 steps", "align_tailavg"),
    ("3, `align`'s final-feature loss ×4", "align_wfeat4"),
    ("3, `align`'s top blocks weighted up (×1 → ×4)", "align_top4"),
    ("1, a 32-wide feature map (`num_features=32`)", "nf32_6k"),
    ("1 + `window=3`", "window3_3k"),
    ("1 + `sinks=16`", "sinks16_3k"),
    ("1 + `compose=0.5`", "compose_3k"),
)


def _history_path(key: str) -> str:
  return f"docs/vits14_{key}_results.json"


def _history(load: Load) -> str:
  lines = [
      "| # | run: the row it starts from, and the one change | images | final cls cos "
      "| mean patch cos | per layer | k-NN retention | 448 px: cls / patch | results |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for number, (label, key) in enumerate(HISTORY, 1):
    path = _history_path(key)
    r = _run(load, path)
    e = _final(r).end_to_end
    big = _at(r, 448)
    lines.append(
        f"| {number} | {label} | {r.images_seen:,} | {e['cls_cosine']:.3f} | {e['patch_cosine']:.3f} "
        f"| {_layers(r)} | {_retention(r)} | {big['cls_cosine']:.3f} / {big['patch_cosine']:.3f} "
        f"| [json]({pathlib.PurePosixPath(path).name}) |"
    )
  return "\n".join(lines)


FIRST_RUNS = (
    (
        "`policy=copy_all` (attention starts from the teacher's q/k/v/out)",
        "docs/vits14_results.json",
    ),
    (
        "`policy=copy_same` (the seed paper's recipe: attention fresh)",
        "docs/vits14_copy_same_results.json",
    ),
)


def _first_runs(load: Load) -> str:
  lines = [
      "| 1,200 images of distillation, same photos and crops | final cls cos | mean patch cos "
      "| per layer (teacher-forced) |",
      "|---|---|---|---|",
  ]
  for label, path in FIRST_RUNS:
    fid = _run(load, path).fidelity("distill_attention")
    e = fid.end_to_end
    cos = [row["cosine"] for row in fid.layers]
    lines.append(
        f"| {label} | {e['cls_cosine']:.3f} | {e['patch_cosine']:.3f} "
        f"| {min(cos):.3f}–{max(cos):.3f} |"
    )
  return "\n".join(lines)


ABLATION_DOC = "docs/ablation.md"


def _ablation(load: Load) -> str:
  """The tables `linvit_jax.studies.token_study` wrote into docs/ablation.md (its runs' workdirs are not
  committed, so the doc is the committed source; tools/update_token_study_readme.py writes the
  same tables from the workdirs)."""
  text = load(ABLATION_DOC)
  start = text.index("Top-1 after fine-tuning")
  end = text.index("\n\n![", start)
  return text[start:end].rstrip("\n")


# The one-lever-at-a-time table at 112 px (docs/levers.md), rows of tools/lever_table.py's JSON.
LEVERS_112 = "docs/levers_112/levers.json"
LEVER_ARMS = (
    ("baseline (`copy_all`, `hedgehog_exp`)", "baseline"),
    ("`exact_prefix` (exact softmax for the cls query)", "exact_prefix"),
    ("`center_keys` (keys centred per image and head)", "center_keys"),
    ("`conv_v` (zero-init depthwise 3×3 conv on v)", "conv_v"),
    ("`all` three", "all"),
    ("**`center_keys` + `conv_v`**", "center_conv"),
    (
        "`align_all` (1,000 images distillation, then 1,000 of `align` with every parameter at "
        "lr 2e-5)",
        "align_all",
    ),
    (
        "`center_keys` + `conv_v` + `window=3`, LoLCATs' form (exp(s − max) beside φ products, one "
        "normaliser, gate g = 0.5)",
        "center_conv_window3_lolcats_form",
    ),
    (
        "**`center_keys` + `conv_v` + `window=3`** (the exact set's share = the linear kernel's "
        "estimate, logit-shifted per head)",
        "center_conv_window3",
    ),
    (
        "`center_keys` + `conv_v` + `sinks=4` (cls key + the 4 patch keys of largest centred norm "
        "exact for every query, same mix)",
        "center_conv_sinks4",
    ),
    ("`center_keys` + `conv_v` + `sinks=16`", "center_conv_sinks16"),
    (
        "`center_keys` + `conv_v`, `distill_trainable=attention_routing` (v and out frozen at the "
        "teacher's)",
        "center_conv_routing",
    ),
    (
        "`center_keys` + `conv_v`, `distill_trainable=attention_features` (q and k frozen, "
        "LoLCATs' stage 1)",
        "center_conv_features",
    ),
    (
        "… the same + `exact_prefix` (the cls row exact with the teacher's own q/k)",
        "center_conv_features_exact_prefix",
    ),
    ("`center_keys` + `conv_v`, distillation lr 5e-4 (default 1e-3)", "center_conv_lr5e-4"),
    ("`center_keys` + `conv_v`, distillation lr 2e-3", "center_conv_lr2e-3"),
    (
        "`center_keys` + `conv_v` + `compose=0.5` (half of each batch 2×2 mosaics of four crops)",
        "center_conv_compose",
    ),
)
LEVER_ALIGN_ARMS = (
    ("reference `center_keys` + `conv_v` (no align)", "center_conv"),
    ("+ align, every parameter, lr 3e-6", "center_conv_align_abs3e-6"),
    (
        "**+ align, every parameter, lr 2e-4 relative (`param_rms`)**",
        "center_conv_align_rms2e-4",
    ),
    (
        "… + label-free mixup views, handing on the midpoint (`align_mixup=1,align_start_weight=0.5`; "
        "the 224-px default before LoRA; session 17)",
        "center_conv_align_mixup_mid",
    ),
    (
        "… + mixup views, rank-8 LoRA, handing on the trained weights (`align_mixup=1,align_lora=8`, "
        "w = 0; the 224-px default; session 17)",
        "center_conv_align_mixup_lora8",
    ),
)


def _lever_rows(load: Load, arms: Sequence[tuple[str, str]], digits: int, head: str) -> str:
  rows = {row["arm"]: row for row in load(LEVERS_112)["rows"]}
  lines = [
      f"| {head} | cls cos | patch cos | worst layer | k-NN retention "
      "| cls cos at 224 px (no retraining) |",
      "|---|---|---|---|---|---|",
  ]
  for label, arm in arms:
    r = rows[arm]
    cos = " | ".join(
        f"{r[k]:.{digits}f}" for k in ("cls_cosine", "patch_cosine", "worst_layer_cosine")
    )
    lines.append(f"| {label} | {cos} | {r['knn_retention']:.3f} | {r['cls_cosine_224px']:.3f} |")
  return "\n".join(lines)


def _levers_112(load: Load) -> str:
  return _lever_rows(load, LEVER_ARMS, 4, "arm")


def _levers_112_align(load: Load) -> str:
  head = "arm (112 px, 2,000 images of distillation + 2,000 of align)"
  return _lever_rows(load, LEVER_ALIGN_ARMS, 3, head)


# docs/distill_stability.md: rows of tools/distill_seeds.py's JSON, one setting (and seeds) each.
DISTILL_STABILITY = "docs/distill_stability.json"
STABILITY_ROWS = (
    (
        "lr 3e-3 (old default), student init key = teacher's",
        "before_fix_lr3e-3_teacher_init_key_shared",
        (0,),
    ),
    ("same", "before_fix_lr3e-3_teacher_init_key_shared", (1, 2, 3, 4, 7)),
    ("lr 3e-3, fixed init key, routing loss off", "no_routing_lr3e-3", None),
    ("lr 1e-2, fixed init key", "lr1e-2", None),
    ("**lr 3e-2, fixed init key (new default)**", "after_fix_lr3e-2", None),
)


def _range(values: Sequence[float], fmt: str) -> str:
  lo, hi = min(values), max(values)
  return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"


def _distill_stability(load: Load) -> str:
  sets = load(DISTILL_STABILITY)
  lines = [
      "| setting | seeds | top-1 after distillation (%) | spread (points) | layer-0 cosine |",
      "|---|---|---|---|---|",
  ]
  for label, key, seeds in STABILITY_ROWS:
    rows = [r for r in sets[key]["rows"] if seeds is None or r["seed"] in seeds]
    top1 = [100 * r["top1_after_distill"] for r in rows]
    spread = f"{max(top1) - min(top1):.1f}" if len(rows) > 1 else "–"
    lines.append(
        f"| {label} | {', '.join(str(r['seed']) for r in rows)} "
        f"| {', '.join(f'{t:.2f}' for t in top1)} | {spread} "
        f"| {_range([r['layer_cosine'][0] for r in rows], '.3f')} |"
    )
  return "\n".join(lines)


TEST_PHOTOS = "docs/vits14_big3k_test_photos.json"


def _ci(stat: dict[str, Any]) -> str:
  return f"{stat['mean']:.3f} [{stat['lo']:.3f}, {stat['hi']:.3f}]"


def _test_photos(load: Load) -> str:
  return _test_rows(load(TEST_PHOTOS)["rows"])


def _test_rows(rows: Sequence[dict[str, Any]]) -> str:
  lines = [
      "| size | view | cls cosine [95 % CI] | patch cosine [95 % CI] | worst photo (patch) "
      "| enlarged | student ÷ teacher images/s | dense drop-in [95 % CI] "
      "| probe student / teacher |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    d = row["dense"]
    speed = row["student_images_per_s"] / row["teacher_images_per_s"]
    lines.append(
        f"| {row['size']} px | {row['view']} | {_ci(row['cls_cosine'])} "
        f"| {_ci(row['patch_cosine'])} | {row['patch_cosine']['worst']:.3f} "
        f"`{row['patch_cosine']['worst_photo']}` | {row['upsampled']} of {row['n']} "
        f"| {speed:.2f}× | {_ci(d['drop_in'])} | {d['probe_student']['mean']:.3f} / "
        f"{d['probe_teacher']['mean']:.3f} ({d['probe_ratio']:.2f}) |"
    )
  return "\n".join(lines)


DEPLOY_STUDY = "docs/deploy_res_study.json"
# (name in the JSON, label): the arms of the deploy_res study, the reference first.
DEPLOY_ARMS = (("base", "default"), ("deploy448_half", "deploy_res=448"))


def _test_pairs(ref: tuple[str, str], arm: tuple[str, str]) -> Callable[[Load], str]:
  """A table of run `arm`'s test rows beside run `ref`'s (both in DEPLOY_STUDY), with the change."""

  def render(load: Load) -> str:
    study = load(DEPLOY_STUDY)
    rows = {(r["size"], r["view"]): r for r in study[ref[0]]["test"]["rows"]}
    lines = [
        f"| size | view | cls cosine: {ref[1]} → {arm[1]} | patch cosine | dense drop-in "
        "| probe ratio | enlarged |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in study[arm[0]]["test"]["rows"]:
      a = rows[(r["size"], r["view"])]

      def pair(get, a=a, r=r) -> str:
        x, y = get(a), get(r)
        return f"{x:.3f} → {y:.3f} ({y - x:+.3f})"

      lines.append(
          f"| {r['size']} px | {r['view']} | {pair(lambda q: q['cls_cosine']['mean'])} "
          f"| {pair(lambda q: q['patch_cosine']['mean'])} "
          f"| {pair(lambda q: q['dense']['drop_in']['mean'])} "
          f"| {pair(lambda q: q['dense']['probe_ratio'])} | {r['upsampled']} of {r['n']} |"
      )
    return "\n".join(lines)

  return render


def _deploy_res_cost(load: Load) -> str:
  study = load(DEPLOY_STUDY)
  lines = [
      "| arm | stage | steps | batch | size | minutes |",
      "|---|---|---|---|---|---|",
  ]
  for name, label in DEPLOY_ARMS + (("base_seed1", "default, seed 1"),):
    run = study[name]
    for stage, s in run["stages"].items():
      size = s["image_size"][0] if isinstance(s["image_size"], list) else s["image_size"]
      minutes = run["timing_s"][stage] / 60
      lines.append(
          f"| {label} | {stage} | {s['steps']} | {s['batch_size']} | {size} px | {minutes:.1f} |"
      )
    lines.append(f"| {label} | whole run | | | | {run['timing_s']['total'] / 60:.1f} |")
  return "\n".join(lines)


FULL_STUDY = "docs/default_full_study.json"


def _study_test(study_path: str, name: str) -> Callable[[Load], str]:
  """Run `name`'s test table (sizes × views, intervals, dense measure, speed) from a study JSON."""

  def render(load: Load) -> str:
    return _test_rows(load(study_path)[name]["test"]["rows"])

  return render


# Issue 39's goals on the test photos: (size, what, threshold, how to read a row).
GOALS = (
    (224, "cls cosine", 0.96, lambda r: r["cls_cosine"]["mean"]),
    (224, "patch cosine", 0.96, lambda r: r["patch_cosine"]["mean"]),
    (448, "cls cosine", 0.95, lambda r: r["cls_cosine"]["mean"]),
    (448, "patch cosine", 0.95, lambda r: r["patch_cosine"]["mean"]),
    (896, "cls cosine", 0.92, lambda r: r["cls_cosine"]["mean"]),
    (896, "patch cosine", 0.92, lambda r: r["patch_cosine"]["mean"]),
    (896, "student ÷ teacher images/s", 4.0,
     lambda r: r["student_images_per_s"] / r["teacher_images_per_s"]),
    (None, "dense drop-in (share of patches)", 0.85, lambda r: r["dense"]["drop_in"]["mean"]),
    (None, "dense probe, student ÷ teacher", 0.95, lambda r: r["dense"]["probe_ratio"]),
)  # fmt: skip


def _goals(study_path: str, name: str) -> Callable[[Load], str]:
  """Issue 39's goals against run `name` of a study: whole views (the photo as it is resized),
  the dense goals at every size, k-NN retention and the run's minutes."""

  def render(load: Load) -> str:
    run = load(study_path)[name]
    rows = {(r["size"], r["view"]): r for r in run["test"]["rows"]}
    sizes = sorted({size for size, _ in rows})
    lines = [
        "| size | measure (whole views) | goal | measured [95 % CI] | |",
        "|---|---|---|---|---|",
    ]
    for size, what, goal, get in GOALS:
      for at in [size] if size else sizes:
        row = rows[(at, "whole")]
        value = get(row)
        stat = {"cls cosine": "cls_cosine", "patch cosine": "patch_cosine"}.get(what)
        shown = _ci(row[stat]) if stat else (
            _ci(row["dense"]["drop_in"]) if what.startswith("dense drop-in") else f"{value:.3f}"
        )  # fmt: skip
        verdict = "met" if value >= goal else "not met"
        lines.append(f"| {at} px | {what} | ≥ {goal:g} | {shown} | {verdict} |")
    knn = run["knn"]
    if knn.get("retention") is not None:
      verdict = "met" if knn["retention"] >= 0.99 else "not met"
      lines.append(
          f"| {run['test']['res']} px | k-NN retention ({knn['dataset']}, "
          f"{knn['eval_examples']} queries) | ≥ 99 % | {100 * knn['retention']:.1f} % "
          f"({100 * knn['teacher_top1']:.1f} → {100 * knn['student_top1']:.1f} %) | {verdict} |"
      )
    total = run["timing_s"]["total"] / 60
    verdict = "met" if total <= 105 else "not met"
    lines.append(f"| | the whole run on 2 CPU cores | ≤ 105 min | {total:.0f} min | {verdict} |")
    return "\n".join(lines)

  return render


def _study_cost(study_path: str, name: str) -> Callable[[Load], str]:
  """Where run `name`'s time went: each timed part's minutes and share, each stage's step cost."""

  def render(load: Load) -> str:
    run = load(study_path)[name]
    timing = run["timing_s"]
    total = timing["total"]
    labels = {
        "convert_and_evaluate": "surgery, calibration and the first fidelity report",
        "knn": "k-NN check (teacher and student features)",
        "test_photos": "test photos at 3 sizes × 2 views, dense measure",
        "speed_resolution_plots": "speed, resolution sweep, plots",
    }
    lines = ["| part | steps × batch at size | s / step (median) | minutes | share |",
             "|---|---|---|---|---|"]  # fmt: skip
    named = 0.0
    for part, seconds in timing.items():
      if part == "total":
        continue
      named += seconds
      stage = run["stages"].get(part)
      shape = (
          f"{stage['steps']} × {stage['batch_size']} at {stage['image_size']} px" if stage else ""
      )
      step = run["step_seconds"].get(part)
      lines.append(
          f"| {'stage `' + part + '`' if stage else labels.get(part, part)} | {shape} "
          f"| {f'{step:.2f}' if step else ''} | {seconds / 60:.1f} | {100 * seconds / total:.0f} % |"
      )
    rest = total - named
    lines.append(
        f"| the rest (export, model card, writing) | | | {rest / 60:.1f} | {100 * rest / total:.0f} % |"
    )
    lines.append(f"| **whole run** | | | **{total / 60:.1f}** | 100 % |")
    return "\n".join(lines)

  return render


# The whole-view measures the seed and folder tables compare (a test row -> its value).
WHOLE_MEASURES = (
    ("cls cosine", lambda r: r["cls_cosine"]["mean"]),
    ("patch cosine", lambda r: r["patch_cosine"]["mean"]),
    ("dense drop-in", lambda r: r["dense"]["drop_in"]["mean"]),
    ("probe ratio", lambda r: r["dense"]["probe_ratio"]),
)


def _whole(run: dict[str, Any], size: int) -> dict[str, Any]:
  """Run `run`'s test row of the whole view at `size`."""
  return next(r for r in run["test"]["rows"] if (r["size"], r["view"]) == (size, "whole"))


def _sizes(run: dict[str, Any]) -> list[int]:
  """The sizes run `run`'s test table measured, smallest first."""
  return sorted({r["size"] for r in run["test"]["rows"]})


def _seed_spread(study_path: str, names: Sequence[str]) -> Callable[[Load], str]:
  """The same recipe under several seeds (runs `names` of a study, same folder and split): each
  whole-view measure per seed, their mean and sample standard deviation, and the k-NN retention."""

  def render(load: Load) -> str:
    study = load(study_path)
    runs = [study[n] for n in names]
    seeds = [str(run["seed"]) for run in runs]
    lines = [
        f"| size | measure (whole views) | {' | '.join('seed ' + s for s in seeds)} "
        "| mean ± sd over seeds |",
        "|---|---|" + "---|" * len(runs) + "---|",
    ]

    def row(label: str, values: list[float], fmt: str) -> str:
      sd = statistics.stdev(values) if len(values) > 1 else 0.0
      shown = " | ".join(format(v, fmt) for v in values)
      return f"{label} | {shown} | {format(statistics.mean(values), fmt)} ± {format(sd, fmt)} |"

    for size in _sizes(runs[0]):
      picked = [_whole(run, size) for run in runs]
      for what, get in WHOLE_MEASURES:
        lines.append(row(f"| {size} px | {what}", [get(r) for r in picked], ".3f"))
    retention = [100 * run["knn"]["retention"] for run in runs]
    lines.append(row("| | k-NN retention (%)", retention, ".1f"))
    return "\n".join(lines)

  return render


RESOLUTION_CURVES = "docs/vits14_full_default_seed2_resolution_curves.json"


def _resolution_curves(load: Load) -> str:
  """Every kept checkpoint of a run at every size (tools/resolution_curves.py): one row per
  checkpoint, cls (cls-token models) / patch cosine per size, the best row per size in bold."""
  curves = load(RESOLUTION_CURVES)
  sizes, view = curves["sizes"], curves["views"][0]
  at = {(p["stage"], p["step"], p["size"]): p for p in curves["points"] if p["view"] == view}
  checkpoints = sorted({(p["images_seen"], p["stage"], p["step"]) for p in curves["points"]})
  keys = [k for k in ("cls_cosine", "patch_cosine") if k in curves["points"][0]]
  best = {
      (size, key): max(p[key] for (_, _, s), p in at.items() if s == size)
      for size in sizes
      for key in keys
  }

  def cell(p: dict[str, Any], size: int, key: str) -> str:
    text = f"{p[key]:.3f}"
    return f"**{text}**" if p[key] == best[(size, key)] else text

  names = " / ".join(k.split("_")[0] for k in keys)
  lines = [
      "| images seen | stage, step | " + " | ".join(f"{size} px {names}" for size in sizes) + " |",
      "|---|---|" + "---|" * len(sizes),
  ]
  for seen, stage, step in checkpoints:
    cells = [" / ".join(cell(at[(stage, step, size)], size, k) for k in keys) for size in sizes]
    lines.append(f"| {seen:,} | `{stage}` {step} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


STRUCTURE_RUN = "docs/vits14_full_default_w_structure1_results.json"


def _structure_pair(load: Load) -> str:
  """Seed 0 of the full default (default_full_study.json "full") beside the same run with
  align_w_structure=1 (its results.json): whole views on the same test photos."""
  base, arm = load(FULL_STUDY)["full"], load(STRUCTURE_RUN)

  lines = [
      "| whole view, seed 0 → w_structure 1 | cls cosine | patch cosine | dense drop-in "
      "| probe ratio |",
      "|---|---|---|---|---|",
  ]
  for size in _sizes(base):
    a, b = _whole(base, size), _whole(arm, size)
    cells = [
        f"{a['cls_cosine']['mean']:.3f} → {b['cls_cosine']['mean']:.3f}",
        f"{a['patch_cosine']['mean']:.3f} → {b['patch_cosine']['mean']:.3f}",
        f"{a['dense']['drop_in']['mean']:.3f} → {b['dense']['drop_in']['mean']:.3f}",
        f"{a['dense']['probe_ratio']:.3f} → {b['dense']['probe_ratio']:.3f}",
    ]
    lines.append(f"| {size} px (n = {a['patch_cosine']['n']}) | " + " | ".join(cells) + " |")
  knn = lambda run: 100 * run["knn"]["retention"]  # noqa: E731
  lines.append(f"| k-NN retention (%) | {knn(base):.1f} → {knn(arm):.1f} | | | |")
  return "\n".join(lines)


def _other_folder(names: Sequence[str], other: str) -> Callable[[Load], str]:
  """The default trained on another folder (run `other` of FULL_STUDY: other training photos,
  the same validation and test photos) beside the default folder's seeds (runs `names`)."""

  def render(load: Load) -> str:
    study = load(FULL_STUDY)
    runs, arm = [study[n] for n in names], study[other]
    lines = [
        "| size | measure (whole views) | default folder, seed 0 | default folder, seeds "
        f"{', '.join(str(r['seed']) for r in runs)}: min – max | other folder, seed {arm['seed']} "
        "| other − seed 0 |",
        "|---|---|---|---|---|---|",
    ]
    for size in _sizes(runs[0]):
      for what, get in WHOLE_MEASURES:
        values = [get(_whole(run, size)) for run in runs]
        mine = get(_whole(arm, size))
        lines.append(
            f"| {size} px | {what} | {values[0]:.3f} | {min(values):.3f} – {max(values):.3f} "
            f"| {mine:.3f} | {mine - values[0]:+.3f} |"
        )
    knn = [100 * run["knn"]["retention"] for run in runs]
    mine = 100 * arm["knn"]["retention"]
    lines.append(
        f"| | k-NN retention (%) | {knn[0]:.1f} | {min(knn):.1f} – {max(knn):.1f} | {mine:.1f} "
        f"| {mine - knn[0]:+.1f} |"
    )
    return "\n".join(lines)

  return render


def _rerun(load: Load) -> str:
  """Seed 0 of the full default (FULL_STUDY "full") against the same command run again
  ("full_rerun", another machine): every whole-view measure, the k-NN retention."""
  study = load(FULL_STUDY)
  first, again = study["full"], study["full_rerun"]
  lines = [
      "| size | measure (whole views) | seed 0, first run | seed 0, run again | change |",
      "|---|---|---|---|---|",
  ]
  for size in _sizes(first):
    for what, get in WHOLE_MEASURES:
      a, b = get(_whole(first, size)), get(_whole(again, size))
      lines.append(f"| {size} px | {what} | {a:.4f} | {b:.4f} | {b - a:+.4f} |")
  a, b = (100 * run["knn"]["retention"] for run in (first, again))
  lines.append(f"| | k-NN retention (%) | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
  return "\n".join(lines)


def _rerun_cost(load: Load) -> str:
  """Where the time went on one machine: the other-folder run (FULL_STUDY "full_lomiri", the
  first on a fresh machine: no cached teacher features) and the default run after it
  ("full_rerun": the teacher's k-NN features and test / validation photo tokens cached)."""
  study = load(FULL_STUDY)
  runs = (study["full_lomiri"], study["full_rerun"])
  parts = [p for p in runs[0]["timing_s"] if p != "total"]
  lines = [
      "| part | other folder, nothing cached (min) | default folder, run after it (min) | ratio |",
      "|---|---|---|---|",
  ]
  for part in parts + ["total"]:
    a, b = (run["timing_s"].get(part, 0.0) / 60 for run in runs)
    name = f"**{part}**" if part == "total" else part
    lines.append(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
  cache = [run["test"]["teacher_cache"] for run in runs]
  lines.append(
      "| teacher photo tokens: cached / computed | "
      + " | ".join(f"{c['hits']} / {c['computed']}" for c in cache)
      + " | |"
  )
  knn = [run["knn"].get("teacher_features_cached") for run in runs]
  lines.append(
      "| teacher k-NN features cached | " + " | ".join("yes" if k else "no" for k in knn) + " | |"
  )
  return "\n".join(lines)


FIXTURE_STUDY = "docs/fixture_conversions.json"


def _cls_patch(row: dict[str, Any]) -> str:
  cls = f"{row['cls_cosine']['mean']:.3f}" if "cls_cosine" in row else "no cls"
  return f"{cls} / {row['patch_cosine']['mean']:.3f}"


def _fixtures(load: Load) -> str:
  """The default recipe on each tiny Hugging Face / timm fixture (tools/convert_fixtures.py)."""
  study = load(FIXTURE_STUDY)
  lines = [
      "| fixture | pool | registers | pooled cosine, validation: converted → after align "
      "| test cls / patch cosine, whole, 28 px | the same at the largest size | k-NN retention "
      "| reloaded `encode` | minutes |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for f in study["fixtures"]:
    rows = {(r["size"], r["view"]): r for r in f["test"]["rows"]}
    small, large = rows[(28, "whole")], rows[(max(s for s, _ in rows), "whole")]
    knn = f["knn"].get("retention")
    lines.append(
        f"| `{f['fixture']}` | {f['pool_type']} | {f['reg_tokens']} "
        f"| {f['pooled_cosine']['converted']:.3f} → {f['pooled_cosine']['after_align']:.3f} "
        f"| {_cls_patch(small)} | {_cls_patch(large)} ({large['size']} px) "
        f"| {'' if knn is None else f'{100 * knn:.1f} %'} "
        f"| {'×'.join(map(str, f['reloaded_feature_shape']))}"
        f"{'' if f['reloaded_feature_finite'] else ' (non-finite)'} | {f['minutes']:.1f} |"
    )
  return "\n".join(lines)


TABLES: dict[str, Table] = {
    "default_seeds": Table(tuple(p for _, p, _ in DEFAULT_RUNS), _default_seeds),
    "default_cost": Table((DEFAULT_RUNS[0][1],), _default_cost),
    "speed": Table((LEVERS_SPEED, "bench/common.py"), _speed),
    "default_history": Table(tuple(_history_path(k) for _, k in HISTORY), _history),
    "first_runs": Table(tuple(p for _, p in FIRST_RUNS), _first_runs),
    "ablation": Table((ABLATION_DOC,), _ablation),
    "levers_112": Table((LEVERS_112,), _levers_112),
    "levers_112_align": Table((LEVERS_112,), _levers_112_align),
    "distill_stability": Table((DISTILL_STABILITY,), _distill_stability),
    "test_photos": Table((TEST_PHOTOS,), _test_photos),
    "deploy_res": Table((DEPLOY_STUDY,), _test_pairs(*DEPLOY_ARMS)),
    "default_seed_spread": Table(
        (DEPLOY_STUDY,), _test_pairs(("base", "seed 0"), ("base_seed1", "seed 1"))
    ),
    "deploy_res_cost": Table((DEPLOY_STUDY,), _deploy_res_cost),
    "default_full_test": Table((FULL_STUDY,), _study_test(FULL_STUDY, "full")),
    "default_full_goals": Table((FULL_STUDY,), _goals(FULL_STUDY, "full")),
    "default_full_cost": Table((FULL_STUDY,), _study_cost(FULL_STUDY, "full")),
    "fixture_conversions": Table((FIXTURE_STUDY,), _fixtures),
    "fmnist_full_test": Table((FULL_STUDY,), _study_test(FULL_STUDY, "fmnist")),
    "default_full_seeds": Table(
        (FULL_STUDY,), _seed_spread(FULL_STUDY, ("full", "full_seed1", "full_seed2"))
    ),
    "w_structure_pair": Table((FULL_STUDY, STRUCTURE_RUN), _structure_pair),
    "default_full_other_folder": Table(
        (FULL_STUDY,), _other_folder(("full", "full_seed1", "full_seed2"), "full_lomiri")
    ),
    "default_full_resolution_curves": Table((RESOLUTION_CURVES,), _resolution_curves),
    "default_full_rerun": Table((FULL_STUDY,), _rerun),
    "default_full_rerun_cost": Table((FULL_STUDY,), _rerun_cost),
}


# ------------------------------------------------------------------------------------------------
# Finding, checking and rewriting the tables.


def documents(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  out: list[pathlib.Path] = []
  for pattern in DOCS:
    out.extend(sorted(root.glob(pattern)))
  return out


def _loader(root: pathlib.Path) -> Load:
  cache: dict[str, Any] = {}

  def load(path: str) -> Any:
    if path not in cache:
      text = (root / path).read_text(encoding="utf-8")
      cache[path] = json.loads(text) if path.endswith(".json") else text
    return cache[path]

  return load


def render_document(text: str, load: Load, where: str = "") -> str:
  """`text` with every table's body regenerated."""

  def sub(m: re.Match[str]) -> str:
    name = m.group("name") or m.group("alias")
    if name not in TABLES:
      raise KeyError(f"{where}: <!-- table:{name} --> is not in tools/docs_tables.py's TABLES")
    return m.group("open") + TABLES[name].render(load) + "\n" + m.group("close")

  return MARKER.sub(sub, text)


def check(root: pathlib.Path = ROOT) -> list[str]:
  """Problems found, first the first differing table; empty when every table is as generated."""
  load, problems, seen = _loader(root), [], set()
  for doc in documents(root):
    rel = doc.relative_to(root).as_posix()
    text = doc.read_text(encoding="utf-8")
    for m in MARKER.finditer(text):
      name = m.group("name") or m.group("alias")
      seen.add(name)
      if name not in TABLES:
        problems.append(f"{rel}: table '{name}' is not registered in tools/docs_tables.py")
        continue
      want = TABLES[name].render(load) + "\n"
      if m.group("body") != want:
        diff = "\n".join(
            difflib.unified_diff(
                m.group("body").splitlines(),
                want.splitlines(),
                "in the doc",
                "generated",
                lineterm="",
            )
        )
        problems.append(
            f"{rel}: table '{name}' differs from {', '.join(TABLES[name].sources)} "
            f"(python tools/docs_tables.py rewrites it):\n{diff}"
        )
  for name in sorted(set(TABLES) - seen):
    problems.append(f"table '{name}' is registered but no document has <!-- table:{name} -->")
  return problems


def rewrite(root: pathlib.Path = ROOT) -> list[str]:
  """Rewrites every table in place; returns the documents that changed."""
  load, changed = _loader(root), []
  for doc in documents(root):
    rel = doc.relative_to(root).as_posix()
    text = doc.read_text(encoding="utf-8")
    new = render_document(text, load, rel)
    if new != text:
      doc.write_text(new, encoding="utf-8")
      changed.append(rel)
  return changed


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
  p.add_argument("--root", default=str(ROOT), help="repository root (default: this checkout)")
  args = p.parse_args(argv)
  root = pathlib.Path(args.root)
  if args.check:
    problems = check(root)
    if problems:
      print(problems[0], file=sys.stderr)
      if len(problems) > 1:
        print(f"(and {len(problems) - 1} more)", file=sys.stderr)
      return 1
    print("every table matches its results files")
    return 0
  for rel in rewrite(root):
    print("rewrote", rel)
  return 0


if __name__ == "__main__":
  sys.exit(main())
