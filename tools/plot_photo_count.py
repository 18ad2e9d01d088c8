"""Cross-source fidelity against the number of training photos, from a study JSON of
tools/collect_test_photos.py (the photo-count arms of docs/data_study.md).

  python tools/plot_photo_count.py STUDY.json NAME=PHOTOS [NAME=PHOTOS ...] --out PLOT.png

Per size the study's runs were tested at, one panel: cls and patch cosine of whole views (mean
and 95 % interval over the test photos) at each run's training-photo count (PHOTOS: what the run
trained on after its holdout, given by hand since the study records the folder, not the count).
Nothing is recomputed: the figures are the runs' own test tables.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MEASURES = (("cls_cosine", "cls", "tab:blue"), ("patch_cosine", "patch", "tab:orange"))


def points(study: dict[str, Any], arms: list[tuple[str, int]]) -> dict[int, dict[str, list]]:
  """{size: {measure: [(photos, mean, lo, hi), ...]}} of whole views, arms in photo order."""
  out: dict[int, dict[str, list]] = {}
  for name, photos in sorted(arms, key=lambda a: a[1]):
    if name not in study:
      raise SystemExit(f"{name!r} is not a run of the study (it has {sorted(study)})")
    for row in study[name]["test"]["rows"]:
      if row["view"] != "whole":
        continue
      per_size = out.setdefault(row["size"], {m: [] for m, _, _ in MEASURES})
      for m, _, _ in MEASURES:
        c = row[m]
        per_size[m].append((photos, c["mean"], c["lo"], c["hi"]))
  return out


def plot(by_size: dict[int, dict[str, list]], n_test: int, out: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  sizes = sorted(by_size)
  fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.4), sharey=True)
  for ax, size in zip(axes if len(sizes) > 1 else [axes], sizes):
    for m, label, color in MEASURES:
      xs, mean, lo, hi = zip(*by_size[size][m])
      ax.plot(xs, mean, "o-", color=color, label=label)
      ax.fill_between(xs, lo, hi, color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("training photos")
    ax.set_title(f"{size} px, whole views, {n_test} cross-source test photos", fontsize=9)
    ax.grid(alpha=0.3)
  first = axes[0] if len(sizes) > 1 else axes
  first.set_ylabel("cosine to the teacher (95 % CI)")
  first.legend(loc="lower right")
  fig.tight_layout()
  fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
  if "--out" not in argv or len(argv) < 4:
    print(__doc__, file=sys.stderr)
    return 2
  i = argv.index("--out")
  out, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
  with open(rest[0]) as f:
    study = json.load(f)
  arms = []
  for spec in rest[1:]:
    name, _, photos = spec.partition("=")
    if not photos.isdigit():
      raise SystemExit(f"{spec!r}: expected NAME=PHOTOS, a run of the study and its photo count")
    arms.append((name, int(photos)))
  by_size = points(study, arms)
  plot(by_size, study[arms[0][0]]["test"]["n_test"], out)
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
