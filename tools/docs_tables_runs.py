"""docs_tables' tables made from single runs' records (results.json) and from the benchmark,
lever and stability JSONs: the default's seeds, cost and history, the first runs, the speed
table (measured, and the analytic FLOP ratio), the token-count ablation, the one-lever tables at
112 px and the distillation's stability. Each renderer takes a `Load` and returns the Markdown
between a table's markers (tools/docs_tables.py registers them); the run-record readers below
are shared by them.

FLOP ratios are analytic (`bench.common`'s counts: matmuls and attention contractions), an
estimate of what a compute-bound accelerator would see, not a measurement.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from bench import common as bench_common
from linvit_jax.evaluation import results as results_lib
from linvit_jax.models import attention as attention_lib

Load = Callable[[str], Any]  # repository-relative path -> parsed JSON (or text for .md)


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


def default_seeds(load: Load) -> str:
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
        f"| [{seed}]({path.removeprefix('docs/')}) "  # the table lives in docs/recipe.md
        f"| {e['cls_cosine']:.4f} | {e['patch_cosine']:.4f} | {_layers(r)} "
        f"| {100 * knn['teacher_top1']:.1f} → {100 * knn['student_top1']:.1f} % "
        f"({100 * knn['retention']:.1f} %) "
        f"| {big['cls_cosine']:.3f} / {big['patch_cosine']:.3f} | {time} |"
    )
  return "\n".join(lines)


# The README's conversion command as written (setup_photos.sh's folders, eval_folder=), run whole.
README_RUN = "docs/vits14_readme_hybrid_results.json"  # the README's command since 2026-12-07


def default_cost(load: Load) -> str:
  """The cost of the README's conversion command, from its run, and whether the teacher's k-NN
  features came from an earlier run's feature cache, as the run recorded it."""
  r = _run(load, README_RUN)
  t = r.timing_s
  rest = t["total"] - t["distill_attention"] - t["align"]
  cached = bool((r.knn or {}).get("teacher_features_cached"))
  tokens = bool(((r.test or {}).get("teacher_cache") or {}).get("hits"))
  features = "found in an earlier run's cache" if cached else "computed afresh"
  if tokens:
    features += ", its test-photo tokens " + ("too" if cached else "found in the cache")
  return (
      f"**What it costs.** The default budget is {r.images_seen:,} training images (random "
      f"crops of your photos, drawn again and again). On this project's 2-core CPU machine the "
      f"command below took **{_minutes(t['total'])} minutes** on a ViT-S/14 at 224 px, the "
      f"teacher's k-NN features {features} ({_minutes(t['distill_attention'])} of distillation, "
      f"{_minutes(t['align'])} of `align`, {_minutes(rest)} of evaluation (the k-NN check, "
      f"the 25 cross-source photos at three sizes) and export; [results.json]({README_RUN}))."
  )


# ViT-S/14 (DINOv2-small's shape): width 384, 6 heads, MLP 1536, 12 blocks, cls token, no registers.
VITS14 = dict(width=384, heads=6, mlp=1536, patch=14)
SPEED_SIZES = (224, 448, 896)


def _block_flops(spec: attention_lib.AttentionSpec, tokens: int) -> float:
  """Forward FLOPs of one encoder block's attention and MLP for one image (bench's count)."""
  d = VITS14
  mlp = 2 * 2.0 * tokens * d["width"] * d["mlp"]
  return bench_common.attention_layer_flops(spec, tokens, d["width"], d["heads"]) + mlp


def flop_ratio(
    image_size: int,
    num_features: int | None = None,
    softmax_layers: int = 0,
    window: int = 0,
    depth: int = 12,
    key_grid: int = 0,
) -> float:
  """Teacher ÷ student FLOPs of a ViT-S/14's `depth` blocks (the default student: the ratio of
  one block's). The student: hedgehog_exp layers (hedgehog's shapes) `num_features` wide (None:
  the head dim), `softmax_layers` of them softmax, and with `window` w > 0 each linear layer's
  exact w×w neighbourhood and cls row besides (scored, then mixed: q·k and weights·v on w² + 1
  keys a patch, and the cls query over every key); `key_grid` g > 0: the softmax layers score
  the cls key and the patch keys pooled to at most g×g (AttentionSpec.key_grid)."""
  tokens = bench_common.tokens_for(image_size, VITS14["patch"])
  softmax = attention_lib.AttentionSpec(kind="softmax")
  kept = attention_lib.AttentionSpec(kind="softmax", key_grid=key_grid)  # the hybrid's layers
  linear = attention_lib.AttentionSpec(
      kind="linear", feature_map="hedgehog", num_features=num_features
  )
  linear_block = _block_flops(linear, tokens)
  if window:
    exact_keys = (tokens - 1) * (window * window + 1) + tokens  # patches' window + cls; cls row
    linear_block += 2 * 2.0 * exact_keys * VITS14["width"]  # every head: width = heads · head dim
  teacher = depth * _block_flops(softmax, tokens)
  return teacher / (
      softmax_layers * _block_flops(kept, tokens) + (depth - softmax_layers) * linear_block
  )


# bench/hybrid_speed.py at batch 1: the default student (one softmax layer, its keys pooled to
# 32×32 = twice the training grid of a /14 teacher at 224 px) and the all-linear one, same rounds.
HYBRID_SPEED = "bench/results/hybrid_speed.json"


def speed(load: Load) -> str:
  """The README's speed table: both students over the teacher, measured and by FLOPs."""
  bench = load(HYBRID_SPEED)
  measured = {(r["px"], r["case"]): r["speedup"] for r in bench["rows"]}
  lines = [
      "| image size | tokens | 2 CPU cores, student ÷ teacher images/s: the default "
      "| the same, all-linear (`softmax_layers=0`) | estimate for a GPU/TPU, teacher ÷ student "
      "FLOPs: the default | the same, all-linear |",
      "|---|---|---|---|---|---|",
  ]
  for size in SPEED_SIZES:
    tokens = bench_common.tokens_for(size, VITS14["patch"])
    lines.append(
        f"| {size} px | {tokens:,} | {measured[(size, 'hybrid_keys32')]:.2f}× "
        f"| {measured[(size, 'linear')]:.2f}× "
        f"| {flop_ratio(size, softmax_layers=1, key_grid=32):.2f}× | {flop_ratio(size):.2f}× |"
    )
  return "\n".join(lines)


# How the default came to be: each row one change, every figure from the run's own results.json.
HISTORY = (
    ("`center_keys` + `conv_v`, distillation only", "center_conv_6k"),
    ("1 + 4,000 images of `align` (every parameter, full rank)", "align_6k4k"),
    ("2, handing on the midpoint of the distilled and the aligned weights", "default_mix"),
    ("3, `align` on mixup views", "align_mixup"),
    (
        "**4, `align` within rank-8 updates, handing on its trained weights: the default until 2026-12-07**",
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


def history_path(key: str) -> str:
  return f"docs/vits14_{key}_results.json"


def history(load: Load) -> str:
  lines = [
      "| # | run: the row it starts from, and the one change | images | final cls cos "
      "| mean patch cos | per layer | k-NN retention | 448 px: cls / patch | results |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for number, (label, key) in enumerate(HISTORY, 1):
    path = history_path(key)
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


def first_runs(load: Load) -> str:
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


def ablation(load: Load) -> str:
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


def levers_112(load: Load) -> str:
  return _lever_rows(load, LEVER_ARMS, 4, "arm")


def levers_112_align(load: Load) -> str:
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


def distill_stability(load: Load) -> str:
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
