"""Collects the test-photo tables of finished runs into one committed JSON, for a docs table.

  python tools/collect_test_photos.py OUT.json NAME=WORKDIR|NAME=COMPARE.json [...] [--update]

--update keeps the runs already in OUT.json that are not named (their workdirs may be gone).
NAME=COMPARE.json takes `python -m linvit_jax.compare --out`'s table as that entry's test table
(a run measured again with today's measures, e.g. photo by photo for a paired comparison).

Per run: the options that differ from convert_folder's defaults, the test table
(results["test"]: sizes, views, intervals, dense measure), where the time went (timing_s) and
each stage's steps, batch and seconds a step, k-NN retention and speed, the run's own validation
figures after its last stage; and, when the run validated and tested on another folder
(eval_folder=) and the workdir holds in_source.json (`python -m linvit_jax.compare --holdout F
--out WORKDIR/in_source.json` on its training folder), that table of its own held-out photos as
"in_source", seen.json (the same with --seen: the photos it trained on) as "seen", and
people.json (`compare --photos PEOPLE_DIR --val_photos CROSS_DIR`: photos of people, test only)
as "people". Nothing is recomputed: every figure is a file the run or compare wrote.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _options(config: dict[str, Any]) -> dict[str, Any]:
  """What identifies the run's recipe: its stages with steps, batch and size."""
  return {
      name: {
          "steps": config[name]["steps"],
          "batch_size": config[name]["batch_size"],
          "image_size": config[name].get("image_size") or config["data"]["image_size"],
      }
      for name in config["stages"]
  }


def _step_seconds(r: dict[str, Any]) -> dict[str, float]:
  out = {}
  for stage, rows in (r.get("histories") or {}).items():
    rates = sorted(row["steps_per_sec"] for row in rows if row.get("steps_per_sec"))
    if rates:  # the first logged rate includes compiling; the median ignores it
      out[stage] = 1.0 / rates[len(rates) // 2]
  return out


# compare's JSONs a workdir may hold beside results.json, by the key they get in the study:
# the training folder's own held-out photos (compare --holdout F --out WORKDIR/in_source.json)
# the photos the run trained on (compare --holdout F --seen --out WORKDIR/seen.json), and the
# photos of people (debian_photos --set people; compare --photos P --val_photos CROSS --out
# WORKDIR/people.json), which no run validates on.
EXTRAS = {"in_source": "in_source.json", "seen": "seen.json", "people": "people.json"}


def collect(workdir: str) -> dict[str, Any]:
  with open(os.path.join(workdir, "results.json")) as f:
    r = json.load(f)
  config = r["config"]
  extra = {}
  for key, name in EXTRAS.items():
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      with open(path) as f:
        extra[key] = json.load(f)
  return {
      "workdir": os.path.basename(os.path.normpath(workdir)),
      "seed": config["seed"],
      "photos": config["data"]["data_dir"],
      "train_split": config["data"]["train_split"],
      # Where the validation and test photos come from when not the training folder.
      "eval_dataset": config["data"].get("eval_dataset", ""),
      "stages": _options(config),
      "test": r["test"],
      "timing_s": r["timing_s"],
      "images_seen": r.get("images_seen"),
      # k-NN retention and the report's speed at res (absent in runs that skipped them).
      "knn": {k: v for k, v in (r.get("knn") or {}).items() if not isinstance(v, (dict, list))},
      "student_images_per_s": r.get("student_images_per_s"),
      "teacher_images_per_s": r.get("teacher_images_per_s"),
      # Seconds per step of each stage: 1 / the median of its logged rates.
      "step_seconds": _step_seconds(r),
      **extra,
  }


def main(argv: list[str]) -> int:
  update = "--update" in argv
  argv = [a for a in argv if a != "--update"]
  if len(argv) < 2 or any("=" not in a for a in argv[1:]):
    print(__doc__, file=sys.stderr)
    return 2
  out = {}
  if update and os.path.exists(argv[0]):
    with open(argv[0]) as f:
      out = json.load(f)
  for arg in argv[1:]:
    name, path = arg.split("=", 1)
    if path.endswith(".json"):  # compare's JSON of an exported student: its test table alone
      with open(path) as f:
        out[name] = {"compare": os.path.basename(path), "test": json.load(f)}
    else:
      out[name] = collect(path)
  with open(argv[0], "w") as f:
    json.dump(out, f, indent=1, default=float)
    f.write("\n")
  print(f"wrote {argv[0]}: {', '.join(out)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
