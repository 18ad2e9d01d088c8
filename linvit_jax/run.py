"""One conversion run, end to end, as a function of (config, workdir); main.py is its CLI.

Kept separate from main.py so the ablation driver, the notebook and the tests call the same path.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from linvit_jax import checkpoints
from linvit_jax import compile_cache
from linvit_jax import config_lib
from linvit_jax import distill
from linvit_jax import evaluate
from linvit_jax import export
from linvit_jax import gfile
from linvit_jax import sharding
from linvit_jax import stages
from linvit_jax import surgery
from linvit_jax import train
from linvit_jax.errors import UserError
from linvit_jax.data import input_pipeline
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint

# Folded into the seed's key for a converted student's init (see `run`).
STUDENT_INIT_SALT = 0x5EED


class ConfigError(UserError, ValueError):
  """A config that cannot run, found before any compute."""


def model_kwargs(config: mlc.ConfigDict) -> dict[str, Any]:
  kw = config.model.to_dict()
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


def build_models(config: mlc.ConfigDict) -> tuple[Any, Any]:
  kw = model_kwargs(config)
  return vit.Model(**kw, attention="softmax"), vit.Model(**kw, attention=_attention(config))


def _attention(config: mlc.ConfigDict) -> Any:
  """The student's attention: an exported student's own (student_config.json beside
  `student.init`, e.g. a hybrid's per-layer list), else `student.attention`."""
  if config.student.get("init"):
    exported = _exported_student_config(config)
    if exported is not None:
      return exported["attention"]
  a = config.student.attention
  return a.to_dict() if hasattr(a, "to_dict") else a


def _exported_student_config(config: mlc.ConfigDict) -> dict[str, Any] | None:
  """student_config.json beside `student.init`, checked against config.model; None if absent."""
  path = os.path.join(os.path.dirname(config.student.init), "student_config.json")
  text = gfile.read_text(path)
  if text is None:
    return None
  exported = export.model_fields(json.loads(text))
  ours = json.loads(json.dumps(model_kwargs(config)))  # tuples → lists, as in the json
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


def validate(config: mlc.ConfigDict) -> None:
  """Everything that can be checked before compute, each with a message naming the field."""

  def check(field: str, fn, *args) -> Any:
    try:
      return fn(*args)
    except ConfigError:
      raise
    except (ValueError, TypeError, KeyError) as e:  # the libraries' own messages, located
      raise ConfigError(f"config.{field}: {e}") from e

  for name in config.stages:
    if name not in config:
      raise ConfigError(f"stage {name!r} is listed in config.stages but config.{name} is missing")
    kind = config[name].kind
    if kind not in config_lib.STAGE_KINDS:
      raise ConfigError(f"config.{name}.kind={kind!r}: unknown stage kind")
    if kind in ("distill_attention", "align") and not config.teacher.init:
      raise ConfigError(f"stage {name!r} ({kind}) needs a teacher but config.teacher.init is empty")
    settings = check(name, train.stage_settings, {**config[name].to_dict(), "name": name})
    check(
        f"{name}.optimizer",
        train.make_optimizer,
        settings["optimizer"],
        settings["steps"],
        {"w": True},
    )
    if kind == "align" and config[name].w_label:
      raise ConfigError(
          f"config.{name}.w_label={config[name].w_label}: an align stage is "
          "label-free (use a finetune stage for labels)"
      )
    if kind in ("train", "finetune") and config[name].w_label and not config.model.num_classes:
      raise ConfigError(
          f"config.{name}.w_label={config[name].w_label} but the model has no "
          "head (model.num_classes is None): set w_label=0 (label-free)"
      )
    if kind != "distill_attention" and config[name].w_logit_kd and teacher_head_skipped(config):
      raise ConfigError(
          f"config.{name}.w_logit_kd={config[name].w_logit_kd}: teacher.dont_load="
          f"{tuple(config.teacher.dont_load)} leaves the teacher's head out, so it has no logits "
          "to distil; set it to 0 (the student's new head trains on labels)"
      )
    if kind != "distill_attention" and config[name].label_loss not in distill.LABEL_LOSSES:
      raise ConfigError(
          f"config.{name}.label_loss={config[name].label_loss!r}: unknown; known: "
          f"{sorted(distill.LABEL_LOSSES)}"
      )
  depth = check("model.variant", vit.decode_variant, config.model.variant or None).get(
      "depth", config.model.depth
  )
  check("student.attention", attn_lib.parse_layer_specs, _attention(config), depth or 1)
  teacher_model, student_model = check("model", build_models, config)
  check("surgery.policy", surgery.get_policy, config.surgery.policy)
  if any(config[name].kind == "distill_attention" for name in config.stages):
    check("distill", distill.make_distill_loss, teacher_model, student_model, config)
  knn = config.eval.knn
  if knn.dataset:
    if not config.teacher.init:
      raise ConfigError(
          "config.eval.knn compares student and teacher: config.teacher.init is empty"
      )
    if knn.k <= 0 or knn.temperature <= 0:
      raise ConfigError(f"config.eval.knn: k={knn.k} and temperature={knn.temperature} must be > 0")
    check("eval.knn.pp", input_pipeline.get_preprocess_fn, _knn_pp(config))
  if config.data.pp_train:
    check("data.pp_train", input_pipeline.get_preprocess_fn, config.data.pp_train)
  if config.data.pp_eval:
    check("data.pp_eval", input_pipeline.get_preprocess_fn, config.data.pp_eval)


def _train_iter_fn(config, batch_size: int, seed: int):
  def make(start_step: int) -> Iterator[dict]:
    return input_pipeline.make_train_iterator(
        dataset=config.data.dataset,
        split=config.data.train_split,
        pp=config.data.pp_train,
        global_batch_size=batch_size,
        seed=seed,
        data_dir=config.data.data_dir or None,
        shuffle_buffer=config.data.shuffle_buffer,
        start_step=start_step,
    )

  return make


def _eval_batches(config, pp: str | None = None, max_examples: int = 0) -> Iterator[dict]:
  it = input_pipeline.make_eval_iterator(
      dataset=config.data.eval_dataset or config.data.dataset,
      split=config.data.eval_split,
      pp=pp or config.data.pp_eval,
      global_batch_size=config.data.eval_batch_size,
      data_dir=config.data.data_dir or None,
  )
  seen = 0
  limit = min(filter(None, (max_examples, config.data.eval_max_examples)), default=0)
  for batch in it:
    if limit and seen >= limit:
      return
    seen += len(batch["image"])
    yield batch


def _sample_images(config, n: int) -> np.ndarray:
  """n eval images, the same on every process (calibration and fidelity must agree): the first
  ones of the eval split, or with `eval.sample_pp` its random views under a fixed seed."""
  dataset = config.data.eval_dataset or config.data.dataset
  if config.eval.get("sample_pp"):
    it = input_pipeline.make_train_iterator(
        dataset=dataset,
        split=config.data.eval_split,
        pp=config.eval.sample_pp,
        global_batch_size=n,
        seed=12345,
        data_dir=config.data.data_dir or None,
        shuffle_buffer=0,
        process_index=0,
        process_count=1,
    )
    return np.asarray(next(iter(it))["image"])
  it = input_pipeline.make_eval_iterator(
      dataset=dataset,
      split=config.data.eval_split,
      pp=config.data.pp_eval,
      global_batch_size=max(n, 8),
      data_dir=config.data.data_dir or None,
      process_index=0,
      process_count=1,
  )
  out = []
  for batch in it:
    out.append(batch["image"][np.asarray(batch["_mask"])])
    if sum(len(o) for o in out) >= n:
      break
  return np.concatenate(out)[:n]


def _read_sample(config: mlc.ConfigDict) -> np.ndarray:
  """The fidelity/calibration sample; a dataset that cannot be read (a missing folder, an
  unprepared TFDS dataset, a wrong data_dir) is the user's to fix: one line, not a traceback."""
  try:
    return _sample_images(config, max(8, config.eval.fidelity_images))
  except (FileNotFoundError, ValueError, AssertionError, OSError) as e:
    reason = " ".join(str(e).split())
    raise ConfigError(
        f"config.data: cannot read {config.data.eval_dataset or config.data.dataset}"
        f" split {config.data.eval_split!r} (data_dir "
        f"{config.data.data_dir or 'default'!r}): {reason[:600]}"
    ) from e


def _knn_pp(config: mlc.ConfigDict) -> str:
  knn = config.eval.knn
  if knn.pp:
    return knn.pp
  image_ops = export.inference_pp(config.data.pp_eval).rsplit("|", 1)[0]  # drop keep("image")
  return f'{image_ops}|keep("image","{knn.label_key}")'


def _knn_batches(config: mlc.ConfigDict, split: str, limit: int) -> Iterator[dict]:
  knn = config.eval.knn
  it = input_pipeline.make_eval_iterator(
      dataset=knn.dataset,
      split=split,
      pp=_knn_pp(config),
      global_batch_size=knn.batch_size,
      data_dir=knn.data_dir or None,
      process_index=0,
      process_count=1,
  )
  seen = 0
  for batch in it:
    if limit and seen >= limit:
      return
    seen += int(np.sum(batch["_mask"]))
    yield batch


def check_knn_set(config: mlc.ConfigDict) -> None:
  """Reads the k-NN reference labels before any model compute: an unreadable set, or one whose
  reference split holds fewer than two classes, is a ConfigError naming eval.knn."""
  knn = config.eval.knn
  try:
    labels = [
        np.asarray(b[knn.label_key])[np.asarray(b["_mask"], bool)]
        for b in _knn_batches(config, knn.train_split, knn.train_examples)
    ]
  except (FileNotFoundError, ValueError, KeyError, AssertionError, OSError) as e:
    raise ConfigError(
        f"config.eval.knn.dataset={knn.dataset!r} ({knn.train_split!r}): cannot read labelled "
        f"examples: {' '.join(str(e).split())[:400]}"
    ) from e
  classes = np.unique(np.concatenate(labels)) if labels else np.array([])
  if len(classes) < 2:
    raise ConfigError(
        f"config.eval.knn.dataset={knn.dataset!r}: split {knn.train_split!r} holds "
        f"{len(classes)} class(es); k-NN classification needs at least 2"
    )
  count = sum(len(x) for x in labels)
  if count < knn.k:
    raise ConfigError(
        f"config.eval.knn.k={knn.k}: more neighbours than the {count} reference examples"
    )


def knn_retention(config, teacher_model, teacher_params, student_model, student_params) -> dict:
  """Weighted k-NN top-1 of teacher and student on eval.knn's set, and their ratio."""
  knn = config.eval.knn
  out = {"dataset": knn.dataset, "k": knn.k}
  for who, model, params in (
      ("teacher", teacher_model, teacher_params),
      ("student", student_model, student_params),
  ):
    train = evaluate.pooled_features(
        model, params, _knn_batches(config, knn.train_split, knn.train_examples), knn.label_key
    )
    test = evaluate.pooled_features(
        model, params, _knn_batches(config, knn.eval_split, knn.eval_examples), knn.label_key
    )
    out[f"{who}_top1"] = evaluate.knn_top1(*train, *test, k=knn.k, temperature=knn.temperature)
    out["train_examples"], out["eval_examples"] = len(train[0]), len(test[0])
  out["retention"] = out["student_top1"] / max(out["teacher_top1"], 1e-12)
  return out


def keep_fresh(params: Any, fresh: Any, patterns: Sequence[str]) -> tuple[Any, list[str]]:
  """params with every leaf whose path fully matches one of `patterns` taken from `fresh`."""
  regexes = [re.compile(p) for p in patterns]
  flat, flat_fresh = checkpoints.flatten(params), checkpoints.flatten(fresh)
  kept = sorted(k for k in flat if any(r.fullmatch(k) for r in regexes))
  if not kept:
    raise ConfigError(
        f"student.dont_load={tuple(patterns)!r} matches no student parameter; "
        f"names look like {sorted(flat)[:3]}"
    )
  return checkpoints.unflatten({**flat, **{k: flat_fresh[k] for k in kept}}), kept


def _write_json(path: str, obj: Any) -> None:
  gfile.write_text(path, json.dumps(obj, indent=1, default=float))


# What decides the contents of a workdir's checkpoints (plus every listed stage's block); a rerun
# that differs here would resume or skip stages trained for another config.
_RUN_IDENTITY = (
    "seed",
    "model",
    "student",
    "surgery",
    "distill",
    "stages",
    "data.dataset",
    "data.train_split",
    "data.pp_train",
    "teacher.dont_load",
)
_STAGE_BOOKKEEPING = (
    "checkpoint_every",
    "max_to_keep",
    "log_every",
    "eval_every",
    "progress",
    "max_nonfinite_in_a_row",
)


def _check_same_run(workdir: str, config: mlc.ConfigDict) -> None:
  """A rerun in a workdir resumes the run recorded there (config.json), never a different one."""
  try:
    text = gfile.read_text(os.path.join(workdir, "config.json"))
    old = json.loads(text) if text else None
  except (OSError, ValueError):
    return  # unreadable or torn: _prepare_workdir reports an unusable workdir
  if not isinstance(old, dict):
    return
  new = json.loads(config.to_json_best_effort())

  def get(tree: Any, key: str) -> Any:
    for part in key.split("."):
      tree = tree.get(part) if isinstance(tree, dict) else None
    if isinstance(tree, dict) and key in new.get("stages", []):  # bookkeeping may change
      tree = {k: v for k, v in tree.items() if k not in _STAGE_BOOKKEEPING}
    return tree

  def diff(a: Any, b: Any, key: str) -> None:  # down to the leaves that differ
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        diff(a.get(k), b.get(k), f"{key}.{k}")
    elif a != b:
      diffs.append(f"{key}: {json.dumps(a)} there, {json.dumps(b)} now")

  keys = list(_RUN_IDENTITY) + list(new.get("stages", [])) + ["teacher.init"]
  diffs: list[str] = []
  for key in keys:
    a, b = get(old, key), get(new, key)
    if key == "teacher.init":  # the same file may be reached by another path or machine
      a, b = (os.path.basename(x) if isinstance(x, str) else x for x in (a, b))
    diff(a, b, key)
  if diffs:
    more = f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else ""
    raise ConfigError(
        f"workdir {workdir!r} holds a run of another config ({'; '.join(diffs[:4])}{more}); "
        "resuming it would mix the two. Pass a new --workdir, or delete that one to start over."
    )


def _prepare_workdir(workdir: str) -> None:
  """Creates the workdir and proves it writable before any compute."""
  try:
    gfile.makedirs(workdir)
    gfile.write_text(os.path.join(workdir, ".write_test"), "ok")
  except Exception as e:  # noqa: BLE001 - any failure here means the same thing to the user
    raise ConfigError(f"workdir {workdir!r} is not writable: {type(e).__name__}: {e}") from e


def _labelled(config: mlc.ConfigDict) -> bool:
  """Whether top-1 can be measured: the model has a head and the eval data carries labels."""
  if not config.model.num_classes:
    return False
  batch = next(iter(_eval_batches(config, max_examples=1)), None)
  return batch is not None and config.data.label_key in batch


def _attention_json(model: Any) -> Any:
  """The student's attention as vit.Model(attention=...) takes it back: one spec or per layer."""
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


def worst_layers(fidelity_rows: list[dict[str, float]], k: int) -> list[int]:
  """The k layers with the lowest teacher-forced cosine (`evaluate.attention_fidelity` rows)."""
  return sorted(int(l) for l in np.argsort([r["cosine"] for r in fidelity_rows])[:k])


def _to_softmax_layers(teacher_params, student_model, student_params, layers: list[int]):
  """The student with `layers` turned back into softmax attention holding the teacher's q/k/v/out
  (their feature-map params dropped); other layers untouched."""
  if "encoderblock" in student_params["Transformer"]:
    raise ConfigError("student.softmax_layers needs a per-block (scan=False) student")
  specs = list(vit.layer_specs(student_model))
  for l in layers:
    specs[l] = attn_lib.AttentionSpec(kind="softmax")
  model = student_model.clone(attention=tuple(specs))
  params = dict(student_params)  # fresh containers along the edited paths; other leaves shared
  params["Transformer"] = dict(params["Transformer"])
  for l in layers:
    name = f"encoderblock_{l}"
    block = dict(params["Transformer"][name])
    block[distill.ATTN] = dict(teacher_params["Transformer"][name][distill.ATTN])
    params["Transformer"][name] = block
  return model, params


def teacher_head_skipped(config: mlc.ConfigDict) -> bool:
  """Whether teacher.dont_load leaves the teacher's head out (a new head: no teacher logits)."""
  return bool(config.teacher.init) and checkpoints.dont_load_matcher(config.teacher.dont_load)(
      "head/kernel"
  )


def resolve_architecture(config: mlc.ConfigDict) -> mlc.ConfigDict:
  """With `teacher.architecture="init"`, a copy of config whose model block is read from the
  teacher checkpoint (vit_checkpoint.model_config_from_init); otherwise config itself."""
  if config.teacher.architecture == "config":
    return config
  if config.teacher.architecture != "init":
    raise ConfigError(
        f"config.teacher.architecture={config.teacher.architecture!r}: expected 'config' or 'init'"
    )
  if not config.teacher.init:
    raise ConfigError("config.teacher.architecture='init' needs config.teacher.init")
  model = vit_checkpoint.model_config_from_init(
      config.model.to_dict(), config.teacher.init, teacher_head_skipped(config)
  )
  resolved = config.copy_and_resolve_references()
  with resolved.unlocked():
    resolved.model = mlc.ConfigDict(model)
    resolved.teacher.architecture = "config"  # resolved: config.json says what ran
  return resolved


def run(config: mlc.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs a config in workdir and returns the results dict (also written to results.json)."""
  sharding.maybe_initialize_distributed()
  compile_cache.enable(config.compile_cache or None)
  config = resolve_architecture(config)
  validate(config)
  try:  # before any compute: a mesh the devices cannot form or a batch it cannot split
    mesh = sharding.make_mesh(config.mesh)
    for name in config.stages:
      sharding.check_batch_size(
          config[name].batch_size,
          mesh,
          accum_steps=config[name].optimizer.accum_steps,
          what=f"config.{name}.batch_size",
      )
  except ValueError as e:
    raise ConfigError(f"config.mesh / batch_size on {jax.device_count()} devices: {e}") from e
  _check_same_run(workdir, config)
  is_main = jax.process_index() == 0
  if is_main:
    _prepare_workdir(workdir)

  teacher_model, student_model = build_models(config)
  rng = jax.random.PRNGKey(config.seed)
  sample = _read_sample(config)
  if config.eval.knn.dataset and teacher_model is not None:
    check_knn_set(config)
  fid_images = sample[: config.eval.fidelity_images]
  curve_images = sample[: max(1, min(len(sample), config.eval.get("curve_images", 16)))]
  labelled = _labelled(config)
  results: dict[str, Any] = {"config": config.to_dict(), "timing_s": {}, "labelled": labelled}
  t_start = time.time()

  def top1(model, params, batches=None):
    return (
        evaluate.top1(model, params, batches or _eval_batches(config), mesh) if labelled else None
    )

  # --- teacher and surgery ------------------------------------------------------------------
  teacher_params = None
  if config.teacher.init:  # read and checked before any compute: a bad checkpoint fails fast
    teacher_shapes = jax.eval_shape(teacher_model.init, rng, sample[:1])["params"]
    if config.teacher.dont_load:  # params not loaded keep an init value: a real one, not a shape
      teacher_shapes = jax.jit(teacher_model.init)(rng, sample[:1])["params"]
    teacher_params = vit.load(
        teacher_shapes,
        config.teacher.init,
        model_kwargs(config),
        dont_load=tuple(config.teacher.dont_load),
    )
  # A converted student's fresh params must not come from the key that initialised its teacher:
  # a teacher trained from scratch by this code with the same seed started from PRNGKey(seed),
  # and its trained attention kernels keep ~0.9 cosine to that init, so "fresh" attention would
  # secretly be a copy (seed 0 alone distilled to 82 % in 100 steps, every other seed to ~53 %).
  init_rng = jax.random.fold_in(rng, STUDENT_INIT_SALT) if config.teacher.init else rng
  fresh_student = jax.jit(student_model.init)(init_rng, sample[:1])["params"]
  student_params = fresh_student
  if config.student.init:  # an exported student: evaluate it, or train it further
    student_params = vit.load(
        fresh_student,
        config.student.init,
        model_kwargs(config),
        dont_load=tuple(config.student.dont_load),
    )
  # The run's identity is written only now that its inputs load: a first start that failed on a
  # bad checkpoint or dataset leaves nothing that would refuse the corrected rerun.
  if is_main:
    gfile.write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=1))

  def fidelity(tag: str) -> None:
    results[f"fidelity_{tag}"] = evaluate.attention_fidelity(
        teacher_model, teacher_params, student_model, student_params, fid_images
    )
    results[f"end_to_end_{tag}"] = evaluate.end_to_end_fidelity(
        teacher_model, teacher_params, student_model, student_params, fid_images
    )

  t_convert = time.time()
  if teacher_params is not None and not config.student.init:
    student_params, report = surgery.transplant(
        teacher_params, student_params, config.surgery.policy
    )
    if config.student.dont_load:
      student_params, kept = keep_fresh(student_params, fresh_student, config.student.dont_load)
      results["student_kept_fresh"] = kept
    if is_main:
      report.to_json(os.path.join(workdir, "surgery_report.json"))
      print(report.table(max_rows=40) if hasattr(report, "table") else report)
    copied_attention = report.copied_attention() if hasattr(report, "copied_attention") else False
    if config.surgery.calibrate and not copied_attention:
      student_params = stages.calibrate(
          teacher_model, teacher_params, student_model, student_params, sample[:64]
      )
  if teacher_params is not None:
    if config.eval.teacher and not teacher_head_skipped(config):  # (a new head: no teacher top-1)
      # the ablation evaluates its shared teacher once, not per arm
      results["teacher_top1"] = top1(teacher_model, teacher_params)
    results["student_top1_converted"] = top1(student_model, student_params)
    fidelity("converted")
  results["timing_s"]["convert_and_evaluate"] = time.time() - t_convert

  # --- stages ----------------------------------------------------------------------------------
  histories = {}
  last_top1 = results.get("student_top1_converted")
  softmax_k = int(config.student.get("softmax_layers", 0) or 0)
  hybrid_done = not softmax_k

  def make_eval_fn(model):
    correct = evaluate.correct_fn(model, config.data.label_key) if labelled else None

    def eval_fn(params):
      # Curves: the first `curve_examples` test images (top-1) and `curve_images` held-out
      # images (fidelity to the teacher): cheap enough to draw every few steps.
      scores = {}
      if correct is not None:
        batches = _eval_batches(config, max_examples=config.eval.curve_examples)
        scores["top1"] = evaluate.evaluate(params, correct, batches, mesh)["top1"]
      if teacher_params is not None:
        e2e = evaluate.end_to_end_fidelity(
            teacher_model, teacher_params, model, params, curve_images
        )
        scores.update({k: v for k, v in e2e.items() if isinstance(v, float)})
        scores["block_cosine_min"] = float(min(e2e["block_cosine"]))
      return scores

    return eval_fn

  images_seen = 0
  for i, name in enumerate(config.stages):
    stage_cfg = config[name]
    t0 = time.time()
    if stage_cfg.kind in ("finetune", "align") and last_top1 is not None:
      results["student_top1_before_finetune"] = last_top1
    loss_fn, mask = stages.build(
        stage_cfg.kind, stage_cfg, config, teacher_model, student_model, student_params
    )
    student_params, history = train.run_stage(
        stage_cfg=stage_cfg,
        name=name,
        loss_fn=loss_fn,
        init_params=student_params,
        trainable_mask=mask,
        frozen=teacher_params,
        workdir=workdir,
        mesh=mesh,
        batch_iter_fn=_train_iter_fn(config, stage_cfg.batch_size, config.seed + 1000 * (i + 1)),
        param_rules=[tuple(r) for r in config.param_rules],
        seed=config.seed + i,
        eval_fn=make_eval_fn(student_model) if stage_cfg.eval_every else None,
    )
    for row in history:  # images seen over the whole run, for curves across stages
      row["images_seen"] = images_seen + row.get("step", 0) * stage_cfg.batch_size
    images_seen += stage_cfg.steps * stage_cfg.batch_size
    histories[name] = history
    results["timing_s"][name] = time.time() - t0
    last_top1 = results[f"student_top1_after_{name}"] = top1(student_model, student_params)
    if teacher_params is not None:
      fidelity(f"after_{name}")
      if not hybrid_done and stage_cfg.kind == "distill_attention":
        # Hybrid: the k layers that linearize worst (teacher-forced cosine on held-out images)
        # go back to softmax with the teacher's weights; later stages train around them.
        cos = [row["cosine"] for row in results[f"fidelity_after_{name}"]]
        layers = worst_layers(results[f"fidelity_after_{name}"], softmax_k)
        student_model, student_params = _to_softmax_layers(
            teacher_params, student_model, student_params, layers
        )
        results["softmax_layers"] = layers
        hybrid_done = True
        logging.info(
            "hybrid: layers %s (teacher-forced cosine %s) keep softmax attention",
            layers,
            [round(cos[l], 3) for l in layers],
        )
        fidelity(f"hybrid_after_{name}")
  results["student_top1"] = (
      last_top1 if last_top1 is not None else top1(student_model, student_params)
  )
  results["histories"] = histories
  results["images_seen"] = images_seen
  results["student_attention"] = _attention_json(student_model)
  if config.eval.knn.dataset and teacher_params is not None:
    results["knn"] = knn_retention(
        config, teacher_model, teacher_params, student_model, student_params
    )

  # --- speed and pictures ----------------------------------------------------------------------
  t_report = time.time()
  tb = sample[: config.eval.throughput_batch]
  if len(tb) < config.eval.throughput_batch:
    tb = np.resize(tb, (config.eval.throughput_batch,) + tb.shape[1:])
  results["student_images_per_s"] = evaluate.images_per_second(student_model, student_params, tb)
  if teacher_params is not None:
    results["teacher_images_per_s"] = evaluate.images_per_second(teacher_model, teacher_params, tb)
    results["resolution"] = _resolution_scaling(
        config, mesh, teacher_model, teacher_params, student_model, student_params, labelled, sample
    )
    if is_main and config.eval.plots:
      _plots(
          config,
          workdir,
          results,
          teacher_model,
          teacher_params,
          student_model,
          student_params,
          sample,
      )
  results["timing_s"]["speed_resolution_plots"] = time.time() - t_report
  results["timing_s"]["total"] = time.time() - t_start
  # A fingerprint of the exported model: its output on 4 fixed images (logits, or the pooled
  # representation of a headless backbone).
  results["student_logits_sample"] = np.asarray(
      evaluate.make_predict_fn(student_model)(student_params, sample[:4])
  ).tolist()

  # --- export ------------------------------------------------------------------------------------
  if is_main:
    student_cfg = export.student_config(
        model_kwargs(config), results["student_attention"], config, results
    )
    export.save(
        workdir,
        student_params,
        student_cfg,
        npz=config.export.npz,
        safetensors=config.export.safetensors,
    )
    _write_json(os.path.join(workdir, "results.json"), results)
  return results


def _with_resize(pp: str, size: int) -> str:
  """The eval pp string with `resize(size)` after the geometric ops (before value_range)."""
  ops = pp.split("|")
  at = next((i for i, op in enumerate(ops) if "value_range" in op), len(ops))
  return "|".join(ops[:at] + [f"resize({size})"] + ops[at:])


def _resolution_scaling(
    config,
    mesh,
    teacher_model,
    teacher_params,
    student_model,
    student_params,
    labelled: bool,
    sample: np.ndarray,
):
  """Teacher and student at each factor × the training resolution (position embeddings
  resampled): top-1 when labelled, the student's end-to-end fidelity to the teacher at the same
  resolution, forward images/s and the compiled forward's peak memory (XLA's estimate)."""
  rows = []
  size = config.data.image_size
  n_fid = max(1, min(len(sample), config.eval.get("resolution_fidelity_images", 16)))
  for factor in config.eval.resolution_factors:
    new = int(size * factor)
    grid = (new // config.model.patch_size[0], new // config.model.patch_size[1])
    row = {
        "factor": factor,
        "image_size": new,
        "tokens": grid[0] * grid[1]
        + (1 if config.model.pool_type == "tok" else 0)
        + config.model.reg_tokens,
    }
    # The normalised sample, resized (resizing commutes with the affine normalisation).
    images = np.asarray(
        jax.image.resize(jnp.asarray(sample), (len(sample), new, new, sample.shape[-1]), "bilinear")
    )
    tb = np.resize(images, (config.eval.throughput_batch,) + images.shape[1:])
    params = {}
    for name, model, p in (
        ("teacher", teacher_model, teacher_params),
        ("student", student_model, student_params),
    ):
      params[name] = evaluate.resample_for_resolution(p, grid)
      if labelled:
        pp = config.data.pp_eval if factor == 1 else _with_resize(config.data.pp_eval, new)
        batches = _eval_batches(config, pp, max_examples=config.eval.resolution_examples)
        row[f"{name}_top1"] = evaluate.top1(model, params[name], batches, mesh)
      row[f"{name}_images_per_s"] = evaluate.images_per_second(model, params[name], tb)
      row[f"{name}_peak_bytes"] = evaluate.forward_peak_bytes(model, params[name], tb)
    e2e = evaluate.end_to_end_fidelity(
        teacher_model, params["teacher"], student_model, params["student"], images[:n_fid]
    )
    row.update({k: v for k, v in e2e.items() if isinstance(v, float)})
    rows.append(row)
  return rows


def _plots(
    config, workdir, results, teacher_model, teacher_params, student_model, student_params, sample
) -> None:
  import tempfile
  # matplotlib writes local files; a gs:// workdir gets a copy of each.
  local = tempfile.mkdtemp() if gfile.is_remote(workdir) else workdir
  fid = {k.replace("fidelity_", ""): v for k, v in results.items() if k.startswith("fidelity_")}
  evaluate.plot_fidelity(fid, os.path.join(local, "fidelity.png"))
  evaluate.plot_fidelity_curves(
      results.get("histories", {}), os.path.join(local, "fidelity_curves.png")
  )
  n = config.eval.attention_map_images
  if n:
    tmaps = evaluate.cls_attention_maps(teacher_model, teacher_params, sample[:n])
    smaps = evaluate.cls_attention_maps(student_model, student_params, sample[:n])
    evaluate.plot_attention_maps(
        sample[:n], tmaps, smaps, os.path.join(local, "attention_maps.png")
    )
  if local != workdir:
    for name in os.listdir(local):
      gfile.copy(os.path.join(local, name), os.path.join(workdir, name))


def format_summary(results: Mapping[str, Any]) -> str:
  """The table main.py prints: accuracy (when labelled), fidelity to the teacher, speed."""
  lines = ["", "== linvit_jax results " + "=" * 50]

  def pct(x):
    return f"{100 * x:6.2f} %" if isinstance(x, float) else "   n/a"

  if results.get("teacher_top1") is not None:
    lines.append(f"teacher (softmax) top-1          {pct(results['teacher_top1'])}")
    what = (
        "student as loaded top-1        "
        if results["config"]["student"].get("init")
        else "student after surgery top-1    "
    )
    lines.append(f"{what}  {pct(results['student_top1_converted'])}")
  for k, v in results.items():
    if k.startswith("student_top1_after_") and v is not None:
      lines.append(f"student after {k[19:]:<19s}top-1 {pct(v)}")
  if results.get("student_top1") is not None:
    lines.append(f"student final top-1              {pct(results['student_top1'])}")
  e2e = [(k[11:], v) for k, v in results.items() if k.startswith("end_to_end_")]
  if e2e:
    lines.append("")
    lines.append("end-to-end fidelity to the teacher (student's own forward, held-out images)")
    lines.append(f"{'':28s}{'cls cos':>9s}{'patch cos':>11s}{'min block':>11s}")
    for tag, v in e2e:
      cls = f"{v['cls_cosine']:9.4f}" if "cls_cosine" in v else f"{'-':>9s}"
      lines.append(f"{tag:<28s}{cls}{v['patch_cosine']:11.4f}{min(v['block_cosine']):11.4f}")
  if results.get("softmax_layers"):
    lines.append(f"hybrid: layers {results['softmax_layers']} keep softmax attention")
  if results.get("knn"):
    k = results["knn"]
    lines.append(
        f"k-NN top-1 (k={k['k']}, {k['dataset']}, {k['train_examples']} reference / "
        f"{k['eval_examples']} classified): teacher {pct(k['teacher_top1'])}, student "
        f"{pct(k['student_top1'])}, retention {100 * k['retention']:.1f} %"
    )
  fids = [(k[9:], v) for k, v in results.items() if k.startswith("fidelity_")]
  if fids:
    lines.append("")
    lines.append("per-layer attention fidelity (teacher-forced), cosine / normalised MSE")
    width = max([22] + [len(name) for name, _ in fids])  # whole stage names, never cut
    header = "  " + " ".join(f"{name:>{width}s}" for name, _ in fids)
    lines.append("layer" + header[5:] if len(header) > 5 else header)
    for i in range(len(fids[0][1])):
      cells = " ".join(
          ("%10.3f / %-9.3f" % (v[i]["cosine"], v[i]["nmse"])).rjust(width) for _, v in fids
      )
      lines.append(f"{i:>5d}  {cells}".rstrip())
  if "teacher_images_per_s" in results:
    lines.append("")
    lines.append(
        f"images/s (forward, batch {results['config']['eval']['throughput_batch']}): "
        f"teacher {results['teacher_images_per_s']:.1f}, "
        f"student {results['student_images_per_s']:.1f}"
    )
  for row in results.get("resolution", []):
    acc = (
        f"top-1 teacher {pct(row['teacher_top1'])}, student {pct(row['student_top1'])}; "
        if "teacher_top1" in row
        else ""
    )
    cls = f"cls cos {row['cls_cosine']:.4f}, " if "cls_cosine" in row else ""
    lines.append(
        f"  {row['image_size']:>4d}px ({row['tokens']} tokens): {acc}{cls}patch cos "
        f"{row['patch_cosine']:.4f}; images/s teacher {row['teacher_images_per_s']:.1f}, "
        f"student {row['student_images_per_s']:.1f}; peak MB teacher "
        f"{row['teacher_peak_bytes'] / 2**20:.0f}, student "
        f"{row['student_peak_bytes'] / 2**20:.0f}"
    )
  lines.append(f"total time {results['timing_s']['total']:.0f} s")
  return "\n".join(lines)
