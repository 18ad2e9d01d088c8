"""The model card, README.md of an export folder: model_card.md (shipped beside this module, a
`string.Template`) filled from a student_config.json by small functions, one per part of the
card. It gives Hub front matter (licence, base model, library, tags), the attention in words,
how the student was made, the measured numbers with their protocol, limitations and a load
snippet that runs as written from the folder itself. No local paths: the card is published.

A placeholder alone on its line that fills with "" takes its line with it (an optional line or
block: the base model, the protocol, the test photos, a limitation).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import string
from collections.abc import Mapping
from typing import Any

from linvit_jax.artifacts.provenance import hub_license
from linvit_jax.artifacts.provenance import public_name
from linvit_jax.models import attention as attn_lib


@functools.cache
def _template() -> str:
  return importlib.resources.files(__package__).joinpath("model_card.md").read_text("utf-8")


def model_card(cfg: Mapping[str, Any]) -> str:
  """README.md of an export folder (`cfg`: its student_config.json)."""
  values = card_values(cfg)
  lines = []
  for line in _template().splitlines():
    alone = line[1:] if line.startswith("$") and line[1:].isidentifier() else None
    if alone is not None and values[alone] == "":
      continue
    lines.append(string.Template(line).substitute(values))
  return "\n".join(lines) + "\n"


def card_values(cfg: Mapping[str, Any]) -> dict[str, str]:
  """The card's placeholders (model_card.md), from a student_config.json."""
  m, pre = cfg["model"], cfg.get("preprocessing") or {}
  rec, fid = cfg.get("recipe") or {}, cfg.get("fidelity") or {}
  teacher = cfg.get("teacher") or {}
  known = teacher.get("name") or public_name(teacher.get("init"))
  name = known or "a softmax ViT (not recorded)"
  surgery_only = not rec.get("stages")
  size = pre.get("image_size") or ["?", "?"]
  return {
      "license": teacher.get("license") or "other",
      "base_model": f"base_model: {json.dumps(known)}" if known else "",
      "pipeline_tag": "image-classification"
      if m.get("num_classes")
      else "image-feature-extraction",
      "teacher": name,
      "attention": describe_attention(m.get("attention", "softmax"), m.get("depth", 12)),
      "surgery_policy": str(rec.get("surgery_policy")),
      "made": (
          "surgery only: attention not distilled"
          if surgery_only
          else "attention distilled on its outputs"
      ),
      **_architecture(m, pre),
      "size": f"{size[0]}×{size[1]}",
      "pp": str(pre.get("pp")),
      "gelu": str(pre.get("gelu")),
      "recipe": _recipe(rec),
      "protocol": _protocol(fid.get("protocol")),
      "measures": "\n".join(_measures(fid)),
      "test_photos": ("\n" + "\n".join(_test_section(fid["test"]))) if fid.get("test") else "",
      "surgery_only": _SURGERY_ONLY if surgery_only else "",
      "licence": _licence(teacher, name),
  }


def _architecture(m: Mapping[str, Any], pre: Mapping[str, Any]) -> dict[str, str]:
  patch = m.get("patch_size") or pre.get("patch_size") or ["?"]
  classes = m.get("num_classes")
  return {
      "width": str(m.get("width")),
      "depth": str(m.get("depth")),
      "heads": str(m.get("num_heads")),
      "patch": "×".join(map(str, patch)),
      "pool": str(m.get("pool_type")),
      "registers": str(m.get("reg_tokens", 0)),
      "head": f"a head of {classes} classes" if classes else "no head",
  }


def _recipe(rec: Mapping[str, Any]) -> str:
  stages = rec.get("stages") or []
  text = ", ".join(
      f"{s['name']} ({s['kind']}, {s['steps']} steps × {s['batch_size']})" for s in stages
  )
  kept = f"; layers {rec['softmax_layers']} kept softmax" if rec.get("softmax_layers") else ""
  return (text or "surgery only: attention not distilled") + kept


def _protocol(proto: Mapping[str, Any] | None) -> str:
  """How the numbers were measured, with the blank line after it; "" when not recorded."""
  if not proto:
    return ""
  return (
      f"Student vs teacher on the same inputs (cosine 1: identical), measured at the end of the "
      f"run on up to {proto['images']} held-out images of `{proto['source']}` "
      f"({proto['view']}), at {proto['image_size'][0]}×{proto['image_size'][1]} px:\n"
  )


_SURGERY_ONLY = (
    "- Surgery only: attention not distilled. The teacher's weights run in a linear operator "
    "they were not trained for; expect features far from the teacher's."
)


def _licence(teacher: Mapping[str, Any], name: str) -> str:
  """The limitation that names the licence ("" when the card's front matter says it all)."""
  license_id = teacher.get("license") or "other"
  if license_id == "other":
    return (
        f"- Licence: the teacher's licence applies (`{name}`; it was not recorded with the "
        "teacher's checkpoint)."
    )
  note = teacher.get("license_note")
  if note and hub_license(note) == license_id:
    return f"- Licence: `{license_id}`, the teacher's: {note}"
  return ""


# ------------------------------------------------------------------------------------------------
# The measured numbers: one line each.


def _numbers(values: Mapping[str, Any], skip: tuple[str, ...]) -> str:
  return ", ".join(
      f"{k.replace('_', ' ')} {v:.4f}"
      for k, v in values.items()
      if k not in skip and isinstance(v, float)
  )


# The fidelity entries with a line (or section) of their own; any other gets a generic line.
_CARD_SECTIONS = frozenset(
    {"end_to_end", "teacher_top1", "student_top1", "protocol", "knn", "knn_skipped"}
    | {"eval_view", "test", "resolutions"}
)


def _measures(fid: Mapping[str, Any]) -> list[str]:
  """The lines under "How close to its teacher" (the protocol and test photos aside)."""
  lines = []
  e2e, view = fid.get("end_to_end"), fid.get("eval_view")
  if e2e:
    lines.append(f"- held-out images ({e2e['measured']}): {_numbers(e2e, ('measured',))}")
  if view:
    lines.append(
        f"- on the held-out images as `encode` sees them ({view['images']} images, `pp` above): "
        + _numbers(view, ("images",))
    )
  for r in fid.get("resolutions") or []:
    lines.append(
        f"- at {r['image_size']}×{r['image_size']} px (up to {r['images']} of those images, "
        f"resized after preprocessing, position table resampled): {_numbers(r, ('images',))}"
    )
  if fid.get("teacher_top1") is not None:
    lines.append(
        f"- top-1: teacher {100 * fid['teacher_top1']:.2f} %, "
        f"student {100 * fid['student_top1']:.2f} %"
    )
  lines += _knn(fid)
  for key, value in fid.items():  # a measure with no section of its own: one generic line
    if key not in _CARD_SECTIONS:
      brief = f"{value:.4f}" if isinstance(value, float) else None
      brief = _numbers(value, ()) if isinstance(value, Mapping) else brief
      lines.append(f"- {key.replace('_', ' ')}: {brief or value}")
  if not (e2e or view or fid.get("knn") or fid.get("knn_skipped")) and (
      fid.get("teacher_top1") is None
  ):
    lines.append("Nothing was measured for this export.")
  return lines


def _knn(fid: Mapping[str, Any]) -> list[str]:
  if fid.get("knn_skipped"):
    return [f"- k-NN: not measured ({fid['knn_skipped']})"]
  k = fid.get("knn")
  if not k:
    return []
  count = (
      f", {k['train_examples']} train / {k['eval_examples']} eval images"
      if "train_examples" in k
      else ""
  )
  lines = [
      f"- k-NN top-1 on `{k['dataset']}` (k={k.get('k')}{count}): teacher "
      f"{100 * k['teacher_top1']:.2f} %, student {100 * k['student_top1']:.2f} % "
      f"(retention {100 * k['retention']:.1f} %)"
  ]
  if "cls_cosine" in k:
    lines.append(
        f"- pooled-feature cosine to the teacher on the same images: mean {k['cls_cosine']:.4f}, "
        f"worst {k['cls_cosine_min']:.4f}"
    )
  return lines


_TEST_INTRO = (
    "Held-out photos never chosen on ({n_test} test photos; the run's choices and the dense "
    "measure's parts used {n_val} others), each size made from the original photo (whole: "
    "resized to the size; crop: shorter side to the size, centre square), position table "
    "resampled. Cosine to the teacher's final tokens, mean [95 % bootstrap interval over photos] "
    "(worst photo); dense: the share of patches given the teacher's part ({dense_k} k-means "
    "parts of the teacher's patch tokens) with the teacher's centroids (drop-in), and a linear "
    "probe's accuracy on the student's own tokens / on the teacher's."
)


def _test_section(test: Mapping[str, Any]) -> list[str]:
  """The card's "On test photos" section: photo_eval's rows as a table."""
  intro = _TEST_INTRO.format(**{k: test.get(k) for k in ("n_test", "n_val", "dense_k")})
  lines = ["## On test photos", "", intro, ""]
  if test.get("too_few"):
    lines += [f"Note: {test['too_few']}.", ""]
  rows = test.get("rows") or []
  if not rows:
    return lines + ["No test photo was measured."]
  lines += [
      "| size | view | photos | cls cosine | patch cosine (worst) | dense drop-in | probe student "
      "/ teacher |",
      "|---|---|---|---|---|---|---|",
  ]
  lines += [_test_row(r) for r in rows]
  if "crop_retrieval" in test:  # (results written before it have none)
    lines += ["", _retrieval_line(test["crop_retrieval"])]
  return lines


def _retrieval_line(r: Mapping[str, Any]) -> str:
  """The card's crop-retrieval sentence (export_folder's summary of photo_eval's block)."""
  if "absent" in r:
    return f"Crop retrieval: not measured ({r['absent']})."
  s, retention = r["student_top1"], r["retention"]
  kept = "–" if retention is None else f"{retention:.3f}"
  return (
      f"Crop retrieval (which of the {r['n_photos']} test photos each of {r['n_queries']} random "
      f"crops came from: {r['crops_per_photo']} per photo, 10–50 % of its area, resized to "
      f"{r['size']} px; top-1 by the cosine of each model's own {r['feature']} against the whole "
      f"photos): student {s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}], teacher {r['teacher_top1']:.3f}, "
      f"retention {kept} (chance {r['chance']:.3f})."
  )


def _test_row(r: Mapping[str, Any]) -> str:
  def ci(v):
    return "–" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

  patch, probe = r.get("patch_cosine"), r.get("probe")
  return (
      f"| {r['size']} px | {r['view']} | {r['n']} | {ci(r.get('cls_cosine'))} | "
      f"{ci(patch)} ({patch[3]:.3f}) | {ci(r.get('drop_in'))} | "
      + (f"{probe[0]:.3f} / {probe[1]:.3f}" if probe else "–")
      + " |"
  )


# ------------------------------------------------------------------------------------------------
# The attention in words (the card's first paragraph, and Student's repr).


def _describe_spec(spec: attn_lib.AttentionSpec) -> str:
  pooled = (
      f", its patch keys pooled to {spec.key_grid}×{spec.key_grid} blocks on wider grids"
      if spec.key_grid
      else ""
  )
  if spec.kind == "softmax":
    return "softmax attention" + pooled
  if spec.kind == "chunked_softmax":
    return "softmax attention (computed in chunks)" + pooled
  levers = [
      ("center_keys", "centred keys"),
      ("conv_v", "a depthwise convolution on values"),
      ("exact_prefix_rows", "exact softmax rows for the cls/register tokens"),
  ]
  parts = [text for field, text in levers if getattr(spec, field)]
  if spec.window:
    parts.append(f"exact softmax over a {spec.window}×{spec.window}-patch window")
  if spec.sinks:
    parts.append(f"{spec.sinks} exact sink keys")
  if spec.num_features:
    parts.append(f"{spec.num_features} features")
  words = f"linear attention with the {spec.feature_map} feature map"
  if not parts:
    return words
  return words + ", " + (", ".join(parts[:-1]) + " and " if len(parts) > 1 else "") + parts[-1]


def describe_attention(attention: Any, depth: int) -> str:
  """A student's attention in words: one operator, or per-layer runs ('layers 0–10: …; 11: …')."""
  try:
    specs = attn_lib.parse_layer_specs(attention, depth)
  except (ValueError, TypeError, KeyError):
    return str(attention)
  if len(set(specs)) == 1:
    return _describe_spec(specs[0])
  runs: list[list[Any]] = []
  for i, spec in enumerate(specs):
    if runs and runs[-1][2] == spec:
      runs[-1][1] = i
    else:
      runs.append([i, i, spec])
  return "; ".join(
      (f"layer {a}" if a == b else f"layers {a}–{b}") + f": {_describe_spec(s)}" for a, b, s in runs
  )
