"""Export and reload of a student, with what it needs to be used: `load_student(dir)`.

An export folder holds:
  student.npz           big_vision's params-only layout (big_vision's own `vit.load` reads it
                        when the student is softmax; ours for every operator)
  student.safetensors   the same params ('/'-joined names), its student_config.json in the
                        file's metadata, for the safetensors world (numpy API, no torch)
  student_config.json   {"model": vit.Model fields incl. attention, "preprocessing": input size,
                        pp string, normalisation, GELU form, patch size, "teacher", "recipe",
                        "fidelity"} (format 2; format 1 was the model fields alone, still read)
  README.md             a model card: what it is, how it was made, how close to its teacher

  README.md             a model card the Hugging Face Hub accepts: front matter (licence, base
                        model, library, tags), the attention in words, the measured numbers and
                        their protocol, limitations, a load snippet that runs in the folder

`load_student(folder, image_size=None, dtype=None)` -> `Student`: `encode` / `tokens` / `predict`
take paths, encoded bytes, uint8 HWC arrays (preprocessed here by inference_pp.py: the run's own
eval pp string in PIL + numpy) or preprocessed float batches, at the training size or any multiple
of the patch (the position table resampled), in batches with one compile per shape bucket.
Loading and applying a student imports no TensorFlow (`preprocess_tf` does, on request).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import io
import json
import os
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.artifacts.export_format import (
    CONFIG_FILE,  # export's own names too (tests, photo_eval)
)
from linvit_jax.artifacts.export_format import FORMAT
from linvit_jax.artifacts.export_format import model_fields
from linvit_jax.data import inference_pp
from linvit_jax.data import pp_spec
from linvit_jax.evaluation import results as results_lib
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import checkpoints
from linvit_jax.models import foreign
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import UserError


class ExportError(UserError, ValueError):
  """An export folder that cannot be read; the message names the folder and what is missing."""


def attention_json(model: Any) -> Any:
  """A model's attention as vit.Model(attention=...) takes it back: one spec or one per layer."""
  specs = vit.layer_specs(model)
  default = attn_lib.AttentionSpec()

  def one(spec):
    if spec.kind != "linear":
      return (
          spec.kind if spec == attn_lib.AttentionSpec(kind=spec.kind) else dataclasses.asdict(spec)
      )
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if v != getattr(default, k)}
    fields["kind"] = "linear"
    return fields if len(fields) > 2 else spec.feature_map

  if len(set(specs)) == 1:
    return one(specs[0])
  return [one(s) for s in specs]


def student_config(
    model_kwargs: Mapping[str, Any],
    attention: Any,
    config: Any,
    results: results_lib.Results | Mapping[str, Any],
) -> dict[str, Any]:
  """What an export says about its student (see the module doc): the record's measures with a
  `card` key go to its fidelity block (_CARD shapes those that need it)."""
  record = results_lib.as_record(results)
  model = json.loads(json.dumps({**model_kwargs, "attention": attention}))
  final = record.final()
  recipe = {
      "surgery_policy": config.surgery.policy,
      "stages": [
          {
              "name": n,
              "kind": config[n].kind,
              "steps": config[n].steps,
              "batch_size": config[n].batch_size,
              "lr": config[n].optimizer.lr,
          }
          for n in config.stages
      ],
      "images_seen": record.images_seen,
      "softmax_layers": record.softmax_layers,
      "seed": config.seed,
  }
  size = config.data.image_size
  size = list(size) if isinstance(size, (list, tuple)) else [size, size]
  fidelity = {
      "end_to_end": {"measured": final[0], **final[1].scalars()} if final else None,
      "teacher_top1": record.teacher_top1,
      "student_top1": record.student_top1,
      # How the numbers were measured, for the card (no local paths: names only).
      "protocol": {
          "source": f"{public_name(config.data.dataset)}, split {config.data.eval_split}",
          "images": config.eval.fidelity_images,
          "view": "random views (eval.sample_pp)" if config.eval.sample_pp else "the eval view",
          "image_size": size,
      },
  }
  if record.knn_skipped:  # (k-NN was not measured then: no knn entry beside it)
    fidelity["knn_skipped"] = str(record.knn_skipped)
  for field, value in record.measures():
    card = field.metadata["card"]
    value = _CARD.get(field.name, lambda v, c: v)(value, config) if card and value else None
    if value:
      fidelity[card] = value
  return {
      "format": FORMAT,
      "model": model,
      "preprocessing": {
          "image_size": size,
          "pp": pp_spec.inference_pp(config.data.pp_eval),
          "gelu": "tanh" if model.get("gelu_approximate", True) else "exact",
          "patch_size": model.get("patch_size"),
      },
      "teacher": {**teacher_info(config.teacher.init), "attention": "softmax"},
      "recipe": recipe,
      "fidelity": fidelity,
  }


def _knn_card(knn: Mapping[str, Any], config: Any) -> dict[str, Any]:
  # The feature cache's bookkeeping (hit or miss, seconds) is the run's, not the student's.
  knn = {k: v for k, v in knn.items() if not k.startswith("teacher_features_")}
  return {**knn, "dataset": public_name(knn.get("dataset"))}


def _resolutions_card(rows: Sequence[Mapping[str, Any]], config: Any) -> list[dict[str, Any]]:
  # report.resolution_scaling: the first sample images, resized after preprocessing.
  return [
      {
          "image_size": r["image_size"],
          "images": config.eval.resolution_fidelity_images,
          **{k: r[k] for k in ("cls_cosine", "patch_cosine") if isinstance(r.get(k), float)},
      }
      for r in rows
      if r.get("factor") != 1
  ]


# How a measure goes on the card when not as measured (the record's field -> (value, config)).
_CARD = {
    "knn": _knn_card,
    "test": lambda test, config: test_summary(test),
    "resolution": _resolutions_card,
}


def test_summary(test: Mapping[str, Any]) -> dict[str, Any]:
  """results["test"] (photo_eval) for the export: means and intervals, no photo names."""
  rows = []
  for r in test.get("rows") or []:
    row = {"size": r["size"], "view": r["view"], "n": r["n"]}
    for key in ("cls_cosine", "patch_cosine"):
      if key in r:
        row[key] = [r[key][k] for k in ("mean", "lo", "hi", "worst")]
    if "dense" in r:
      d = r["dense"]
      row["drop_in"] = [d["drop_in"][k] for k in ("mean", "lo", "hi")]
      row["probe"] = [d["probe_student"]["mean"], d["probe_teacher"]["mean"]]
    rows.append(row)
  keys = ("n_test", "n_val", "too_few", "dense_k", "bootstrap")
  return {**{k: test[k] for k in keys if k in test}, "rows": rows}


def _test_card(test: Mapping[str, Any]) -> list[str]:
  """The card's "On test photos" section: photo_eval's rows as a table."""
  lines = [
      "## On test photos",
      "",
      f"Held-out photos never chosen on ({test.get('n_test')} test photos; the run's choices and "
      f"the dense measure's parts used {test.get('n_val')} others), each size made from the "
      "original photo (whole: resized to the size; crop: shorter side to the size, centre "
      "square), position table resampled. Cosine to the teacher's final tokens, mean [95 % "
      "bootstrap interval over photos] (worst photo); dense: the share of patches given the "
      f"teacher's part ({test.get('dense_k')} k-means parts of the teacher's patch tokens) "
      "with the teacher's centroids (drop-in), and a linear probe's accuracy on the student's "
      "own tokens / on the teacher's.",
      "",
  ]
  if test.get("too_few"):
    lines += [f"Note: {test['too_few']}.", ""]
  rows = test.get("rows") or []
  if not rows:
    return lines + ["No test photo was measured.", ""]

  def ci(v):
    return "–" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

  lines += [
      "| size | view | photos | cls cosine | patch cosine (worst) | dense drop-in | probe student / teacher |",
      "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    patch = r.get("patch_cosine")
    probe = r.get("probe")
    lines.append(
        f"| {r['size']} px | {r['view']} | {r['n']} | {ci(r.get('cls_cosine'))} | "
        f"{ci(patch)} ({patch[3]:.3f}) | {ci(r.get('drop_in'))} | "
        + (f"{probe[0]:.3f} / {probe[1]:.3f}" if probe else "–")
        + " |"
    )
  return lines + [""]


# ------------------------------------------------------------------------------------------------
# The teacher's name and licence, for the card (never a local path: the card is published).

# Hugging Face Hub licence identifiers a teacher's licence text is matched against.
HUB_LICENSES = (
    "apache-2.0",
    "mit",
    "bsd-3-clause",
    "bsd-2-clause",
    "cc0-1.0",
    "cc-by-4.0",
    "cc-by-sa-4.0",
    "cc-by-nc-4.0",
    "cc-by-nc-sa-4.0",
    "cc-by-nc-nd-4.0",
    "gpl-3.0",
    "lgpl-3.0",
    "agpl-3.0",
    "mpl-2.0",
    "openrail",
    "llama2",
    "llama3",
    "gemma",
    "unlicense",
)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def public_name(name: str | None) -> str | None:
  """A dataset or checkpoint name without its local directories ('image_folder:/a/b' ->
  'image_folder:b', '/a/teacher.npz' -> 'teacher.npz'); a hub id ('org/model') as it is."""
  if not name:
    return name
  prefix, sep, rest = name.rpartition(":") if ":" in name and "://" not in name else ("", "", name)
  if "://" in rest or os.path.isabs(rest) or rest.startswith(("~", ".")) or os.sep in rest:
    if not (_HUB_ID.fullmatch(rest) and not os.path.exists(rest)):
      rest = os.path.basename(rest.rstrip("/" + os.sep)) or rest
  return f"{prefix}{sep}{rest}"


def hub_license(text: str | None) -> str | None:
  """The Hub licence id a licence text starts with ('MIT (as declared ...)' -> 'mit'), or None."""
  if not text:
    return None
  norm = str(text).strip().lower()
  for lic in sorted(HUB_LICENSES, key=len, reverse=True):
    for spelling in (lic, lic.replace("-", " ")):  # 'Apache-2.0' or 'Apache 2.0'
      if norm == spelling or (norm.startswith(spelling) and norm[len(spelling)] in " (,;.:"):
        return lic
  return None


def _front_matter_license(readme: str | None) -> str | None:
  if not readme or not readme.startswith("---"):
    return None
  for line in readme.split("\n---", 1)[0].splitlines()[1:]:
    key, _, value = line.partition(":")
    if key.strip() == "license" and value.strip():
      return value.strip().strip("'\"")
  return None


def _read_json(path: str) -> dict[str, Any]:
  try:
    info = json.loads(gfile.read_text(path) or "{}")
  except ValueError:
    return {}
  return info if isinstance(info, dict) else {}


def teacher_info(init: str | None) -> dict[str, Any]:
  """{"init", "name", "license", "license_note"} of a teacher checkpoint, read from what sits
  beside it: an .npz's sidecar JSON (same stem; "hub_id", "license" or "licence"), or a Hugging
  Face folder's config.json ("_name_or_path") and README.md front matter (`license:`). "name" is
  a hub id when known, else the file or folder's base name; "license" a Hub id or None."""
  if not init:
    return {"init": None, "name": None, "license": None, "license_note": None}
  path = init.rstrip("/" + os.sep)
  name, text = public_name(path), None
  if path.endswith(".npz"):
    side = _read_json(foreign.sidecar_path(path))
    name = side.get("hub_id") or os.path.basename(path)[: -len(".npz")]
    text = side.get("license") or side.get("licence")
  elif gfile.exists(os.path.join(path, "config.json")):
    conf = _read_json(os.path.join(path, "config.json"))
    hub = conf.get("_name_or_path") or conf.get("hf_hub_id") or ""
    if _HUB_ID.fullmatch(hub) and not os.path.isabs(hub) and not os.path.exists(hub):
      name = hub
    text = conf.get("license") or _front_matter_license(
        gfile.read_text(os.path.join(path, "README.md"))
    )
  text = str(text) if text else None
  return {"init": name, "name": name, "license": hub_license(text), "license_note": text}


# ------------------------------------------------------------------------------------------------
# The model card.


def _describe_spec(spec: attn_lib.AttentionSpec) -> str:
  if spec.kind == "softmax":
    return "softmax attention"
  if spec.kind == "chunked_softmax":
    return "softmax attention (computed in chunks)"
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


def _numbers(values: Mapping[str, Any], skip: tuple[str, ...]) -> str:
  return ", ".join(
      f"{k.replace('_', ' ')} {v:.4f}"
      for k, v in values.items()
      if k not in skip and isinstance(v, float)
  )


# The fidelity entries model_card writes a section of its own for.
_CARD_SECTIONS = frozenset(
    {"end_to_end", "teacher_top1", "student_top1", "protocol", "knn", "knn_skipped"}
    | {"eval_view", "test", "resolutions"}
)


def model_card(cfg: Mapping[str, Any]) -> str:
  """README.md of an export folder: Hub front matter, what the student is, how it was made, the
  measured numbers with their protocol, limitations and a load snippet that runs as written from
  the folder itself. No local paths."""
  m, pre = cfg["model"], cfg.get("preprocessing") or {}
  rec, fid = cfg.get("recipe") or {}, cfg.get("fidelity") or {}
  teacher = cfg.get("teacher") or {}
  known = teacher.get("name") or public_name(teacher.get("init"))
  name = known or "a softmax ViT (not recorded)"
  words = describe_attention(m.get("attention", "softmax"), m.get("depth", 12))
  stages = rec.get("stages") or []
  surgery_only = not stages
  license_id = teacher.get("license") or "other"
  front = [
      "---",
      f"license: {license_id}",
      *([f"base_model: {json.dumps(known)}"] if known else []),
      "library_name: linvit_jax",
      "tags:",
      *(f"- {t}" for t in ("vision", "vit", "linear-attention", "feature-extraction")),
      "pipeline_tag: "
      + ("image-classification" if m.get("num_classes") else "image-feature-extraction"),
      "---",
      "",
  ]
  made = (
      "surgery only: attention not distilled"
      if surgery_only
      else "attention distilled on its outputs"
  )
  size = pre.get("image_size") or ["?", "?"]
  lines = [
      "# linvit_jax student",
      "",
      f"A linear-attention ViT converted from the softmax teacher `{name}` by linvit_jax: {words}. "
      "Weights that do not depend on the attention operator were copied (surgery policy "
      f"`{rec.get('surgery_policy')}`); {made}.",
      "",
      f"- architecture: width {m.get('width')}, depth {m.get('depth')}, heads {m.get('num_heads')}, "
      f"patch {'×'.join(map(str, m.get('patch_size') or pre.get('patch_size') or ['?']))}, pool `{m.get('pool_type')}`, "
      f"registers {m.get('reg_tokens', 0)}, {'a head of ' + str(m['num_classes']) + ' classes' if m.get('num_classes') else 'no head'}",
      f"- input: trained at {size[0]}×{size[1]} px (runs at any multiple of the patch), "
      f"preprocessing `{pre.get('pp')}`, {pre.get('gelu')} GELU",
      "- recipe: "
      + (
          ", ".join(
              f"{s['name']} ({s['kind']}, {s['steps']} steps × {s['batch_size']})" for s in stages
          )
          or "surgery only: attention not distilled"
      )
      + (f"; layers {rec['softmax_layers']} kept softmax" if rec.get("softmax_layers") else ""),
      "",
      "## How close to its teacher",
      "",
  ]
  proto = fid.get("protocol")
  if proto:
    lines.append(
        f"Student vs teacher on the same inputs (cosine 1: identical), measured at the end of the "
        f"run on up to {proto['images']} held-out images of `{proto['source']}` "
        f"({proto['view']}), at {proto['image_size'][0]}×{proto['image_size'][1]} px:"
    )
    lines.append("")
  e2e = fid.get("end_to_end")
  if e2e:
    lines.append(f"- held-out images ({e2e['measured']}): {_numbers(e2e, ('measured',))}")
  view = fid.get("eval_view")
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
  if fid.get("knn_skipped"):
    lines.append(f"- k-NN: not measured ({fid['knn_skipped']})")
  elif fid.get("knn"):
    k = fid["knn"]
    count = (
        f", {k['train_examples']} train / {k['eval_examples']} eval images"
        if "train_examples" in k
        else ""
    )
    lines.append(
        f"- k-NN top-1 on `{k['dataset']}` (k={k.get('k')}{count}): teacher "
        f"{100 * k['teacher_top1']:.2f} %, student {100 * k['student_top1']:.2f} % "
        f"(retention {100 * k['retention']:.1f} %)"
    )
    if "cls_cosine" in k:
      lines.append(
          f"- pooled-feature cosine to the teacher on the same images: mean {k['cls_cosine']:.4f}, "
          f"worst {k['cls_cosine_min']:.4f}"
      )
  for key, value in fid.items():  # a measure with no section of its own: one generic line
    if key not in _CARD_SECTIONS:
      brief = f"{value:.4f}" if isinstance(value, float) else None
      brief = _numbers(value, ()) if isinstance(value, Mapping) else brief
      lines.append(f"- {key.replace('_', ' ')}: {brief or value}")
  if (
      not (e2e or view or fid.get("knn") or fid.get("knn_skipped"))
      and fid.get("teacher_top1") is None
  ):
    lines.append("Nothing was measured for this export.")
  if fid.get("test"):
    lines += [""] + _test_card(fid["test"])[:-1]
  lines += ["", "## Limitations", ""]
  if surgery_only:
    lines.append(
        "- Surgery only: attention not distilled. The teacher's weights run in a linear operator "
        "they were not trained for; expect features far from the teacher's."
    )
  lines += [
      "- Linear attention approximates the teacher's softmax attention: the features are close "
      "to the teacher's, not equal. Re-check anything built on the teacher's features (heads, "
      "thresholds, search indexes) on your own images.",
      f"- The numbers above rest on the images named there only; other image domains are not "
      f"measured. At sizes other than {size[0]}×{size[1]} px the position table is resized "
      "bilinearly (big_vision's rule); fidelity there is measured only where listed above.",
      "- Preprocessing without TensorFlow (`encode` on paths, bytes or uint8 arrays) matches the "
      "run's TensorFlow preprocessing within one grey level on PNGs; JPEGs differ by the two "
      "libraries' JPEG decoders (about one level on average).",
  ]
  if license_id == "other":
    lines.append(
        f"- Licence: the teacher's licence applies (`{name}`; it was not recorded with the "
        "teacher's checkpoint)."
    )
  elif teacher.get("license_note") and hub_license(teacher["license_note"]) == license_id:
    lines.append(f"- Licence: `{license_id}`, the teacher's: {teacher['license_note']}")
  lines += [
      "",
      "## Load it",
      "",
      "From this folder (or pass its path):",
      "",
      "```python",
      "import numpy as np",
      "import linvit_jax",
      "",
      'student = linvit_jax.load_student(".")',
      "image = np.zeros((480, 640, 3), np.uint8)  # or paths, encoded bytes, a preprocessed batch",
      "features = student.encode([image])  # float32 [1, D]; image_size=..., batch_size=...",
      "print(student, features.shape)",
      "```",
      "",
      "Files: `student.npz` (big_vision layout), `student.safetensors` (same params, this config "
      "in its metadata), `student_config.json`.",
      "",
  ]
  return "\n".join(front + lines)


def save(
    folder: str,
    params: Any,
    cfg: Mapping[str, Any],
    *,
    npz: bool = True,
    safetensors: bool = True,
) -> None:
  """Writes an export folder (each file atomically; the config last, so a folder with a config
  has its params)."""
  gfile.makedirs(folder)
  host = jax.device_get(params)
  if npz:
    checkpoints.save_npz(os.path.join(folder, "student.npz"), host)
  if safetensors:
    _save_safetensors(os.path.join(folder, "student.safetensors"), host, cfg)
  gfile.write_text(os.path.join(folder, "README.md"), model_card(cfg))
  gfile.write_text(os.path.join(folder, CONFIG_FILE), json.dumps(cfg, indent=1))


def _save_safetensors(path: str, params: Any, cfg: Mapping[str, Any]) -> None:
  from safetensors import numpy as st_numpy  # numpy API: no torch

  flat = {k: np.ascontiguousarray(np.asarray(v)) for k, v in checkpoints.flatten(params).items()}
  data = st_numpy.save(flat, metadata={"student_config": json.dumps(cfg)})
  with gfile.atomic_open(path, "wb") as f:
    f.write(data)


# ------------------------------------------------------------------------------------------------
# The student, at any resolution.


_VERBS = {"encoded": "tokens", "pre_logits": "encode", "logits": "predict"}


def _nearest_sizes(n: int, patch: int) -> str:
  lo = n // patch * patch
  return str(patch) if lo < patch else f"{lo} or {lo + patch}"


def check_size(size: Any, patch: Sequence[int]) -> tuple[int, int]:
  """(H, W) of an input size (an int or a pair) if both are multiples of the patch; else an
  ExportError naming the size, the patch and the nearest valid sizes."""
  h, w = (size, size) if np.ndim(size) == 0 else tuple(size)
  bad = [(n, p) for n, p in ((h, patch[0]), (w, patch[1])) if n <= 0 or n % p]
  if bad:
    n, p = bad[0]
    raise ExportError(
        f"image size {h}×{w}: {n} is not a positive multiple of the patch {p} "
        f"(nearest valid: {_nearest_sizes(n, p)})"
    )
  return int(h), int(w)


def _progress(total: int, what: str):
  """A tqdm bar when tqdm is installed, else one updating stderr line."""
  try:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit="img", file=sys.stderr)
  except ImportError:

    class _Line:
      n = 0

      def update(self, k: int) -> None:
        self.n += k
        print(f"\r{what}: {self.n}/{total} images", end="", file=sys.stderr, flush=True)

      def close(self) -> None:
        print(file=sys.stderr)

    return _Line()


@dataclasses.dataclass(repr=False)
class Student:
  """An exported student, ready to use: `model` and `params` for custom code.

  `image_size` (H, W): the size `encode` / `tokens` / `predict` run raw images at unless a call
  names another (default: the training size); any multiple of the patch, the learned position
  table resized bilinearly from the training grid (big_vision's `resample_posemb`; cls and
  register tokens are not in that table). `dtype` (e.g. jnp.bfloat16): params and compute in it,
  outputs float32. Batches of `batch_size`, the last padded to a power-of-two bucket (≥ 8,
  ≤ batch_size): one compile per (output, bucket, image size); `traces` counts them.
  """

  model: Any
  params: Any
  config: dict[str, Any]
  folder: str = ""
  image_size: Any = None
  dtype: Any = None
  batch_size: int = 32

  def __post_init__(self):
    self.patch = tuple(int(p) for p in self.model.patch_size)
    pe = self.params.get("pos_embedding") if isinstance(self.params, Mapping) else None
    self._grid = None
    pre = self.config.get("preprocessing") or {}
    if pre.get("image_size"):
      self.training_size = tuple(int(n) for n in pre["image_size"])
      self._grid = (self.training_size[0] // self.patch[0], self.training_size[1] // self.patch[1])
    elif pe is not None:  # format 1: a square grid of the stored table
      side = int(round(np.sqrt(np.shape(pe)[1])))
      self._grid, self.training_size = (side, side), (side * self.patch[0], side * self.patch[1])
    else:
      self.training_size = None
    if pe is not None and self._grid[0] * self._grid[1] != np.shape(pe)[1]:
      side = int(round(np.sqrt(np.shape(pe)[1])))
      self._grid = (side, side)
    self.image_size = (
        self._check(self.image_size) if self.image_size is not None else self.training_size
    )
    if self.dtype is not None:
      self.dtype = jnp.dtype(self.dtype)
      self.model = self.model.clone(dtype_mm=self.dtype.name)
      self.params = jax.tree.map(
          lambda a: np.asarray(a).astype(self.dtype)
          if np.issubdtype(np.asarray(a).dtype, np.floating)
          else a,
          self.params,
      )
    self.channels = int(np.shape(self.params["embedding"]["kernel"])[2])
    self.traces = 0  # how many times the forward was traced (= compiled): one per bucket
    self._forward = jax.jit(self._apply, static_argnums=0)
    self._sized: dict[tuple[int, int], Any] = {}
    self._pps: dict[tuple[int, int], Any] = {}
    self._tf_pp = None
    self._bounds: tuple[float, ...] | None = None

  def __repr__(self) -> str:
    m = self.model
    n = sum(int(np.size(a)) for a in jax.tree.leaves(self.params))
    size = "×".join(map(str, self.training_size)) if self.training_size else "?"
    return (
        f"Student('{self.folder}': ViT width {m.width}, depth {m.depth}, heads {m.num_heads}, "
        f"patch {self.patch[0]}, {describe_attention(m.attention, m.depth)}; trained at {size} "
        f"px, runs at {'×'.join(map(str, self.image_size or ('?',)))}; {n / 1e6:.2f}M params"
        + (f", {self.dtype.name}" if self.dtype is not None else "")
        + ")"
    )

  # -------------------------------------------------------------------------- preprocessing

  def preprocess(self, images: Any, image_size: Any = None) -> np.ndarray:
    """Paths, encoded bytes or uint8 HWC arrays -> the model's input batch [B, H, W, C] float32,
    through the run's own eval pp string in PIL + numpy (inference_pp: resize, crop and
    normalisation scaled to `image_size`; no TensorFlow)."""
    size = self._size(image_size)
    items = _as_list(images)
    if not items:
      return np.zeros((0, *size, self.channels), np.float32)
    return np.stack([self._pp(size)(x) for x in items]).astype(np.float32)

  def preprocess_tf(self, images: Any) -> np.ndarray:
    """As `preprocess` at the training size, through TensorFlow and the run's own pp ops (what
    evaluation ran); imports TensorFlow."""
    if self._tf_pp is None:
      from linvit_jax.runtime import quiet_tf

      quiet_tf.import_quietly("tensorflow")
      from linvit_jax.data import preprocess as pp_lib

      self._tf_pp = pp_lib.get_preprocess_fn(self._pp_string())
    import tensorflow as tf

    out = []
    for image in _as_list(images):
      data = {"image": tf.constant(_encoded(image))}
      out.append(np.asarray(self._tf_pp(data)["image"]))
    return np.stack(out).astype(np.float32)

  def _pp_string(self) -> str:
    pre = self.config.get("preprocessing") or {}
    if not pre.get("pp"):
      raise ExportError(
          f"student '{self.folder}' records no preprocessing (an old export): pass preprocessed "
          "float arrays [B, H, W, C]"
      )
    return pre["pp"]

  def _pp(self, size: tuple[int, int]) -> inference_pp.Preprocess:
    if size not in self._pps:
      self._pps[size] = inference_pp.Preprocess(self._pp_string(), size, self.training_size)
    return self._pps[size]

  def _check(self, size: Any) -> tuple[int, int]:
    size = check_size(size, self.patch)
    if size[0] != size[1] and any(s.conv_v for s in vit.layer_specs(self.model)):
      raise ExportError(
          f"image size {size[0]}×{size[1]}: this student's convolution on values (conv_v) needs "
          "a square patch grid; use a square size"
      )
    return size

  def _size(self, image_size: Any) -> tuple[int, int]:
    if image_size is not None:
      return self._check(image_size)
    if self.image_size is None:
      raise ExportError(
          f"student '{self.folder}' does not record its input size: pass image_size= or a "
          "preprocessed batch"
      )
    return self.image_size

  # -------------------------------------------------------------------------- the forward

  def _apply(self, what: str, params: Any, x: jax.Array) -> jax.Array:
    self.traces += 1  # runs only when jax traces, i.e. compiles, this function
    logits, out = self.model.apply({"params": params}, x, train=False)
    return (logits if what == "logits" else out[what]).astype(jnp.float32)

  def _params_at(self, size: tuple[int, int]) -> Any:
    """The params with the position table resampled to `size`'s grid (cached, on device)."""
    if size not in self._sized:
      grid = (size[0] // self.patch[0], size[1] // self.patch[1])
      params = vit_checkpoint.with_posemb_grid(self.params, grid, self._grid)
      self._sized[size] = jax.device_put(params)
    return self._sized[size]

  def _run(self, what: str, images: Any, image_size: Any, batch_size: int | None) -> np.ndarray:
    batch_size = int(batch_size or self.batch_size)
    if batch_size < 1:
      raise ExportError(f"batch_size must be at least 1, got {batch_size}")
    batch, items, size = self._inputs(images, image_size)
    n = len(batch) if batch is not None else len(items)
    params = self._params_at(size)
    dtype = self.dtype or np.float32
    if n == 0:
      traces = self.traces  # a shape, not a compile
      shape = jax.eval_shape(
          functools.partial(self._apply, what),
          params,
          jax.ShapeDtypeStruct((1, *size, self.channels), dtype),
      )
      self.traces = traces
      return np.zeros((0, *shape.shape[1:]), np.float32)
    bar = _progress(n, _VERBS[what]) if n > batch_size else None
    out = []
    for start in range(0, n, batch_size):
      if batch is not None:
        x = np.asarray(batch[start : start + batch_size])
      else:
        x = self.preprocess(items[start : start + batch_size], size)
      k = len(x)
      bucket = min(batch_size, max(8, 1 << (k - 1).bit_length()))
      if bucket > k:  # padding: one compile per bucket, not per batch size
        x = np.concatenate([x, np.zeros((bucket - k, *x.shape[1:]), x.dtype)])
      out.append(np.asarray(self._forward(what, params, x.astype(dtype)))[:k])
      if bar is not None:
        bar.update(k)
    if bar is not None:
      bar.close()
    return np.concatenate(out).astype(np.float32)

  def _inputs(self, images: Any, image_size: Any) -> tuple[Any, list, tuple[int, int]]:
    """(a preprocessed batch or None, raw images, the input size)."""
    if isinstance(images, (np.ndarray, jax.Array)) and jnp.issubdtype(images.dtype, jnp.floating):
      if images.ndim != 4 or images.shape[-1] != self.channels:
        raise ExportError(
            f"a float array must be a preprocessed batch [B, H, W, {self.channels}]; got shape "
            f"{tuple(images.shape)} (raw images: uint8 arrays, paths or bytes)"
        )
      size = self._check(images.shape[1:3])
      self._check_normalised(images)
      if image_size is not None and self._check(image_size) != size:
        raise ExportError(
            f"image_size={image_size} but the preprocessed batch is {size[0]}×{size[1]}: a "
            "batch's own size decides"
        )
      return images, [], size
    if isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4:
      return None, list(images), self._size(image_size)
    return None, _as_list(images), self._size(image_size)

  def value_bounds(self) -> tuple[float, float] | None:
    """(lowest, highest) value the student's own preprocessing gives a pixel (black and white
    through its normalisation), or None when the export records no preprocessing this module
    can run."""
    if self._bounds is None:
      try:
        pp = inference_pp.Preprocess(self._pp_string())
        black, white = (np.full((2, 2, self.channels), v, np.uint8) for v in (0, 255))
        lo, hi = float(np.min(pp(black))), float(np.max(pp(white)))
        self._bounds = (min(lo, hi), max(lo, hi))
      except UserError:
        self._bounds = ()
    return self._bounds or None

  def _check_normalised(self, images: Any) -> None:
    """A float batch must hold normalised pixels: values far outside what the preprocessing makes
    (raw 0..255 pixels, say) are refused; values a little outside it, or a batch that looks like
    raw 0..1 pixels, are warned of."""
    bounds = self.value_bounds()
    if bounds is None or not np.size(images):
      return
    lo, hi = bounds
    # The array's own min/max: a jax batch is reduced where it lives, not copied to the host twice.
    vmin, vmax = float(images.min()), float(images.max())
    slack = 0.05 * (hi - lo)  # resampling may overshoot the range a little
    fix = (
        "pass raw pixels as uint8 HxWxC arrays (or paths / bytes), which are preprocessed here, "
        "or preprocess() them first"
    )
    if not (np.isfinite(vmin) and np.isfinite(vmax)):
      raise ExportError("the float batch holds NaN or infinite values")
    span = f"its values span [{vmin:.4g}, {vmax:.4g}] and this student's preprocessing makes"
    if vmin < lo - 4 * (hi - lo) or vmax > hi + 4 * (hi - lo):  # raw 0..255 pixels, say
      raise ExportError(
          f"a float batch is read as normalised pixels, but {span} [{lo:.4g}, {hi:.4g}]: {fix}"
      )
    if vmin < lo - slack or vmax > hi + slack:  # another normalisation, or synthetic values
      warnings.warn(
          f"a float batch is read as normalised pixels, but {span} [{lo:.3g}, {hi:.3g}]",
          stacklevel=4,
      )
    if lo < -0.1 and vmin >= 0.0 and vmax <= 1.0:
      warnings.warn(
          f"a float batch with every value in [0, 1], where this student's normalised pixels "
          f"span [{lo:.3g}, {hi:.3g}]: raw 0..1 pixels? If so, {fix}",
          stacklevel=4,
      )

  def tokens(
      self, images: Any, image_size: Any = None, batch_size: int | None = None
  ) -> np.ndarray:
    """Final normalised tokens [B, N, D] float32 (cls and registers first, as the teacher's).

    `images`: paths, encoded bytes, uint8 HWC arrays (raw images: preprocessed here, at
    `image_size`), or a preprocessed float batch [B, H, W, C] (numpy or jax, any float dtype;
    its H, W decide the size). A float batch must hold *normalised* pixels, as `preprocess`
    makes them: raw pixels go in as uint8 (a float batch far outside `value_bounds()` is refused,
    one a little outside it or with every value in [0, 1] is warned of)."""
    return self._run("encoded", images, image_size, batch_size)

  def encode(
      self, images: Any, image_size: Any = None, batch_size: int | None = None
  ) -> np.ndarray:
    """The pooled final feature [B, D] float32 (cls token, MAP or mean pool, as the teacher's);
    `images` as for `tokens`. `encode([])` is an empty [0, D] array."""
    return self._run("pre_logits", images, image_size, batch_size)

  def predict(
      self, images: Any, image_size: Any = None, batch_size: int | None = None
  ) -> np.ndarray:
    """Logits [B, classes] float32; a headless student has none. `images` as for `tokens`."""
    if not self.model.num_classes:
      raise ExportError(f"student '{self.folder}' has no head (num_classes is None): use encode()")
    return self._run("logits", images, image_size, batch_size)

  def save(self, folder: str) -> None:
    save(folder, jax.tree.map(lambda a: np.asarray(a, np.float32), self.params), self.config)


def _as_list(images: Any) -> list[Any]:
  if isinstance(images, (str, bytes, os.PathLike)) or (
      isinstance(images, np.ndarray) and images.ndim in (2, 3)
  ):
    return [images]
  return list(images)


def _encoded(image: Any) -> bytes:
  """An image as encoded bytes for TensorFlow's decode (a uint8 array as a lossless PNG)."""
  if isinstance(image, bytes):
    return image
  if isinstance(image, (str, os.PathLike)):
    try:
      with gfile.open(os.fspath(image), "rb") as f:
        return f.read()
    except OSError as e:
      raise ExportError(
          f"'{os.fspath(image)}': cannot read the image ({e.strerror or e})"
      ) from None
  a = inference_pp.decode(image, 3 if np.ndim(image) == 2 or np.shape(image)[-1] != 1 else 1)
  from PIL import Image

  buf = io.BytesIO()  # PNG is lossless: the pp's decode sees exactly these pixels
  Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a).save(buf, format="PNG")
  return buf.getvalue()


# ------------------------------------------------------------------------------------------------
# Loading.


def _read_config(folder: str) -> dict[str, Any]:
  path = os.path.join(folder, CONFIG_FILE)
  text = gfile.read_text(path)
  if text is None:
    raise ExportError(f"'{folder}': no {CONFIG_FILE} (not a linvit_jax export folder)")
  try:
    cfg = json.loads(text)
  except ValueError as e:
    raise ExportError(f"'{path}': not valid JSON ({e})") from None
  if not isinstance(cfg, dict):
    raise ExportError(
        f"'{path}': expected a JSON object (the student's config), got a {type(cfg).__name__}"
    )
  if not model_fields(cfg):
    # `{}` (or a config without its model) would otherwise be read as a default ViT and then be
    # reported as a mismatch with the params: say what is missing instead.
    raise ExportError(
        f"'{path}': holds no model fields (width, depth, ...): the file is empty or damaged; "
        "export the student again"
    )
  return cfg


def _model(path: str, fields: dict[str, Any]) -> Any:
  """vit.Model(**fields), each problem one line naming the config file."""
  known = {f.name for f in dataclasses.fields(vit._Model)} - {"parent", "name"} | {"variant"}
  unknown = sorted(set(fields) - known)
  if unknown:
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"
    raise ExportError(f"'{path}': unknown model field {unknown[0]!r}{hint}")
  try:
    attn_lib.parse_layer_specs(fields.get("attention", "softmax"), int(fields.get("depth", 12)))
    return vit.Model(**fields)
  except (ValueError, TypeError) as e:
    what = "attention" if "attention" in str(e) or "feature map" in str(e) else "model"
    raise ExportError(f"'{path}': {what}: {str(e).splitlines()[0]}") from None


def _read_params(folder: str) -> tuple[dict[str, Any], str]:
  npz = os.path.join(folder, "student.npz")
  st = os.path.join(folder, "student.safetensors")
  if gfile.exists(npz):
    try:
      return checkpoints.flatten(checkpoints.load_npz(npz)), npz
    except UserError as e:  # load_npz's own message names the file and the problem
      raise ExportError(str(e).strip().splitlines()[0]) from None
    except Exception as e:  # noqa: BLE001  (zip, pickle and numpy errors: all mean unreadable)
      raise ExportError(f"'{npz}': cannot read it ({_first_line(e)})") from None
  if gfile.exists(st):
    from safetensors import numpy as st_numpy

    try:
      with gfile.open(st, "rb") as f:
        return st_numpy.load(f.read()), st
    except Exception as e:  # noqa: BLE001  (safetensors raises its own SafetensorError)
      raise ExportError(
          f"'{st}': cannot read it, corrupt or truncated ({_first_line(e)})"
      ) from None
  raise ExportError(f"'{folder}': neither student.npz nor student.safetensors")


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def load_student(folder: str, image_size: Any = None, dtype: Any = None) -> Student:
  """The student exported into `folder` (a run's workdir, or an export made by `save`).

  `image_size`: the size (an int or (H, W), a multiple of the patch) raw images run at by
  default; None: the training size. `dtype` (e.g. jnp.bfloat16): params and compute in it."""
  cfg = _read_config(folder)
  path = os.path.join(folder, CONFIG_FILE)
  fields = model_fields(cfg)
  if "preprocessing" not in cfg:  # format 1: model fields only
    cfg = {"format": 1, "model": fields, "preprocessing": None}
  model = _model(path, fields)
  flat, source = _read_params(folder)
  stored = checkpoints.unflatten(flat)
  emb = np.shape(stored.get("embedding", {}).get("kernel", ()))
  if len(emb) != 4:
    raise ExportError(f"'{source}': no embedding/kernel [ph, pw, C, D] (not a ViT's params)")
  if emb[3] != model.width or tuple(emb[:2]) != tuple(model.patch_size):
    what, theirs, ours = (
        ("width", emb[3], model.width)
        if emb[3] != model.width
        else ("patch", list(emb[:2]), list(model.patch_size))
    )
    raise ExportError(
        f"'{source}' holds {what} {theirs}, {CONFIG_FILE} says {ours}: the two files are from "
        "different students"
    )
  # Checked against the model the config describes (names, shapes), at the stored grid.
  side = (
      int(round(np.sqrt(np.shape(stored["pos_embedding"])[1]))) if "pos_embedding" in stored else 1
  )
  probe = np.zeros((1, side * emb[0], side * emb[1], emb[2]), np.float32)
  grid = (cfg.get("preprocessing") or {}).get("image_size")
  if grid and "pos_embedding" in stored:
    gh, gw = grid[0] // emb[0], grid[1] // emb[1]
    if gh * gw == np.shape(stored["pos_embedding"])[1]:
      probe = np.zeros((1, gh * emb[0], gw * emb[1], emb[2]), np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), probe)["params"]
  try:
    params = checkpoints.merge_params(stored, shapes, source=source)
  except UserError as e:  # merge_params lists every problem on its own line: keep the first
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    first = lines[1] if len(lines) > 1 else re.sub(r"^checkpoint '[^']*': ", "", lines[0])
    more = f" (+{len(lines) - 2} more)" if len(lines) > 2 else ""
    raise ExportError(f"'{source}' does not match {CONFIG_FILE}: {first[:200]}{more}") from None
  return Student(
      model=model,
      params=jax.tree.map(np.asarray, params),
      config=cfg,
      folder=folder,
      image_size=image_size,
      dtype=dtype,
  )
