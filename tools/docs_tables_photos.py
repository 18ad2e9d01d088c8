"""docs_tables' tables of the test photos (photo_eval's rows: sizes × views, intervals, the dense
measure, speed), made from committed study JSONs that hold several runs' results: the first
test-photo table, the deploy_res and seed pairs, the full default's test table, goals, cost,
seeds, other folder, rerun and its cost, the resolution curves of every kept checkpoint, the
w_structure pair, and the default on each tiny fixture. Each renderer (or a function that makes
one from a study and run names) returns the Markdown between a table's markers
(tools/docs_tables.py registers them).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tools.docs_tables_runs import Load
from tools.docs_tables_runs import flop_ratio

TEST_PHOTOS = "docs/vits14_big3k_test_photos.json"


def _ci(stat: dict[str, Any]) -> str:
  return f"{stat['mean']:.3f} [{stat['lo']:.3f}, {stat['hi']:.3f}]"


def test_photos(load: Load) -> str:
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


def test_pairs(ref: tuple[str, str], arm: tuple[str, str]) -> Callable[[Load], str]:
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


def deploy_res_cost(load: Load) -> str:
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


def study_test(study_path: str, name: str) -> Callable[[Load], str]:
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


def goals(study_path: str, name: str) -> Callable[[Load], str]:
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


def study_cost(study_path: str, name: str) -> Callable[[Load], str]:
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
  return _whole_row(run["test"], size)


def _whole_row(test: dict[str, Any], size: int) -> dict[str, Any]:
  """A test table's row (photo_eval's, a run's "test" or compare's JSON) of the whole view."""
  return next(r for r in test["rows"] if (r["size"], r["view"]) == (size, "whole"))


def _sizes(run: dict[str, Any]) -> list[int]:
  """The sizes run `run`'s test table measured, smallest first."""
  return sorted({r["size"] for r in run["test"]["rows"]})


def seed_spread(study_path: str, names: Sequence[str]) -> Callable[[Load], str]:
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
    if all(run.get("knn") for run in runs):
      retention = [100 * run["knn"]["retention"] for run in runs]
      lines.append(row("| | k-NN retention (%)", retention, ".1f"))
    return "\n".join(lines)

  return render


RESOLUTION_CURVES = "docs/vits14_full_default_seed2_resolution_curves.json"


def resolution_curves(load: Load) -> str:
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


def structure_pair(load: Load) -> str:
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


def other_folder(names: Sequence[str], other: str) -> Callable[[Load], str]:
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


def rerun(load: Load) -> str:
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


def rerun_cost(load: Load) -> str:
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


def fixtures(load: Load) -> str:
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


DATA_STUDY = "docs/data_study.json"
# (name in DATA_STUDY, what the run trained on): the data study's arms at one image budget.
DATA_ARMS = (
    ("S", "21 sample photos (scikit-image, matplotlib)"),
    ("D", "46 Debian photos (plasma, opencv, mate)"),
    ("SDL", "82: the sample, Debian and lomiri photos"),
    ("M21", "21 mixed: 7 sample, 7 Debian, 7 lomiri (tools/mix_photos.py)"),
    ("SDL_10k", "82, full budget, rank-8 LoRA `align`: the README's command until 2026-12-07"),
    (
        "SDL_lora0_10k_readme",
        "82, full budget, full-rank `align` with its teacher-forced term: the README's command"
        " on 2026-12-07",
    ),
    (
        "SDL_tf0_10k_readme",
        "82, full budget: the README's command (full-rank `align`, no teacher-forced term)",
    ),
    ("M21_10k", "21 mixed, full budget: the README's command on M21"),
    ("MORE_10k", "156, full budget: the README's command on SDL and the 74 extra photos"),
    ("MOST_10k", "472, full budget: the README's command on those and the 316 scenes photos"),
)
# The photo-count arms (1,600 images): nested mixes of the three sources (tools/mix_photos.py:
# M10 ⊂ M21 ⊂ M40), and SDL, by the photos each trains on after its holdout.
COUNT_ARMS = (
    ("M10_1600", "8 of 10 mixed: 4 sample, 3 Debian, 3 lomiri"),
    ("M21", "17 of 21 mixed: 7 sample, 7 Debian, 7 lomiri"),
    ("M40_1600", "32 of 40 mixed: 13 sample, 14 Debian, 13 lomiri"),
    ("SDL", "68 of 82: all of SDL (21 sample, 46 Debian, 15 lomiri)"),
)
COUNT_PHOTOS = {"M10_1600": 8, "M21": 17, "M40_1600": 32, "SDL": 68}
# The two folders at the full budget (the README's command on each): by the photos each trains on.
FULL_COUNT_ARMS = (
    ("M21_10k", "17 (M21)"),
    ("SDL_tf0_10k_readme", "68 (SDL: the README's)"),
    ("MORE_10k", "132 (SDL and the extra set)"),
    ("MOST_10k", "391 (those and the scenes set)"),
)
COUNT_PAIRS = (
    ("M21_1600", "M10_1600", "17 → 8 photos"),
    ("M21_1600", "M40_1600", "17 → 32 photos"),
    ("M21_1600", "SDL_1600", "17 → 68 photos (SDL: more Debian)"),
)
COMPOUNDING = "docs/data_study_compounding.json"
# The README's command as written, at the full budget (SDL's 82 photos, eval_folder= the cross set),
# run whole, the teacher's features computed afresh. SDL_10k and SDL_lora0_10k_readme are the same
# command under the earlier defaults (rank-8 LoRA in `align` until 2026-12-07; then full rank with
# the teacher-forced term).
README_ARM = "SDL_tf0_10k_readme"  # the README's command until 2026-12-07 (all-linear)
# The README's command since 2026-12-07 (one softmax layer by sensitivity, keys pooled to 2x the
# training grid: 32 here) and its operator's flop_ratio keywords.
README_HYBRID_ARM = "README_hyb"
README_HYBRID_OPERATOR = {"softmax_layers": 1, "key_grid": 32}
# Paired comparisons on the 15 photos of people (compare --photos, test only), of the runs
# measured there: (reference, arm, what changed).
PEOPLE_PAIRS = (
    ("SDL_tf0_10k_readme", "M21_10k", "today's default → trained on M21 (17 photos)"),
    (
        "SDL_tf0_10k_readme",
        "SDL_df04_10k",
        "today's default → 4,000 + 6,000 images (`distill_fraction=0.4`)",
    ),
    ("SDL_tf0_10k_readme", "MORE_10k", "today's default → trained on 132 photos (SDL + extra)"),
    ("SDL_tf0_10k_readme", "MOST_10k", "today's default → trained on 391 photos (+ scenes)"),
)
# Paired comparisons on the same cross-source test photos: (reference, arm, what changed).
PAIRS = (
    ("SDL_1600", "SDL_10k", "SDL: 1,600 → 10,000 images"),
    ("SDL_1600", "M21_1600", "1,600 images: SDL (68 photos, 4 sources) → M21 (17, 3)"),
    ("SDL_1600", "SDL_w3_1600", "1,600 images, SDL: linear → window=3 hybrid"),
    ("SDL_tf0_10k_readme", "M21_10k", "10,000 images: SDL (68 photos, the README's) → M21 (17)"),
    ("SDL_tf0_10k_readme", "MORE_10k", "10,000 images: SDL (68 photos) → SDL + extra (132)"),
    ("SDL_tf0_10k_readme", "MOST_10k", "10,000 images: SDL (68 photos) → + extra + scenes (391)"),
)


def data_study(
    arms: Sequence[tuple[str, str]], first_column: str = "trained on"
) -> Callable[[Load], str]:
  """The data study: per training folder (runs `arms` of DATA_STUDY, one budget), cls / patch
  cosine of whole views on the cross-source test photos at each size and the dense drop-in at
  the base size, then the same on the training folder's own held-out test photos ("in_source",
  compare --holdout) where the run has them."""

  def render(load: Load) -> str:
    study = load(DATA_STUDY)
    first = study[arms[0][0]]
    sizes = _sizes(first)
    head = " | ".join(f"cross {s} px: cls / patch" for s in sizes)
    lines = [
        f"| {first_column} (test: {first['test']['n_test']} cross-source photos) | images | {head} | cross {sizes[0]} px: drop-in | in-source "
        f"{sizes[0]} px: cls / patch (photos) | crop retrieval, student / teacher top-1 |",
        "|---|---|" + "---|" * len(sizes) + "---|---|---|",
    ]
    for name, label in arms:
      run = study[name]
      rows = [_whole(run, s) for s in sizes]
      cells = [f"{r['cls_cosine']['mean']:.3f} / {r['patch_cosine']['mean']:.3f}" for r in rows]
      drop = rows[0]["dense"]["drop_in"]["mean"]
      own = run.get("in_source")
      if own:
        row = _whole_row(own, sizes[0])
        mine = (
            f"{row['cls_cosine']['mean']:.3f} / {row['patch_cosine']['mean']:.3f} "
            f"({own['n_test']})"
        )
      else:
        mine = "—"
      found = run["test"].get("crop_retrieval") or {}
      if "student_top1" in found:
        retrieval = (
            f"{found['student_top1']['mean']:.3f} / {found['teacher_top1']['mean']:.3f} "
            f"({found['retention']:.2f})"
        )
      else:  # runs from before the measure
        retrieval = "—"
      lines.append(
          f"| {label} | {run['images_seen']} | {' | '.join(cells)} | {drop:.3f} | {mine} "
          f"| {retrieval} |"
      )
    return "\n".join(lines)

  return render


def fit_by_count(
    arms: Sequence[tuple[str, str]],
    photos: dict[str, int | str] | None = None,
    first_column: str = "training photos",
) -> Callable[[Load], str]:
  """Per arm (runs `arms` of DATA_STUDY, labelled by `photos`, e.g. how many photos each trained
  on, or by the arms' own labels without it): cls / patch cosine of whole views at the base size
  on the photos it trained on (seen, compare --seen) and on the cross-source test photos, and the
  difference: how far fit and generalisation part as the photos get fewer, or as a recipe fits
  its photos more closely."""

  def render(load: Load) -> str:
    study = load(DATA_STUDY)
    size = _sizes(study[arms[0][0]])[0]
    n_test = study[arms[0][0]]["test"]["n_test"]
    lines = [
        f"| {first_column} | trained on, {size} px: cls / patch | {n_test} cross-source test "
        f"photos, {size} px: cls / patch | seen − cross: cls / patch |",
        "|---|---|---|---|",
    ]
    for name, label in arms:
      run = study[name]
      seen, cross = _whole_row(run["seen"], size), _whole(run, size)
      pair = lambda r: (r["cls_cosine"]["mean"], r["patch_cosine"]["mean"])  # noqa: E731
      (sc, sp), (cc, cp) = pair(seen), pair(cross)
      lines.append(
          f"| {photos[name] if photos else label} | {sc:.3f} / {sp:.3f} | {cc:.3f} / {cp:.3f} "
          f"| {sc - cc:+.3f} / {sp - cp:+.3f} |"
      )
    return "\n".join(lines)

  return render


def fit_on_shared(arms: Sequence[tuple[str, str]], reference: str) -> Callable[[Load], str]:
  """Per arm (runs `arms` of DATA_STUDY): cls / patch cosine of whole views at the base size on
  the photos it trained on that `reference` trained on too (the per-photo seen figures of both),
  and on its other training photos: whether a student trained on more photos fits the same photos
  less closely (fit spread thinner) or as closely (a ceiling that is not the photos')."""

  def render(load: Load) -> str:
    study = load(DATA_STUDY)
    size = _sizes(study[reference])[0]
    ref_photos = set(_whole_row(study[reference]["seen"], size)["cls_cosine"]["per_photo"])
    lines = [
        f"| training photos | of them, the README run's too | on those, {size} px: cls / patch "
        f"| its other training photos | on those: cls / patch |",
        "|---|---|---|---|---|",
    ]
    for name, label in arms:
      row = _whole_row(study[name]["seen"], size)
      cls, patch = row["cls_cosine"]["per_photo"], row["patch_cosine"]["per_photo"]
      shared = sorted(set(cls) & ref_photos)
      other = sorted(set(cls) - ref_photos)
      mean = lambda d, keys: sum(d[k] for k in keys) / len(keys)  # noqa: E731
      rest = f"{mean(cls, other):.3f} / {mean(patch, other):.3f}" if other else "—"
      lines.append(
          f"| {label} | {len(shared)} | {mean(cls, shared):.3f} / {mean(patch, shared):.3f} "
          f"| {len(other)} | {rest} |"
      )
    return "\n".join(lines)

  return render


def compounding(load: Load) -> str:
  """studies/compounding.py's JSON: per layer, the teacher-forced attention cosine, the final cls /
  patch cosine with that layer's attention the teacher's (fix) and the share of the student's gap
  it closes, and the gap that layer's student attention causes alone in the teacher (as a share of
  the student's gap); the baseline and the sums last."""
  c = load(COMPOUNDING)
  lines = [
      "| layer | teacher-forced attention cosine | fix: cls / patch | share of the gap closed: "
      "cls / patch | break: cls / patch | gap alone ÷ the student's: cls / patch |",
      "|---|---|---|---|---|---|",
  ]
  for row in c["layers"]:
    rec, alone = row["recovered_share"], row["gap_alone_share"]
    lines.append(
        f"| {row['layer']} | {row['attention_tf_cosine']:.3f} | {row['fix_cls']:.3f} / "
        f"{row['fix_patch']:.3f} | {rec['cls']:+.3f} / {rec['patch']:+.3f} | "
        f"{row['break_cls']:.3f} / {row['break_patch']:.3f} | {alone['cls']:.3f} / "
        f"{alone['patch']:.3f} |"
    )
  base, rec, alone = c["baseline"], c["sum_recovered_share"], c["sum_gap_alone_share"]
  lines.append(
      f"| the student ({c['n_photos']} photos, {c['res']} px) | | {base['cls']:.3f} / "
      f"{base['patch']:.3f} | sum {rec['cls']:.2f} / {rec['patch']:.2f} | | sum "
      f"{alone['cls']:.2f} / {alone['patch']:.2f} |"
  )
  return "\n".join(lines)


# Issue 49's goals on cross-source test photos: (size or None for every size, what, threshold,
# how to read it from a whole-view row).
CROSS_GOALS = (
    (None, "cls cosine", 0.97, lambda r: r["cls_cosine"]["mean"]),
    (None, "patch cosine", 0.96, lambda r: r["patch_cosine"]["mean"]),
    (None, "worst photo, cls / patch", 0.90,
     lambda r: min(r["cls_cosine"]["worst"], r["patch_cosine"]["worst"])),
    (224, "dense drop-in (share of patches)", 0.85, lambda r: r["dense"]["drop_in"]["mean"]),
    (224, "dense probe, student ÷ teacher", 0.95, lambda r: r["dense"]["probe_ratio"]),
    (896, "student ÷ teacher images/s", 4.0,
     lambda r: r["student_images_per_s"] / r["teacher_images_per_s"]),
)  # fmt: skip


def cross_goals(
    study_path: str, name: str, operator: Mapping[str, Any] | None = None
) -> Callable[[Load], str]:
  """Issue 49's goals against run `name` of a study, on its cross-source test photos: whole views
  at every size, the worst photo, the dense measure and crop retrieval at the base size, speed at
  the largest size (FLOPs: flop_ratio with `operator`'s keywords, the run's student), k-NN
  retention and the whole run's minutes."""

  def render(load: Load) -> str:
    run = load(study_path)[name]
    test = run["test"]
    rows = {(r["size"], r["view"]): r for r in test["rows"]}
    sizes = _sizes(run)
    lines = [
        f"| size | measure ({test['n_test']} cross-source test photos, whole views) | goal "
        "| measured | |",
        "|---|---|---|---|---|",
    ]

    def add(at: Any, what: str, goal: float, value: float, shown: str) -> None:
      lines.append(
          f"| {at} | {what} | ≥ {goal:g} | {shown} | {'met' if value >= goal else 'not met'} |"
      )

    for size, what, goal, get in CROSS_GOALS:
      for at in [size] if size else sizes:
        row = rows.get((at, "whole"))
        if row is None:
          continue
        value = get(row)
        stat = {"cls cosine": "cls_cosine", "patch cosine": "patch_cosine"}.get(what)
        if stat:
          shown = _ci(row[stat])
        elif what.startswith("dense drop-in"):
          shown = _ci(row["dense"]["drop_in"])
        elif what.startswith("worst"):
          shown = (
              f"{row['cls_cosine']['worst']:.3f} ({row['cls_cosine']['worst_photo']}) / "
              f"{row['patch_cosine']['worst']:.3f} ({row['patch_cosine']['worst_photo']})"
          )
        else:
          shown = f"{value:.2f}"
        add(f"{at} px", what, goal, value, shown)
    # a GPU or TPU gains what the FLOPs say, not what CPU time says
    ratio = flop_ratio(sizes[-1], **(operator or {}))
    add(f"{sizes[-1]} px", "teacher ÷ student FLOPs (ViT-S/14 blocks, analytic)", 2.0, ratio,
        f"{ratio:.2f}")  # fmt: skip
    found = test.get("crop_retrieval") or {}
    if "retention" in found:
      add(
          f"{found['size']} px",
          f"crop retrieval, student ÷ teacher top-1 ({found['n_queries']} crops)",
          0.97,
          found["retention"],
          f"{found['retention']:.2f} ({100 * found['teacher_top1']['mean']:.1f} → "
          f"{100 * found['student_top1']['mean']:.1f} %)",
      )
    knn = run["knn"]
    if knn.get("retention") is not None:
      add(
          f"{test['res']} px",
          f"k-NN retention ({knn['dataset']}, {knn['eval_examples']} queries)",
          0.99,
          knn["retention"],
          f"{100 * knn['retention']:.1f} % ({100 * knn['teacher_top1']:.1f} → "
          f"{100 * knn['student_top1']:.1f} %)",
      )
    total = run["timing_s"]["total"] / 60
    lines.append(
        f"| | the whole run on 2 CPU cores | ≤ 105 min | {total:.0f} min "
        f"| {'met' if total <= 105 else 'not met'} |"
    )
    return "\n".join(lines)

  return render


def fit_gap(study_path: str, name: str) -> Callable[[Load], str]:
  """Run `name` on three photo sets: those it trained on (seen, compare --seen), its training
  folder's held-out photos (in_source) and the cross-source test photos: cls / patch cosine of
  whole views and the dense drop-in at each size the set was measured at. Fit far above the
  held-out figures: what the student sees limits it, not what its operator can express."""

  def render(load: Load) -> str:
    run = load(study_path)[name]
    sizes = _sizes(run)
    head = " | ".join(f"{s} px: cls / patch" for s in sizes)
    lines = [
        f"| photos | n | {head} | {sizes[0]} px: drop-in |",
        "|---|---|" + "---|" * len(sizes) + "---|",
    ]
    sets = (
        ("seen", "trained on (compare --seen)"),
        ("in_source", "held out of the training folder (compare --holdout)"),
        ("test", "other sources (eval_folder, the run's own test)"),
        ("people", "photos of people (compare --photos: test only)"),
    )
    for key, label in sets:
      table = run.get(key)
      if not table:
        continue
      cells = []
      for s in sizes:
        found = [r for r in table["rows"] if r["size"] == s and r["view"] == "whole"]
        cells.append(
            f"{found[0]['cls_cosine']['mean']:.3f} / {found[0]['patch_cosine']['mean']:.3f}"
            if found
            else "—"
        )
      base = _whole_row(table, sizes[0])
      lines.append(
          f"| {label} | {table['n_test']} | {' | '.join(cells)} "
          f"| {base['dense']['drop_in']['mean']:.3f} |"
      )
    return "\n".join(lines)

  return render


def paired(
    study_path: str, pairs: Sequence[tuple[str, str, str]], photos: str = "test"
) -> Callable[[Load], str]:
  """Photo by photo (per_photo), what run `arm` gains over run `ref` of a study on the same test
  photos: the mean difference in cls / patch cosine of whole views at each size with its paired
  bootstrap 95 % interval, which is far narrower than the two runs' own intervals side by side
  (both runs see the same hard and easy photos). `pairs`: (ref, arm, label), where ref and arm
  may each be a tuple of runs (seeds): each photo's value is then their mean, so the interval is
  over photos of the seeds' average; `photos`: which of a run's test tables ("test": its own
  cross-source test; "people": compare's on people)."""
  from linvit_jax.evaluation import photo_eval

  def runs(name: str | tuple[str, ...]) -> tuple[str, ...]:
    return (name,) if isinstance(name, str) else tuple(name)

  def render(load: Load) -> str:
    study = load(study_path)
    sizes = sorted({r["size"] for r in study[runs(pairs[0][0])[0]][photos]["rows"]})
    head = " | ".join(f"{s} px: Δ cls | {s} px: Δ patch" for s in sizes)
    lines = [f"| change | photos | {head} |", "|---|---|" + "---|---|" * len(sizes)]

    def per_photo(names: tuple[str, ...], size: int, key: str) -> dict[str, float]:
      tables = [_whole_row(study[n][photos], size)[key]["per_photo"] for n in names]
      shared = set.intersection(*(set(t) for t in tables))
      return {p: statistics.fmean(t[p] for t in tables) for p in shared}

    def diff(ref: dict[str, float], arm: dict[str, float]) -> tuple[str, int]:
      names = sorted(set(ref) & set(arm))
      d = [arm[n] - ref[n] for n in names]
      lo, hi = photo_eval.bootstrap_interval(d)
      return f"{statistics.fmean(d):+.3f} [{lo:+.3f}, {hi:+.3f}]", len(names)

    for ref_name, arm_name, label in pairs:
      cells, count = [], 0
      for s in sizes:
        for key in ("cls_cosine", "patch_cosine"):
          ref, arm = (per_photo(runs(n), s, key) for n in (ref_name, arm_name))
          shown, count = diff(ref, arm)
          cells.append(shown)
      lines.append(f"| {label} | {count} | {' | '.join(cells)} |")
    return "\n".join(lines)

  return render


# The operators measured on the cross-source photos, fidelity against 896-px speed: (name in
# DATA_STUDY, what the student is, flop_ratio's keywords for its operator).
PARETO = (
    ("SDL", "linear (the default operator)", {}),
    ("SDL_w3_1600", "linear + exact 3×3 window (`window=3`)", {"window": 3}),
    (
        "SDL_hyb1_1600",
        "linear, one softmax layer (`softmax_layers=1`: layer 4)",
        {"softmax_layers": 1},
    ),
    ("SDL_10k", "linear, rank-8 LoRA `align`: the README's command before full-rank `align`", {}),
    ("SDL_tf0_10k_readme", "linear: the README's command before the hybrid default", {}),
    ("SDL_nf128_10k", "linear, 256 features a head (`num_features=128`)", {"num_features": 128}),
    (
        "SDL_hyb1s_10k",
        "linear, one softmax layer (`softmax_layers=1,softmax_pick=sensitivity`: layer 4)",
        {"softmax_layers": 1},
    ),
    (
        "README_hyb",
        "one softmax layer, keys pooled to 32² (`softmax_key_grid=2x`): the README's command",
        {"softmax_layers": 1, "key_grid": 32},
    ),
    (
        "HYB2_s0",
        "two softmax layers, keys pooled to 32² (`softmax_layers=2`: layers 4 and 9)",
        {"softmax_layers": 2, "key_grid": 32},
    ),
)
# The wider feature map at the full budget.
NF128_ARM = "SDL_nf128_10k"
# One softmax layer at the full budget, picked by sensitivity (layer_swap.fix_gains).
HYBRID_ARM = "SDL_hyb1s_10k"
# Paired comparisons of the operators (as PAIRS).
OPERATOR_PAIRS = (
    ("SDL_10k", "SDL_nf128_10k", "10,000 images: 128 → 256 features a head"),
    ("SDL_10k", "SDL_hyb1s_10k", "10,000 images: linear → one softmax layer"),
    ("SDL_1600", "SDL_hyb1_1600", "1,600 images: linear → one softmax layer"),
    ("SDL_1600", "SDL_w3_1600", "1,600 images: linear → window=3"),
)

# `align` refitted for the 68-photo folder, at the full budget: each arm resumes the README run's
# own finished distillation (the same seed and views) and changes only its `align` options, so a
# pair differs in `align` alone. (name in DATA_STUDY, its `align`.)
ALIGN_ARMS = (
    ("SDL_10k", "rank-8 LoRA, mixup views (the default until 2026-12-07)"),
    ("SDL_lora0_10k", "full rank (`align_lora=0`)"),
    ("SDL_lora0_mix0_10k", "full rank, plain views (`align_lora=0,align_mixup=0`)"),
    ("SDL_lora0_lr4_10k", "full rank, twice the lr (`align_lora=0,lr_align=4e-4`)"),
    (
        "SDL_lora0_tf0_10k",
        "full rank, no teacher-forced term (`align_lora=0,align_w_attn_tf=0`)",
    ),
    (
        "SDL_color_10k",
        "today's default on colour-jittered views (`align_augment=color`)",
    ),
    (
        "SDL_df04_10k",
        "today's default, 6,000 images after 4,000 of distillation (`distill_fraction=0.4`)",
    ),
)
# The first three against the rank-8 README run they resumed; the fourth against the full-rank
# README run whose distillation it resumed; the fifth, the README's command run whole with each of
# the two (its default since 2026-12-07 against the one it replaced); the colour arm against
# today's README run, whose distillation it resumed; the larger `align` share against the same run
# (from scratch: its distillation is shorter).
ALIGN_PAIRS = tuple(("SDL_10k", name, label) for name, label in ALIGN_ARMS[1:4]) + (
    (
        "SDL_lora0_10k_readme",
        "SDL_lora0_tf0_10k",
        "full rank → no teacher-forced term (resuming its distillation)",
    ),
    (
        "SDL_lora0_10k_readme",
        "SDL_tf0_10k_readme",
        "the README's command, whole: → no teacher-forced term (today's default)",
    ),
    (
        "SDL_tf0_10k_readme",
        "SDL_color_10k",
        "today's default → colour-jittered `align` views (resuming its distillation)",
    ),
    (
        "SDL_tf0_10k_readme",
        "SDL_df04_10k",
        "today's default → 4,000 + 6,000 images (`distill_fraction=0.4`, from scratch)",
    ),
)


def pareto(
    study_path: str, arms: Sequence[tuple[str, str, dict[str, Any]]]
) -> Callable[[Load], str]:
  """Each operator's cross-source fidelity (cls / patch cosine of whole views at the smallest and
  the largest size) against its speed at the largest size: student ÷ teacher images/s as its run
  measured them, and the analytic FLOP ratio (flop_ratio). "front": no other run of the same
  image budget is at least as fast and as faithful at the largest size (cls), and better in one."""

  def render(load: Load) -> str:
    study = load(study_path)
    sizes = _sizes(study[arms[0][0]])
    low, high = sizes[0], sizes[-1]
    points = {}
    for name, _, _ in arms:
      row = _whole(study[name], high)
      points[name] = (
          study[name]["images_seen"],
          row["cls_cosine"]["mean"],
          row["student_images_per_s"] / row["teacher_images_per_s"],
      )
    lines = [
        f"| student ({study[arms[0][0]]['test']['n_test']} cross-source test photos) | images "
        f"| {low} px: cls / patch | {high} px: cls / patch | {high} px: images/s ÷ teacher's "
        f"| {high} px: FLOPs, teacher ÷ student | ≥ 4× at {high} px | front |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, label, operator in arms:
      run = study[name]
      images, cls, speed = points[name]
      rows = [_whole(run, s) for s in (low, high)]
      cells = [f"{r['cls_cosine']['mean']:.3f} / {r['patch_cosine']['mean']:.3f}" for r in rows]
      beaten = any(
          o != name and b == images and c >= cls and v >= speed and (c > cls or v > speed)
          for o, (b, c, v) in points.items()
      )
      lines.append(
          f"| {label} | {images:,} | {' | '.join(cells)} | {speed:.2f}× "
          f"| {flop_ratio(high, **operator):.2f}× | {'yes' if speed >= 4 else 'no'} "
          f"| {'' if beaten else 'yes'} |"
      )
    return "\n".join(lines)

  return render


WINDOW_SHARE = "docs/window_share.json"


def window_share(load: Load) -> str:
  """studies/window_share.py's JSON: per layer, the teacher's softmax mass on a window student's
  exact set (the w×w window and the prefix tokens) and the student's own share of its mixed
  attention there, at each size; then the teacher's mass split into the window patches and the
  prefix; last, the means over layers and the student's share as a ratio of the teacher's mass."""
  ws = load(WINDOW_SHARE)
  blocks = ws["resolutions"]
  sizes = [block["res"] for block in blocks]
  columns = (
      ("teacher", "teacher_exact_mass"),
      ("student", "student_share"),
      ("teacher: window", "teacher_window_mass"),
      ("teacher: prefix", "teacher_prefix_mass"),
  )
  head = " | ".join(f"{what} {s} px" for what, _ in columns for s in sizes)
  lines = [f"| layer | {head} |", "|---|" + "---|" * (len(columns) * len(sizes))]
  for layer in range(len(blocks[0]["layers"])):
    cells = [f"{b['layers'][layer][key]:.3f}" for _, key in columns for b in blocks]
    lines.append(f"| {layer} | {' | '.join(cells)} |")
  means = [statistics.fmean(r[key] for r in b["layers"]) for _, key in columns for b in blocks]
  lines.append(f"| mean ({ws['n_photos']} photos) | {' | '.join(f'{m:.3f}' for m in means)} |")
  ratios = [
      statistics.fmean(r["student_share"] / r["teacher_exact_mass"] for r in b["layers"])
      for b in blocks
  ]
  lines.append(
      "| student ÷ teacher (mean of layers) | "
      + " | ".join([""] * len(sizes) + [f"{x:.2f}" for x in ratios] + [""] * (2 * len(sizes)))
      + " |"
  )
  return "\n".join(lines)


# The README's command under a second seed (seed 1, k-NN off), beside the README run (seed 0).
README_SEEDS = ("SDL_tf0_10k_readme", "SEED1_10k")

# One softmax layer at the full budget with today's `align` (from the README run's own
# distillation), and the same weights with the layer's patch keys pooled (compare on the
# cross-source folder with key_grid set in the export): (name in DATA_STUDY, label,
# bench/hybrid_speed.py case, flop_ratio's keywords).
HYBRID_KEYS = ("bench/results/hybrid_speed.json", "bench/results/hybrid_speed_b8.json")
KEY_ARMS = (
    ("SDL_tf0_10k_readme", "linear (the README's command)", "linear", {}),
    (
        "HYB1_10k",
        "one softmax layer, every key (`softmax_layers=1,softmax_pick=sensitivity`)",
        "hybrid",
        {"softmax_layers": 1},
    ),
    (
        "HYB1_10k_keys32",
        "the same weights, keys pooled to 32×32 (`softmax_key_grid=32`)",
        "hybrid_keys32",
        {"softmax_layers": 1, "key_grid": 32},
    ),
    (
        "HYB1_10k_keys16",
        "the same weights, keys pooled to 16×16 (`softmax_key_grid=16`)",
        "hybrid_keys16",
        {"softmax_layers": 1, "key_grid": 16},
    ),
)
KEY_PAIRS = (
    ("SDL_tf0_10k_readme", "SEED1_10k", "the README's command: seed 0 → seed 1"),
    ("SDL_tf0_10k_readme", "HYB1_10k", "linear → one softmax layer, every key"),
    ("SDL_tf0_10k_readme", "HYB1_10k_keys32", "linear → one softmax layer, keys pooled to 32²"),
    ("SDL_tf0_10k_readme", "HYB1_10k_keys16", "linear → one softmax layer, keys pooled to 16²"),
    ("HYB1_10k", "HYB1_10k_keys32", "every key → pooled to 32² (the same weights)"),
    ("HYB1_10k", "HYB1_10k_keys16", "every key → pooled to 16² (the same weights)"),
)


# The pooled hybrid under two seeds beside the README's command under the same two: (label,
# ((seed, name in DATA_STUDY), ...)). Seed 0's hybrid is HYB1_10k measured with its keys pooled
# (compare); seed 1's pooled them in its own run (softmax_key_grid=32 from the start).
HYBRID_SEED_ARMS = (
    ("linear (the README's command)", ((0, "SDL_tf0_10k_readme"), (1, "SEED1_10k"))),
    (
        "one softmax layer, keys pooled to 32² (`softmax_layers=1,softmax_pick=sensitivity,"
        "softmax_key_grid=32`)",
        ((0, "HYB1_10k_keys32"), (1, "HYBK_s1")),
    ),
)
HYBRID_SEED_PAIRS = (
    ("SDL_tf0_10k_readme", "HYB1_10k_keys32", "seed 0: linear → pooled hybrid"),
    ("SEED1_10k", "HYBK_s1", "seed 1: linear → pooled hybrid"),
    (
        ("SDL_tf0_10k_readme", "SEED1_10k"),
        ("HYB1_10k_keys32", "HYBK_s1"),
        "mean of seeds 0 and 1: linear → pooled hybrid",
    ),
    ("SDL_tf0_10k_readme", "README_hyb", "the README's command: all-linear → since 2026-12-07"),
    ("HYB1_10k_keys32", "README_hyb", "seed 0's pooled hybrid → the README's command run whole"),
)


# One softmax layer (the README's command since 2026-12-07) against two (sensitivity's next pick
# beside layer 4), each under seeds 0 and 1, all from fresh distillations of their own seed.
TWO_LAYER_ARMS = (
    ("linear (`softmax_layers=0`)", ((0, "SDL_tf0_10k_readme"), (1, "SEED1_10k"))),
    (
        "one softmax layer, keys pooled to 32² (the README's command)",
        ((0, "README_hyb"), (1, "HYBK_s1")),
    ),
    (
        "two softmax layers, keys pooled to 32² (`softmax_layers=2`)",
        ((0, "HYB2_s0"), (1, "HYB2_s1")),
    ),
)
TWO_LAYER_PAIRS = (
    ("README_hyb", "HYB2_s0", "seed 0: one → two softmax layers (layers 4, 9)"),
    ("HYBK_s1", "HYB2_s1", "seed 1: one → two softmax layers (layers 4, 5)"),
    (("README_hyb", "HYBK_s1"), ("HYB2_s0", "HYB2_s1"), "mean of seeds 0 and 1: one → two"),
)


def arm_seeds(
    study_path: str, arms: Sequence[tuple[str, Sequence[tuple[int, str]]]]
) -> Callable[[Load], str]:
  """Arms under several seeds: cls / patch cosine of whole views at each size and the largest
  size's images/s over the teacher's as the run (or compare) measured it, one row per seed and
  the seeds' mean."""

  def render(load: Load) -> str:
    study = load(study_path)
    first = study[arms[0][1][0][1]]
    sizes = _sizes(first)
    head = " | ".join(f"{s} px: cls / patch" for s in sizes)
    lines = [
        f"| student ({first['test']['n_test']} cross-source test photos) | seed | {head} "
        f"| {sizes[-1]} px: images/s ÷ teacher's |",
        "|---|---|" + "---|" * len(sizes) + "---|",
    ]
    for label, seeded in arms:
      values = []  # per seed: [cls, patch per size..., speed]
      for _seed, name in seeded:
        rows = [_whole(study[name], s) for s in sizes]
        v = [x for r in rows for x in (r["cls_cosine"]["mean"], r["patch_cosine"]["mean"])]
        v.append(rows[-1]["student_images_per_s"] / rows[-1]["teacher_images_per_s"])
        values.append(v)
      shown_rows = list(zip(seeded, values))
      if len(seeded) > 1:  # one seed is its own mean
        shown_rows.append(((None, None), _column_means(values)))
      for (seed, _), v in shown_rows:
        cells = [f"{v[2 * i]:.3f} / {v[2 * i + 1]:.3f}" for i in range(len(sizes))]
        shown = f"**{' / '.join(str(s) for s, _ in seeded)} mean**" if seed is None else seed
        lines.append(f"| {label} | {shown} | {' | '.join(cells)} | {v[-1]:.2f}× |")
    return "\n".join(lines)

  return render


def _column_means(rows: Sequence[Sequence[float]]) -> list[float]:
  return [statistics.fmean(column) for column in zip(*rows)]


def hybrid_keys(
    study_path: str,
    arms: Sequence[tuple[str, str, str, dict[str, Any]]],
    bench_paths: Sequence[str],
) -> Callable[[Load], str]:
  """Cross-source fidelity (cls / patch cosine of whole views at each size) against speed at the
  largest size: as the run (or compare) measured it on the test photos, one model after the
  other, and from interleaved bench runs of the same architectures, one per batch size (bench/hybrid_speed.py: images/s over the teacher's, measured in the same rounds, so the
  students' ratios compare with each other), beside the analytic FLOP ratio."""

  def render(load: Load) -> str:
    study, benches = load(study_path), [load(p) for p in bench_paths]
    sizes = _sizes(study[arms[0][0]])
    high = sizes[-1]
    speeds = [{r["case"]: r["speedup"] for r in b["rows"] if r["px"] == high} for b in benches]
    head = " | ".join(f"{s} px: cls / patch" for s in sizes)
    batches = " | ".join(
        f"{high} px: images/s ÷ teacher's, batch {b.get('batch', 1)}" for b in benches
    )
    lines = [
        f"| student ({study[arms[0][0]]['test']['n_test']} cross-source test photos) | {head} "
        f"| {high} px: images/s ÷ teacher's, as the run measures it | {batches} "
        f"| {high} px: FLOPs, teacher ÷ student |",
        "|---|" + "---|" * (len(sizes) + len(benches)) + "---|---|",
    ]
    for name, label, case, operator in arms:
      rows = [_whole(study[name], s) for s in sizes]
      cells = [f"{r['cls_cosine']['mean']:.3f} / {r['patch_cosine']['mean']:.3f}" for r in rows]
      own = rows[-1]["student_images_per_s"] / rows[-1]["teacher_images_per_s"]
      rates = [f"{own:.2f}×"] + [f"{speed[case]:.2f}×" for speed in speeds]
      lines.append(
          f"| {label} | {' | '.join(cells)} | {' | '.join(rates)} "
          f"| {flop_ratio(high, **operator):.2f}× |"
      )
    for b in benches:
      m = b["machine"]
      lines.append(
          f"\nBatch {b.get('batch', 1)}: `python -m bench.hybrid_speed"
          f"{' --px 896 --batch ' + str(b['batch']) if b.get('batch', 1) > 1 else ''}`, "
          f"{b['variant']}, softmax layer {b['layer']}, median of {b['reps']} interleaved rounds, "
          f"commit {b['commit']}, {m['cpus']} CPUs, load average at the start "
          f"{', '.join(f'{x:.2f}' for x in m['load_avg'] or ())}."
      )
    return "\n".join(lines)

  return render


KEY_POOLING = "docs/key_pooling_teacher.json"


def key_pooling(load: Load) -> str:
  """studies/key_pooling.py's JSON: per layer, the teacher with that layer's patch keys pooled
  against the teacher, cls / patch cosine (mean over photos, the lowest photo's cls in brackets)
  at each size and key grid."""
  kp = load(KEY_POOLING)
  blocks = kp["sizes"]
  head = " | ".join(f"{b['res']} px, keys {b['pooled_to']}² of {b['grid']}²" for b in blocks)
  lines = [f"| layer pooled | {head} |", "|---|" + "---|" * len(blocks)]
  for i, first in enumerate(blocks[0]["layers"]):
    cells = []
    for b in blocks:
      r = b["layers"][i]
      cells.append(f"{r['cls']:.3f} ({r['cls_min']:.3f}) / {r['patch']:.3f}")
    lines.append(f"| {first['layer']} | {' | '.join(cells)} |")
  lines.append(
      f"\ncls (lowest photo's cls) / patch cosine to the teacher; {kp['n_photos']} photos, "
      "whole views."
  )
  return "\n".join(lines)


# Where the worst cross-source photos' gap sits (2026-12-08): the compounding study per photo on
# the two-layer student of seed 0 (HYB2_s0), each pick rule's gains on its distilled student, and
# the single-seed arms that followed (one softmax layer at 8 rather than 4; exact cls rows).
WORST_COMPOUNDING = "docs/worst_photos/compounding_hyb2_s0_224.json"
PICK_GAINS = "docs/worst_photos/pick_gains_seed0.json"
WORST_SHOWN = 6  # the worst photos by cls in the per-photo table
CLS_LEVER_ARMS = (
    (
        "one softmax layer, layer 4 (the README's command, `softmax_pick=sensitivity`)",
        ((0, "README_hyb"),),
    ),
    ("one softmax layer, layer 8 (`softmax_pick=8`)", ((0, "PICK8_s0"),)),
    ("the README's command + `exact_prefix` (sensitivity kept layer 11)", ((0, "EXP_s0"),)),
)
CLS_LEVER_PAIRS = (
    ("README_hyb", "PICK8_s0", "seed 0: softmax layer 4 → 8"),
    ("README_hyb", "EXP_s0", "seed 0: + `exact_prefix` (softmax layer 4 → 11)"),
)


def _largest_gains(gains: Sequence[float], n: int = 3) -> str:
  """ "layer: gain" of the n largest per-layer gains, largest first."""
  best = sorted(range(len(gains)), key=lambda l: -gains[l])[:n]
  return ", ".join(f"{l}: {gains[l]:+.3f}" for l in best)


def worst_photos(path: str, study_path: str, run: str) -> Callable[[Load], str]:
  """Per photo, worst first by cls: the student's cls / patch cosine and the three layers whose
  teacher attention (fix one) gains most cls, then per split the mean gain per layer (the test
  photos: those of `run`'s own test table in the study; validation: the others)."""

  def render(load: Load) -> str:
    results = load(path)
    rows = results["per_photo"]
    test = set(_whole_row(load(study_path)[run]["test"], results["res"])["cls_cosine"]["per_photo"])
    splits = {
        "validation": [r["photo"] for r in rows if r["photo"] not in test],
        "test": [r["photo"] for r in rows if r["photo"] in test],
    }
    lines = [
        f"| photo ({results['n_photos']} cross-source photos, {results['res']} px, whole views) "
        "| split | student cls / patch | largest cls gains from fixing one layer |",
        "|---|---|---|---|",
    ]
    split_of = {p: s for s, names in splits.items() for p in names}
    for row in rows[:WORST_SHOWN]:
      shown = _largest_gains(row["fix_gain"]["cls"])
      student = f"{row['student']['cls']:.3f} / {row['student']['patch']:.3f}"
      lines.append(f"| `{row['photo']}` | {split_of.get(row['photo'], '')} | {student} | {shown} |")
    for split, names in splits.items():
      chosen = [r for r in rows if r["photo"] in names]
      for m in ("cls", "patch"):
        mean = [
            statistics.fmean(r["fix_gain"][m][l] for r in chosen)
            for l in range(len(rows[0]["fix_gain"][m]))
        ]
        shown = _largest_gains(mean)
        student = statistics.fmean(r["student"][m] for r in chosen)
        lines.append(
            f"| mean of the {len(chosen)} {split} photos, {m} | {split} | {student:.3f} ({m}) | {shown} |"
        )
    return "\n".join(lines)

  return render


def pick_gains(path: str) -> Callable[[Load], str]:
  """tools/pick_gains.py's results: per image set and rule, the layer picked and the three
  largest mean gains."""

  def render(load: Load) -> str:
    results = load(path)
    lines = [
        "| images the pick measures on | images | rule | picks | largest gains (layer: cosine gain) |",
        "|---|---|---|---|---|",
    ]
    labels = {
        "sample": "the fidelity sample (random crops of the validation photos)",
        "eval_view": "the validation photos' centre views (`softmax_pick_images=eval_view`)",
    }
    for name, label in labels.items():
      block = results[name]
      for rule in ("sensitivity", "sensitivity_worst"):
        shown = _largest_gains(block[rule]["gains"])
        lines.append(
            f"| {label} | {block['images']} | `{rule}` | {block[rule]['pick']} | {shown} |"
        )
    return "\n".join(lines)

  return render
