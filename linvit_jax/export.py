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

`Student.preprocess` runs the run's own eval preprocessing (the pp string, TensorFlow imported
only then); `encode` / `predict` / `tokens` take preprocessed arrays, or raw images and paths.
Loading and applying a student imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from linvit_jax import checkpoints
from linvit_jax import gfile
from linvit_jax import tree as tree_lib
from linvit_jax.data import pp_spec
from linvit_jax.errors import ConfigError
from linvit_jax.errors import UserError
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import from_config
from linvit_jax.models import vit

CONFIG_FILE = "student_config.json"
FORMAT = 2


class ExportError(UserError, ValueError):
  """An export folder that cannot be read; the message names the folder and what is missing."""


def model_fields(student_config: Mapping[str, Any]) -> dict[str, Any]:
  """The `vit.Model` fields of a student_config.json (format 2's "model", or format 1 whole)."""
  if "model" in student_config and isinstance(student_config["model"], Mapping):
    return dict(student_config["model"])
  return dict(student_config)


def student_attention(config: Any) -> Any:
  """The student's attention for a run: an exported student's own (student_config.json beside
  `student.init`, e.g. a hybrid's per-layer list), else `config.student.attention`."""
  if config.student.init:
    exported = _exported_student_config(config)
    if exported is not None:
      return exported["attention"]
  attention = config.student.attention  # a feature map's name, a spec block or one per layer
  return tree_lib.as_dict(attention) if hasattr(attention, "to_dict") else attention


def _exported_student_config(config: Any) -> dict[str, Any] | None:
  """student_config.json beside `student.init`, checked against config.model; None if absent."""
  path = os.path.join(os.path.dirname(config.student.init), CONFIG_FILE)
  text = gfile.read_text(path)
  if text is None:
    return None
  exported = model_fields(json.loads(text))
  ours = json.loads(json.dumps(from_config.model_kwargs(config.model)))  # tuples → lists
  differ = [
      f"{k}: {exported[k]!r} there, {ours[k]!r} in config.model"
      for k in ours
      if k in exported and exported[k] != ours[k]
  ]
  if differ:
    raise ConfigError(
        f"student.init {config.student.init!r} was exported for another model "
        f"({'; '.join(differ[:4])}): set config.model to match"
    )
  return exported


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
    results: Mapping[str, Any],
) -> dict[str, Any]:
  """What an export says about its student (see the module doc)."""
  model = json.loads(json.dumps({**model_kwargs, "attention": attention}))
  final = _final_fidelity(results)
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
      "images_seen": results.get("images_seen"),
      "softmax_layers": results.get("softmax_layers", []),
      "seed": config.seed,
  }
  fidelity = {
      "end_to_end": final,
      "teacher_top1": results.get("teacher_top1"),
      "student_top1": results.get("student_top1"),
  }
  if results.get("knn"):
    fidelity["knn"] = results["knn"]
  if results.get("eval_view_fidelity"):
    fidelity["eval_view"] = results["eval_view_fidelity"]
  size = config.data.image_size
  return {
      "format": FORMAT,
      "model": model,
      "preprocessing": {
          "image_size": list(size) if isinstance(size, (list, tuple)) else [size, size],
          "pp": pp_spec.inference_pp(config.data.pp_eval),
          "gelu": "tanh" if model.get("gelu_approximate", True) else "exact",
          "patch_size": model.get("patch_size"),
      },
      "teacher": {"init": config.teacher.init or None, "attention": "softmax"},
      "recipe": recipe,
      "fidelity": fidelity,
  }


def _final_fidelity(results: Mapping[str, Any]) -> dict[str, Any] | None:
  tags = [k for k in results if k.startswith("end_to_end_")]
  if not tags:
    return None
  last = results[tags[-1]]
  return {
      "measured": tags[-1][len("end_to_end_") :],
      **{k: v for k, v in last.items() if isinstance(v, float)},
  }


def model_card(cfg: Mapping[str, Any]) -> str:
  """README.md of an export folder."""
  m, pre, rec, fid = cfg["model"], cfg["preprocessing"], cfg["recipe"], cfg["fidelity"]
  attention = m["attention"]
  kinds = attention if isinstance(attention, str) else ", ".join(map(str, attention))
  lines = [
      "# linvit_jax student",
      "",
      f"A linear-attention ViT ({kinds}) converted from the softmax teacher "
      f"`{cfg['teacher']['init']}` by linvit_jax: weights that do not depend on the attention "
      f"operator copied (surgery policy `{rec['surgery_policy']}`), attention distilled on its "
      "outputs.",
      "",
      f"- architecture: width {m.get('width')}, depth {m.get('depth')}, heads {m.get('num_heads')}, "
      f"patch {pre['patch_size']}, pool `{m.get('pool_type')}`, registers {m.get('reg_tokens', 0)}",
      f"- input: {pre['image_size'][0]}×{pre['image_size'][1]} px, preprocessing `{pre['pp']}`, "
      f"{pre['gelu']} GELU",
      "- recipe: "
      + (
          ", ".join(
              f"{s['name']} ({s['kind']}, {s['steps']} steps × {s['batch_size']})"
              for s in rec["stages"]
          )
          or "surgery only"
      )
      + (f"; layers {rec['softmax_layers']} kept softmax" if rec["softmax_layers"] else ""),
      "",
      "## How close to its teacher",
      "",
  ]
  e2e = fid.get("end_to_end")
  if e2e:
    lines.append(
        f"On held-out images ({e2e['measured']}): "
        + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in e2e.items() if k != "measured")
    )
  view = fid.get("eval_view")
  if view:
    lines.append(
        f"On the held-out images as `encode` sees them ({view['images']}, `pp` above): "
        + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in view.items() if k != "images")
    )
  if fid.get("teacher_top1") is not None:
    lines.append(
        f"Top-1: teacher {100 * fid['teacher_top1']:.2f} %, "
        f"student {100 * fid['student_top1']:.2f} %."
    )
  if fid.get("knn"):
    k = fid["knn"]
    lines.append(
        f"k-NN top-1 on `{k['dataset']}`: teacher {100 * k['teacher_top1']:.2f} %, "
        f"student {100 * k['student_top1']:.2f} % (retention {100 * k['retention']:.1f} %)."
    )
    if "cls_cosine" in k:
      lines.append(
          f"Pooled-feature cosine to the teacher on the same images: mean {k['cls_cosine']:.4f}, "
          f"worst {k['cls_cosine_min']:.4f}."
      )
  lines += [
      "",
      "## Load it",
      "",
      "```python",
      "import linvit_jax",
      "student = linvit_jax.load_student('THIS_FOLDER')",
      "features = student.encode(['photo.jpg'])  # paths, uint8 HWC arrays, or preprocessed",
      "```",
      "",
      "Files: `student.npz` (big_vision layout), `student.safetensors` (same params, this config "
      "in its metadata), `student_config.json`.",
      "",
  ]
  return "\n".join(lines)


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


@dataclasses.dataclass
class Student:
  """An exported student, ready to use: `model` and `params` for custom code."""

  model: Any
  params: Any
  config: dict[str, Any]
  folder: str = ""

  def __post_init__(self):
    self._apply = jax.jit(lambda p, x: self.model.apply({"params": p}, x, train=False))
    self._pp = None

  @property
  def image_size(self) -> tuple[int, int]:
    return tuple(self.config["preprocessing"]["image_size"])

  def preprocess(self, images: Any) -> np.ndarray:
    """Paths, encoded bytes or uint8 HWC arrays -> the model's input batch, through the run's own
    eval pp string (resize, crop, normalisation: exactly what evaluation used)."""
    if self._pp is None:
      from linvit_jax import quiet_tf

      quiet_tf.import_quietly("tensorflow")  # TensorFlow only when preprocessing is asked for
      from linvit_jax.data import preprocess as pp_lib

      self._pp = pp_lib.get_preprocess_fn(self.config["preprocessing"]["pp"])
    import tensorflow as tf

    out = []
    for image in _as_list(images):
      data = {"image": tf.constant(_encoded(image))}
      out.append(np.asarray(self._pp(data)["image"]))
    return np.stack(out).astype(np.float32)

  def _input(self, images: Any) -> np.ndarray:
    if isinstance(images, np.ndarray) and images.dtype.kind == "f" and images.ndim == 4:
      return images  # already preprocessed
    return self.preprocess(images)

  def tokens(self, images: Any) -> np.ndarray:
    """Final normalised tokens [B, N, D] (cls and registers first, as the teacher's)."""
    return np.asarray(self._apply(self.params, self._input(images))[1]["encoded"])

  def encode(self, images: Any) -> np.ndarray:
    """The pooled final feature [B, D] (cls token, MAP or mean pool, as the teacher's)."""
    return np.asarray(self._apply(self.params, self._input(images))[1]["pre_logits"])

  def predict(self, images: Any) -> np.ndarray:
    """Logits [B, classes]; a headless student has none."""
    if not self.model.num_classes:
      raise ExportError(f"student '{self.folder}' has no head (num_classes is None): use encode()")
    return np.asarray(self._apply(self.params, self._input(images))[0])

  def save(self, folder: str) -> None:
    save(folder, self.params, self.config)


def _as_list(images: Any) -> Sequence[Any]:
  if isinstance(images, (str, bytes)) or (isinstance(images, np.ndarray) and images.ndim == 3):
    return [images]
  return list(images)


def _encoded(image: Any) -> bytes:
  if isinstance(image, bytes):
    return image
  if isinstance(image, (str, os.PathLike)):
    with gfile.open(str(image), "rb") as f:
      return f.read()
  a = np.asarray(image)
  if a.dtype != np.uint8 or a.ndim not in (2, 3):
    raise ExportError(
        f"an image must be a path, encoded bytes or a uint8 HxW[xC] array; got {a.dtype} {a.shape}"
    )
  from PIL import Image

  buf = io.BytesIO()  # PNG is lossless: the pp's decode sees exactly these pixels
  Image.fromarray(a[..., 0] if a.ndim == 3 and a.shape[-1] == 1 else a).save(buf, format="PNG")
  return buf.getvalue()


def load_student(folder: str) -> Student:
  """The student exported into `folder` (a run's workdir, or an export made by `save`)."""
  text = gfile.read_text(os.path.join(folder, CONFIG_FILE))
  if text is None:
    raise ExportError(f"'{folder}': no {CONFIG_FILE} (not a linvit_jax export folder)")
  cfg = json.loads(text)
  fields = model_fields(cfg)
  if "preprocessing" not in cfg:  # format 1: model fields only
    cfg = {"format": 1, "model": fields, "preprocessing": None}
  model = vit.Model(**fields)
  npz = os.path.join(folder, "student.npz")
  st = os.path.join(folder, "student.safetensors")
  if gfile.exists(npz):
    flat = checkpoints.flatten(checkpoints.load_npz(npz))
  elif gfile.exists(st):
    from safetensors import numpy as st_numpy

    with gfile.open(st, "rb") as f:
      flat = st_numpy.load(f.read())
  else:
    raise ExportError(f"'{folder}': neither student.npz nor student.safetensors")
  stored = checkpoints.unflatten(flat)
  # Checked against the model the config describes (names, shapes), at the stored grid.
  emb = np.shape(stored["embedding"]["kernel"])
  side = (
      int(round(np.sqrt(np.shape(stored["pos_embedding"])[1]))) if "pos_embedding" in stored else 1
  )
  probe = np.zeros((1, side * emb[0], side * emb[1], emb[2]), np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), probe)["params"]
  params = checkpoints.merge_params(stored, shapes, source=npz if gfile.exists(npz) else st)
  return Student(model=model, params=jax.tree.map(np.asarray, params), config=cfg, folder=folder)
