"""The default recipe, end to end, on every tiny Hugging Face / timm fixture in tests/data/foreign.

  python tools/convert_fixtures.py OUT.json --images PHOTOS --workdirs DIR [--max_images 800]

Each fixture (DINOv2 with and without registers, SigLIP with its MAP head, a supervised ViT with
a head; Hugging Face and timm layouts) is converted by `linvit_jax.convert` with convert_folder's
defaults at the fixture's own 28 px, on the same photo folder and a reduced image budget; its
exported student is then loaded back and run on a photo. Written per fixture: the family, pool
type, registers, the test-photo table (results["test"]), k-NN retention, the run's minutes, and
what the reloaded student gave. The fixtures carry random weights (they exist to test the
importers), so the cosines show that the recipe runs and moves every family the same way, not
what a pretrained model of that family reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "data", "foreign")


def convert_one(fixture: str, images: str, workdir: str, max_images: int) -> dict[str, Any]:
  import linvit_jax

  # A finished workdir is not trained again (convert resumes it), so an interrupted study
  # restarts where it stopped.
  linvit_jax.convert(fixture, images=images, workdir=workdir, res=28, max_images=max_images)
  with open(os.path.join(workdir, "results.json")) as f:
    r = json.load(f)
  # What a user does next: load the export and encode a photo.
  student = linvit_jax.load_student(workdir)
  photo = sorted(
      os.path.join(images, p) for p in os.listdir(images) if p.lower().endswith((".jpg", ".png"))
  )[0]
  feature = student.encode([photo])
  model = r["config"]["model"]
  return {
      "fixture": os.path.basename(fixture),
      "pool_type": model["pool_type"],
      "reg_tokens": model.get("reg_tokens", 0),
      "width": model["width"],
      "depth": model["depth"],
      "test": r["test"],
      "knn": {k: v for k, v in (r.get("knn") or {}).items() if not isinstance(v, (dict, list))},
      # The pooled feature (cls token, MAP head or mean, as the teacher pools): every family has it.
      "pooled_cosine": {
          k: r["end_to_end_" + k]["pre_logits_cosine"] for k in ("converted", "after_align")
      },
      "minutes": r["timing_s"]["total"] / 60,  # the run's own clock
      "reloaded_feature_shape": list(feature.shape),
      "reloaded_feature_finite": bool(np.all(np.isfinite(feature))),
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out")
  parser.add_argument("--images", required=True, help="a photo folder (e.g. debian_photos')")
  parser.add_argument("--workdirs", required=True, help="one workdir per fixture goes under it")
  parser.add_argument("--max_images", type=int, default=800)
  args = parser.parse_args(argv)
  rows = []
  for name in sorted(os.listdir(FIXTURES)):
    print(f"== {name}", flush=True)
    workdir = os.path.join(args.workdirs, name)
    rows.append(convert_one(os.path.join(FIXTURES, name), args.images, workdir, args.max_images))
  with open(args.out, "w") as f:
    json.dump({"max_images": args.max_images, "res": 28, "fixtures": rows}, f, indent=1)
  print(f"wrote {args.out}: {len(rows)} fixtures")
  return 0


if __name__ == "__main__":
  sys.exit(main())
