"""The one place that reads a run's config into what it builds: the teacher and the student (its
attention included), the data sources' arguments, each stage's models and training stream, and
what the config asks to read from teacher.init. models/ and data/ below take plain arguments and
know no config schema (big_vision builds `Model(**config.model)` and hands its input pipeline
`config.input`); the driver, preflight, the report and the bench build through here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import ml_collections as mlc
import numpy as np

from linvit_jax.artifacts import export_format
from linvit_jax.configuration import config_lib
from linvit_jax.data import sources
from linvit_jax.models import checkpoint_record
from linvit_jax.models import checkpoints
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import tree as tree_lib
from linvit_jax.runtime.errors import ConfigError

# ------------------------------------------------------------------------------------ the models


def model_kwargs(model_cfg: Any) -> dict[str, Any]:
  """vit.Model's keyword arguments from a `model` block (ConfigDict or dict)."""
  kw = tree_lib.as_dict(model_cfg)
  variant = kw.pop("variant") or None
  if variant:
    # A variant decides width/depth/mlp/heads/patch; explicit fields only override when asked
    # (base_config's small defaults must not shadow 'S/16').
    for k in ("width", "depth", "mlp_dim", "num_heads", "patch_size"):
      kw.pop(k, None)
    kw["variant"] = variant
  kw["patch_size"] = tuple(kw["patch_size"]) if "patch_size" in kw else None
  if kw["patch_size"] is None:
    kw.pop("patch_size")
  return kw


def student_attention(config: mlc.ConfigDict) -> Any:
  """The student's attention for a run: an exported student's own (student_config.json beside
  `student.init`, e.g. a hybrid's per-layer list), else `config.student.attention`."""
  if config.student.init:
    exported = _exported_model_fields(config)
    if exported is not None:
      return exported["attention"]
  attention = config.student.attention  # a feature map's name, a spec block or one per layer
  return tree_lib.as_dict(attention) if hasattr(attention, "to_dict") else attention


def _exported_model_fields(config: mlc.ConfigDict) -> dict[str, Any] | None:
  """The model fields exported beside `student.init`, checked against config.model; None if
  there are none."""
  exported = export_format.exported_model_fields(config.student.init)
  if exported is None:
    return None
  ours = json.loads(json.dumps(model_kwargs(config.model)))  # tuples → lists
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


def models(config: mlc.ConfigDict, attention: Any = None) -> tuple[vit.Model, vit.Model]:
  """(teacher, student): the same ViT from config.model, with softmax attention and with the
  student's (`attention`, else student_attention(config))."""
  if attention is None:
    attention = student_attention(config)
  kw = model_kwargs(config.model)
  return vit.Model(**kw, attention="softmax"), vit.Model(**kw, attention=attention)


def stage_models(
    config: mlc.ConfigDict, stage_cfg: mlc.ConfigDict, teacher_model: Any, student_model: Any
) -> tuple[Any, Any]:
  """The two models as a stage trains them: at the stage's own image_size (e.g. the deployment
  resolution) they resample their stored position tables in the forward, so the same params
  train there and the exported student keeps its grid."""
  size = stage_cfg.get("image_size", 0)
  base = config.data.image_size
  if not size or size == base:
    return teacher_model, student_model
  ph, pw = student_model.patch_size
  bh, bw = (base, base) if isinstance(base, int) else tuple(base)
  grid = (bh // ph, bw // pw)
  return teacher_model.clone(posemb_grid=grid), student_model.clone(posemb_grid=grid)


def teacher_head_skipped(config: mlc.ConfigDict) -> bool:
  """Whether teacher.dont_load leaves the teacher's head out (a new head: no teacher logits)."""
  return bool(config.teacher.init) and checkpoints.dont_load_matcher(config.teacher.dont_load)(
      "head/kernel"
  )


# ------------------------------------------------------------- what a config reads from its teacher

# The pp fields whose `init_norm` op resolve_from_init replaces (and every stage's own pp_train).
_PP_FIELDS = (("data", "pp_train"), ("data", "pp_eval"), ("eval", "sample_pp"))


def _pp_fields(config: mlc.ConfigDict) -> list[tuple[str, str]]:
  stages = config_lib.stage_blocks(config)
  return [*_PP_FIELDS, *((name, "pp_train") for name in stages if "pp_train" in config[name])]


_INIT_NORM = re.compile(r"init_norm(\(\s*required\s*=\s*True\s*\))?")


def read_checkpoint(path: str) -> checkpoint_record.CheckpointRecord | None:
  """The checkpoint at `path` (teacher.init, student.init) read once into its record, which the
  run's every reader takes (models/checkpoint_record.py); None for an empty path."""
  return checkpoint_record.read(path) if path else None


def resolve_from_init(
    config: mlc.ConfigDict, teacher: checkpoint_record.CheckpointRecord | None = None
) -> mlc.ConfigDict:
  """config with what it asks to read from teacher.init filled in (a copy; config itself when it
  asks nothing): the model block with `teacher.architecture="init"` (vit_checkpoint.
  model_config_from_init, except `teacher.config_fields`), and each pp string's `init_norm` op.
  `teacher`: teacher.init already read (build.read_checkpoint); else it is read here."""
  if config.teacher.architecture not in ("config", "init"):
    raise ConfigError(
        f"config.teacher.architecture={config.teacher.architecture!r}: expected 'config' or 'init'"
    )
  pp_fields = _pp_fields(config)
  wants_norm = any(_INIT_NORM.search(config[b][f] or "") for b, f in pp_fields)
  if config.teacher.architecture == "config" and not wants_norm:
    return config
  if not config.teacher.init:
    what = "the pp op init_norm" if wants_norm else "teacher.architecture='init'"
    raise ConfigError(f"config: {what} needs config.teacher.init")
  teacher = teacher if teacher is not None else checkpoint_record.read(config.teacher.init)
  resolved = config.copy_and_resolve_references()
  with resolved.unlocked():
    if wants_norm:
      source = vit_checkpoint.infer_vit_config(teacher).get("preprocessing")
      for block, field in pp_fields:
        resolved[block][field] = _INIT_NORM.sub(
            lambda m: norm_op(source, bool(m.group(1)), config.teacher.init),
            config[block][field],
        )
    if config.teacher.architecture == "init":
      resolved.model = mlc.ConfigDict(_model_from_init(config, teacher))
      resolved.teacher.architecture = "config"  # resolved: config.json says what ran
      # A grayscale (or other non-RGB) teacher: the pp decodes as many channels as its patch
      # embedding takes. RGB teachers keep their pp strings as written.
      channels = vit_checkpoint.input_channels(teacher)
      if channels != 3:
        for block, field in pp_fields:
          if resolved[block][field]:
            resolved[block][field] = decode_channels(
                resolved[block][field], channels, f"config.{block}.{field}", config.teacher.init
            )
  return resolved


_DECODE = re.compile(r"(?<![\w.])decode(?:\(([^)]*)\))?(?![\w(])")
_CHANNELS_ARG = re.compile(r"channels\s*=\s*(\d+)")
_IMAGENET_NORM = re.compile(r"vgg_value_range(?!\(\s*mean)")


def decode_channels(pp: str, channels: int, field: str, init: str) -> str:
  """`pp` with each `decode` op asked for `channels` channels (what the teacher's patch embedding
  takes); an explicit other `decode(channels=...)`, or an op that decodes RGB by itself, is an
  error naming both."""
  if "decode_jpeg_and_inception_crop" in pp:
    raise ConfigError(
        f"{field}: decode_jpeg_and_inception_crop gives 3-channel images, but {init!r} takes "
        f"{channels}-channel ones; use decode(channels={channels})|inception_crop(...)"
    )

  def fix(m: re.Match) -> str:
    args = (m.group(1) or "").strip()
    first = args.split(",")[0].strip()
    # decode(1) names the channels positionally, as big_vision's configs often do.
    given = _CHANNELS_ARG.search(args) or (re.fullmatch(r"(\d+)", first) if first else None)
    if given:
      if int(given.group(1)) != channels:
        raise ConfigError(
            f"{field}: {m.group(0)} decodes {given.group(1)}-channel images, but {init!r} takes "
            f"{channels}-channel ones (its embedding/kernel)"
        )
      return m.group(0)
    return f"decode(channels={channels}{', ' + args if args else ''})"

  if _IMAGENET_NORM.search(pp):
    raise ConfigError(
        f"{field}: {init!r} takes {channels}-channel images and ImageNet's RGB mean/std "
        f"(vgg_value_range without mean=, the default when the source declares no "
        f"normalisation) cannot normalise them; pass norm=minus_one_one (convert_folder) or "
        f"vgg_value_range(mean=..., std=...) with {channels} value(s)"
    )
  return _DECODE.sub(fix, pp)


def _model_from_init(config: mlc.ConfigDict, teacher: Any) -> dict[str, Any]:
  model = vit_checkpoint.model_config_from_init(
      config.model.to_dict(), teacher, teacher_head_skipped(config)
  )
  for name in config.teacher.config_fields:
    if name not in model:
      raise ConfigError(f"config.teacher.config_fields: {name!r} is not a model field")
    if name == "pool_type" and model[name] in ("tok", "map") and model[name] != config.model[name]:
      raise ConfigError(
          f"config.model.pool_type={config.model.pool_type!r}: the checkpoint's pool type is "
          f"{model[name]!r} (it has a cls token / MAP head)"
      )
    model[name] = config.model[name]
  return model


def norm_op(preprocessing: dict[str, Any] | None, required: bool, init: str) -> str:
  """The pp op normalising 0..255 pixels as the source declares (its mean/std on 0..1 pixels)."""
  if preprocessing is None:
    if required:
      raise ConfigError(
          f"init_norm(required=True) (norm=source): {init!r} does not say how its inputs are "
          "normalised"
      )
    return "vgg_value_range"  # ImageNet's mean/std
  mean = ", ".join(f"{255 * m:.6g}" for m in preprocessing["mean"])
  std = ", ".join(f"{255 * s:.6g}" for s in preprocessing["std"])
  return f"vgg_value_range(mean=({mean}), std=({std}))"


# -------------------------------------------------------------------------------------- the data


def _eval_dataset(config: mlc.ConfigDict) -> str:
  return config.data.eval_dataset or config.data.dataset


def train_iter_fn(
    config: mlc.ConfigDict, batch_size: int, seed: int, pp: str = "", mixup: float = 0.0
) -> Callable[[int], Iterator[dict]]:
  """`make(start_step)`: the training stream of config.data; `pp` (a stage's own pp string)
  replaces data.pp_train when given; `mixup`: a stage's Beta concentration (0: off)."""
  return sources.train_iter_fn(
      dataset=config.data.dataset,
      split=config.data.train_split,
      pp=pp or config.data.pp_train,
      batch_size=batch_size,
      seed=seed,
      data_dir=config.data.data_dir or None,
      shuffle_buffer=config.data.shuffle_buffer,
      compose=config.data.compose,
      mixup=mixup,
  )


def stage_stream(config: mlc.ConfigDict, index: int) -> Callable[[int], Iterator[dict]]:
  """The training stream of the stage config.stages[index]: its batch size, its own pp_train
  and mixup, and a seed of its own."""
  stage_cfg = config[config.stages[index]]
  return train_iter_fn(
      config,
      stage_cfg.batch_size,
      config.seed + 1000 * (index + 1),
      pp=stage_cfg.get("pp_train", ""),
      mixup=stage_cfg.get("mixup", 0.0),
  )


def eval_batches(
    config: mlc.ConfigDict, pp: str | None = None, max_examples: int = 0
) -> Iterator[dict]:
  """The eval split (padded, `_mask`), at most min(max_examples, data.eval_max_examples)."""
  return sources.eval_batches(
      dataset=_eval_dataset(config),
      split=config.data.eval_split,
      pp=pp or config.data.pp_eval,
      batch_size=config.data.eval_batch_size,
      data_dir=config.data.data_dir or None,
      limit=min(filter(None, (max_examples, config.data.eval_max_examples)), default=0),
  )


def labelled(config: mlc.ConfigDict) -> bool:
  """Whether top-1 can be measured: the model has a head and the eval data carries labels."""
  if not config.model.num_classes:
    return False
  batch = next(iter(eval_batches(config, max_examples=1)), None)
  return batch is not None and config.data.label_key in batch


def _eval_source(config: mlc.ConfigDict) -> dict:
  """The eval split's dataset, split and data_dir, as sources' readers take them."""
  return dict(
      dataset=_eval_dataset(config),
      split=config.data.eval_split,
      data_dir=config.data.data_dir or None,
  )


def _sample_images(config: mlc.ConfigDict, n: int) -> np.ndarray:
  if config.eval.sample_pp:
    return sources.random_views(pp=config.eval.sample_pp, n=n, **_eval_source(config))
  return eval_view_images(config, n)


def eval_view_images(config: mlc.ConfigDict, n: int) -> np.ndarray:
  """The first `n` eval images through `data.pp_eval` (what the exported student's `encode`
  sees: one whole-image view per image), the same on every process."""
  return sources.first_images(pp=config.data.pp_eval, n=n, **_eval_source(config))


def sample_images(config: mlc.ConfigDict, n: int | None = None) -> np.ndarray:
  """The fidelity / calibration sample (`n` images, by default max(8, eval.fidelity_images)), the
  same on every process: the first eval images, or with `eval.sample_pp` random views of the
  eval split under a fixed seed. A dataset that cannot be read (a missing folder, an unprepared
  TFDS dataset, a wrong data_dir) is the user's to fix: a ConfigError, one line."""
  try:
    return _sample_images(config, n or max(8, config.eval.fidelity_images))
  except (FileNotFoundError, ValueError, AssertionError, OSError) as e:
    reason = " ".join(str(e).split())
    raise ConfigError(
        f"config.data: cannot read {_eval_dataset(config)}"
        f" split {config.data.eval_split!r} (data_dir "
        f"{config.data.data_dir or 'default'!r}): {reason[:600]}"
    ) from e


def photo_paths(
    config: mlc.ConfigDict, split: str, field: str = "eval.test.split"
) -> tuple[list[str], list[str]]:
  """(paths, names relative to the folder) of an image-folder split of the eval dataset (the data
  block's folder), in file order; an empty split gives two empty lists. Not an image folder, or a
  bad split: a ConfigError naming `field`."""
  dataset = _eval_dataset(config)
  folder = sources.image_folder_of(dataset, config.data.data_dir)
  if folder is None:
    raise ConfigError(
        f"config.{field}={split!r}: the test photos come from an image folder, the eval "
        f"dataset is {dataset!r} (set eval.test.split='' for no test evaluation)"
    )
  try:
    return sources.photo_paths(folder, split)
  except (FileNotFoundError, ValueError) as e:
    raise ConfigError(f"config.{field}={split!r} of {folder}: {e}") from e


def knn_pp(config: mlc.ConfigDict) -> str:
  """eval.knn.pp, or the run's eval image ops plus the label."""
  knn = config.eval.knn
  return knn.pp or sources.with_label(config.data.pp_eval, knn.label_key)


def knn_batches(config: mlc.ConfigDict, split: str, limit: int) -> Iterator[dict]:
  """The first `limit` examples (0: all) of eval.knn's dataset split, on this process alone."""
  knn = config.eval.knn
  return sources.local_batches(
      dataset=knn.dataset,
      split=split,
      pp=knn_pp(config),
      batch_size=knn.batch_size,
      data_dir=knn.data_dir or None,
      limit=limit,
  )
