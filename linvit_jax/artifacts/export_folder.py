"""Writing an export folder: what student_config.json says about the student, and `save`.

An export folder holds:
  student.npz           big_vision's params-only layout (big_vision's own `vit.load` reads it
                        when the student is softmax; ours for every operator)
  student.safetensors   the same params ('/'-joined names), its student_config.json in the
                        file's metadata, for the safetensors world (safetensors_file.py)
  student_config.json   {"model": vit.Model fields incl. attention, "preprocessing": input size,
                        pp string, normalisation, GELU form, patch size, "teacher", "recipe",
                        "fidelity"} (format 2; format 1 was the model fields alone, still read)
  README.md             a model card the Hugging Face Hub accepts (model_card.py)

student_loader.py reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from linvit_jax.artifacts import model_card
from linvit_jax.artifacts import safetensors_file
from linvit_jax.artifacts.export_format import CARD_FILE
from linvit_jax.artifacts.export_format import CONFIG_FILE
from linvit_jax.artifacts.export_format import FORMAT
from linvit_jax.artifacts.export_format import NPZ_FILE
from linvit_jax.artifacts.export_format import SAFETENSORS_FILE
from linvit_jax.artifacts.provenance import public_name
from linvit_jax.artifacts.provenance import teacher_info
from linvit_jax.data import pp_spec
from linvit_jax.evaluation import results as results_lib
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import checkpoints
from linvit_jax.models import vit
from linvit_jax.runtime import gfile


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
  return {
      "format": FORMAT,
      "model": model,
      "preprocessing": {
          "image_size": _image_size(config),
          "pp": pp_spec.inference_pp(config.data.pp_eval),
          "gelu": "tanh" if model.get("gelu_approximate", True) else "exact",
          "patch_size": model.get("patch_size"),
      },
      "teacher": {**teacher_info(config.teacher.init), "attention": "softmax"},
      "recipe": _recipe(config, record),
      "fidelity": _fidelity(config, record),
  }


def _image_size(config: Any) -> list[int]:
  size = config.data.image_size
  return list(size) if isinstance(size, (list, tuple)) else [size, size]


def _recipe(config: Any, record: results_lib.Results) -> dict[str, Any]:
  stages = [
      {
          "name": n,
          "kind": config[n].kind,
          "steps": config[n].steps,
          "batch_size": config[n].batch_size,
          "lr": config[n].optimizer.lr,
      }
      for n in config.stages
  ]
  return {
      "surgery_policy": config.surgery.policy,
      "stages": stages,
      "images_seen": record.images_seen,
      "softmax_layers": record.softmax_layers,
      "seed": config.seed,
  }


def _fidelity(config: Any, record: results_lib.Results) -> dict[str, Any]:
  final = record.final()
  fidelity = {
      "end_to_end": {"measured": final[0], **final[1].scalars()} if final else None,
      "teacher_top1": record.teacher_top1,
      "student_top1": record.student_top1,
      # How the numbers were measured, for the card (no local paths: names only).
      "protocol": {
          "source": f"{public_name(config.data.dataset)}, split {config.data.eval_split}",
          "images": config.eval.fidelity_images,
          "view": "random views (eval.sample_pp)" if config.eval.sample_pp else "the eval view",
          "image_size": _image_size(config),
      },
  }
  if record.knn_skipped:  # (k-NN was not measured then: no knn entry beside it)
    fidelity["knn_skipped"] = str(record.knn_skipped)
  for field, value in record.measures():
    card = field.metadata["card"]
    value = _CARD.get(field.name, lambda v, c: v)(value, config) if card and value else None
    if value:
      fidelity[card] = value
  return fidelity


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
  out = {**{k: test[k] for k in keys if k in test}, "rows": rows}
  if "crop_retrieval" in test:  # (results written before it have none)
    out["crop_retrieval"] = _retrieval_summary(test["crop_retrieval"])
  return out


def _retrieval_summary(block: Mapping[str, Any]) -> dict[str, Any]:
  """photo_eval's "crop_retrieval" block for the export: counts, means, the student's interval."""
  if "absent" in block:
    return {"absent": block["absent"]}
  keys = ("feature", "size", "crops_per_photo", "n_photos", "n_queries", "retention", "chance")
  s = block["student_top1"]
  return {
      **{k: block[k] for k in keys},
      "student_top1": [s["mean"], s["lo"], s["hi"]],
      "teacher_top1": block["teacher_top1"]["mean"],
  }


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
    checkpoints.save_npz(os.path.join(folder, NPZ_FILE), host)
  if safetensors:
    flat = checkpoints.flatten(host)
    safetensors_file.write(os.path.join(folder, SAFETENSORS_FILE), flat, cfg)
  gfile.write_text(os.path.join(folder, CARD_FILE), model_card.model_card(cfg))
  gfile.write_text(os.path.join(folder, CONFIG_FILE), json.dumps(cfg, indent=1))
