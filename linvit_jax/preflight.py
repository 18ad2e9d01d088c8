"""Everything a run can check before compute, each failure a ConfigError naming the field: the
config's fields and stage blocks, the resolution against the patch, the mesh and batch sizes, the
image folder's splits, the k-NN set (and `knn="auto"`'s choice), the workdir (writable, and not
holding a run of another config). A config file's `:arg` options are checked earlier, when
get_config reads them (config_checks.py): that needs no teacher, no data and no jax.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from typing import Any

import jax
import ml_collections as mlc
import numpy as np

from linvit_jax import build
from linvit_jax import run_identity
from linvit_jax.configuration import config_lib
from linvit_jax.conversion import distill
from linvit_jax.conversion import distill_stage
from linvit_jax.conversion import optim
from linvit_jax.conversion import surgery
from linvit_jax.conversion import train
from linvit_jax.data import fashion_mnist
from linvit_jax.data import image_folder
from linvit_jax.data import input_pipeline
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import vit
from linvit_jax.runtime import gfile
from linvit_jax.runtime import sharding
from linvit_jax.runtime.errors import ConfigError
from linvit_jax.runtime.errors import shorten


def check(config: mlc.ConfigDict, workdir: str) -> jax.sharding.Mesh:
  """The checks of a run that need no compute and write nothing, in order; returns the device
  mesh it runs on. The workdir is created later, under its lock (run.run), once every input has
  been checked: a refused run leaves no workdir behind."""
  validate(config)
  mesh = check_mesh(config)
  check_data(config)
  inits = {"teacher": config.teacher.init, "student": config.student.init}
  run_identity.check_workdir_place(workdir, run_identity.image_folders(config), inits)
  check_same_run(workdir, config)
  if jax.process_index() == 0:
    probe_workdir(workdir)
  return mesh


def check_mesh(config: mlc.ConfigDict) -> jax.sharding.Mesh:
  """The mesh the devices form, and every stage's batch split over it."""
  try:
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
  return mesh


def validate(config: mlc.ConfigDict) -> None:
  """Everything that can be checked before compute, each with a message naming the field: the
  stage blocks, the model and its resolution, the surgery policy, the distill block, the k-NN
  set and the preprocessing strings, in that order (the first problem is the one reported)."""
  for name in config.stages:
    if name not in config:
      raise ConfigError(f"stage {name!r} is listed in config.stages but config.{name} is missing")
  for name in config_lib.stage_blocks(config):  # listed or not: its fields are its kind's schema
    check_stage_fields(name, config[name])
  for name in config.stages:
    _check_stage(name, config)
  teacher_model, student_model = _check_models(config)
  _checked("surgery.policy", surgery.get_policy, config.surgery.policy)
  if any(config[name].kind == "distill_attention" for name in config.stages):
    _checked("distill", distill_stage.make_distill_loss, teacher_model, student_model, config)
  _check_knn(config)
  if config.data.pp_train:
    _checked("data.pp_train", input_pipeline.get_preprocess_fn, config.data.pp_train)
  for name in config.stages:
    if config[name].get("pp_train"):
      _checked(f"{name}.pp_train", input_pipeline.get_preprocess_fn, config[name].pp_train)
  if config.data.pp_eval:
    _checked("data.pp_eval", input_pipeline.get_preprocess_fn, config.data.pp_eval)


def _checked(field: str, fn, *args) -> Any:
  """fn(*args), its ValueError / TypeError / KeyError a ConfigError naming `field`."""
  try:
    return fn(*args)
  except ConfigError:
    raise
  except (ValueError, TypeError, KeyError) as e:  # the libraries' own messages, located
    raise ConfigError(f"config.{field}: {e}") from e


def _check_stage(name: str, config: mlc.ConfigDict) -> None:
  """A listed stage: its teacher, runner settings and optimizer, then its loss terms."""
  kind = config[name].kind
  if kind in ("distill_attention", "align") and not config.teacher.init:
    raise ConfigError(f"stage {name!r} ({kind}) needs a teacher but config.teacher.init is empty")
  settings = _checked(name, train.stage_settings, {**config[name].to_dict(), "name": name})
  _checked(
      f"{name}.optimizer",
      optim.make_optimizer,
      settings["optimizer"],
      settings["steps"],
      {"w": True},
  )
  if kind in ("train", "finetune", "align") and config[name].blocks_top_weight <= 0:
    raise ConfigError(
        f"config.{name}.blocks_top_weight={config[name].blocks_top_weight}: must be > 0 "
        "(the last block's weight over the first; 1 = every block alike)"
    )
  if kind in ("train", "finetune") and config[name].w_label and config.data.compose:
    raise ConfigError(
        f"config.data.compose={config.data.compose}: composed images have no one label, but "
        f"config.{name} trains on labels (w_label={config[name].w_label})"
    )
  _check_mixup(name, config)
  _check_stage_targets(name, config)


def _check_mixup(name: str, config: mlc.ConfigDict) -> None:
  """A stage's mixup: a finite concentration >= 0, with 2 images per process to blend and no
  labels to train on."""
  kind, mixup = config[name].kind, config[name].get("mixup", 0.0)
  if not (math.isfinite(mixup) and mixup >= 0):
    raise ConfigError(
        f"config.{name}.mixup={mixup}: the Beta concentration of the blend weight must be a "
        "finite number >= 0 (0: off; 1: uniform)"
    )
  if mixup and config[name].batch_size // jax.process_count() < 2:
    raise ConfigError(
        f"config.{name}.mixup={mixup}: blends images within each process's batch, but "
        f"batch_size={config[name].batch_size} over {jax.process_count()} process(es) "
        "leaves fewer than 2 (raise the batch or set mixup=0)"
    )
  if kind in ("train", "finetune") and config[name].w_label and mixup:
    raise ConfigError(
        f"config.{name}.mixup={mixup}: blended images have no one label, but config.{name} "
        f"trains on labels (w_label={config[name].w_label})"
    )


def _check_stage_targets(name: str, config: mlc.ConfigDict) -> None:
  """What a stage's label and logit terms read exists: the model's head, the teacher's head, a
  known label loss."""
  kind = config[name].kind
  if kind in ("train", "finetune") and config[name].w_label and not config.model.num_classes:
    raise ConfigError(
        f"config.{name}.w_label={config[name].w_label} but the model has no "
        "head (model.num_classes is None): set w_label=0 (label-free)"
    )
  if kind != "distill_attention" and config[name].w_logit_kd and build.teacher_head_skipped(config):
    raise ConfigError(
        f"config.{name}.w_logit_kd={config[name].w_logit_kd}: teacher.dont_load="
        f"{tuple(config.teacher.dont_load)} leaves the teacher's head out, so it has no logits "
        "to distil; set it to 0 (the student's new head trains on labels)"
    )
  if "label_loss" in config[name] and config[name].label_loss not in distill.LABEL_LOSSES:
    raise ConfigError(
        f"config.{name}.label_loss={config[name].label_loss!r}: unknown; known: "
        f"{sorted(distill.LABEL_LOSSES)}"
    )


def _check_models(config: mlc.ConfigDict) -> tuple[Any, Any]:
  """(teacher, student) models built from the config, after their depth, attention and
  resolutions (the data's and every stage's own) are checked against each other."""
  depth = _checked("model.variant", vit.decode_variant, config.model.variant or None).get(
      "depth", config.model.depth
  )
  check_softmax_layers(config, depth)
  attention = _checked("student.attention", build.student_attention, config)  # student.init's
  specs = _checked("student.attention", attn_lib.parse_layer_specs, attention, depth or 1)
  teacher_model, student_model = _checked("model", build.models, config, attention)
  check_resolution(config.data.image_size, student_model.patch_size)
  for name in config.stages:  # a stage at its own resolution (e.g. the deployment one)
    size = config[name].get("image_size", 0)
    if size:
      check_resolution(size, student_model.patch_size, f"config.{name}.image_size", "deploy_res")
      if not config[name].get("pp_train"):
        raise ConfigError(
            f"config.{name}.image_size={size}: the stage needs its own pp_train making {size}-px "
            f"views (data.pp_train makes {config.data.image_size}-px ones)"
        )
  sinks = max(spec.sinks for spec in specs)
  if sinks and config.data.image_size:
    ph, pw = student_model.patch_size
    patches = (config.data.image_size // ph) * (config.data.image_size // pw)
    if sinks > patches:
      raise ConfigError(
          f"config.student.attention: sinks={sinks} is more than the {patches} patch tokens of a "
          f"{config.data.image_size}-px image (data.image_size)"
      )
  return teacher_model, student_model


def _check_knn(config: mlc.ConfigDict) -> None:
  """The k-NN settings, when a k-NN set is named: a teacher to compare with, the set, k and the
  temperature, its preprocessing."""
  knn = config.eval.knn
  if not knn.dataset:
    return
  if not config.teacher.init:
    raise ConfigError("config.eval.knn compares student and teacher: config.teacher.init is empty")
  check_knn_dataset(knn.dataset, knn.data_dir)
  if knn.k <= 0 or knn.temperature <= 0:
    raise ConfigError(f"config.eval.knn: k={knn.k} and temperature={knn.temperature} must be > 0")
  _checked("eval.knn.pp", input_pipeline.get_preprocess_fn, build.knn_pp(config))


def check_softmax_layers(config: mlc.ConfigDict, depth: int | None) -> None:
  """student.softmax_layers: a count in [0, depth - 1] (all layers softmax is the teacher; a
  negative count would be read as a slice), swapped in after a distill_attention stage."""
  k = config.student.get("softmax_layers", 0)
  pick = config.student.get("softmax_pick", "tf_cosine")
  if not config_lib.softmax_pick_valid(pick):
    raise ConfigError(
        f"config.student.softmax_pick={pick!r}: expected one of {list(config_lib.SOFTMAX_PICKS)} "
        "or the layers themselves ('8', '4+8')"
    )
  on = config.student.get("softmax_pick_images", "sample")
  if on not in config_lib.SOFTMAX_PICK_IMAGES:
    raise ConfigError(
        f"config.student.softmax_pick_images={on!r}: expected one of "
        f"{list(config_lib.SOFTMAX_PICK_IMAGES)}"
    )
  if isinstance(k, bool) or not isinstance(k, int):
    raise ConfigError(f"config.student.softmax_layers={k!r}: expected a whole number of layers")
  grid = config.student.get("softmax_key_grid", 0)
  if not config_lib.key_grid_valid(grid):
    raise ConfigError(
        f"config.student.softmax_key_grid={grid!r}: expected {config_lib.KEY_GRID_FORMS}"
    )
  if k < 0 or (depth and k >= depth):
    most = f"at most {depth - 1} for this {depth}-layer model" if depth else "at least 0"
    raise ConfigError(
        f"config.student.softmax_layers={k} (convert_folder: softmax_layers={k}): {most}, "
        "and 0 for none (all layers softmax would be the teacher itself)"
    )
  fixed = config_lib.fixed_softmax_layers(pick)
  if k and fixed is not None:
    out_of_range = [l for l in fixed if depth and l >= depth]
    if len(set(fixed)) != k or out_of_range:
      raise ConfigError(
          f"config.student.softmax_pick={pick!r}: expected {k} different layer(s) "
          f"(softmax_layers={k})" + (f" below the depth {depth}" if depth else "")
      )
  if k and not any(config[n].kind == "distill_attention" for n in config.stages if n in config):
    raise ConfigError(
        f"config.student.softmax_layers={k}: the layers are chosen after the first "
        "distill_attention stage, and config.stages has none (set softmax_layers=0, "
        "convert_folder's default being 1)"
    )


def check_resolution(
    image_size: int,
    patch_size: Any,
    field: str = "config.data.image_size",
    option: str = "res",
) -> None:
  """The image is a whole number of patches: a ViT's patch embedding would silently crop the
  rest (and an image smaller than one patch has no token at all)."""
  ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
  step = math.lcm(ph, pw)
  if not image_size or image_size % step == 0:
    return
  below = image_size // step * step
  nearest = " or ".join(str(n) for n in (below, below + step) if n)
  patch = f"{ph}-px" if ph == pw else f"{ph}x{pw}-px"
  why = (
      "smaller than one patch" if image_size < step else f"its last {image_size % step} px cropped"
  )
  raise ConfigError(
      f"{field}={image_size} (convert_folder: {option}={image_size}) is not a multiple of "
      f"the model's {patch} patch ({why}); the nearest valid: {nearest}"
  )


# eval.knn.dataset "auto" (convert_folder's default): the embedded Fashion-MNIST when it is
# installed, else no k-NN, said in the results (`knn_skipped`), never a silent skip.
KNN_AUTO = "auto"
# The k-NN sets that are not TFDS names; said in the error for an unknown name.
_KNN_FORMS = (
    f"{fashion_mnist.NAME}, {image_folder.NAME}:<DIR> (a sub-folder per class), a TFDS name, "
    f"{KNN_AUTO!r} (Fashion-MNIST when installed) or '' (no k-NN; convert_folder: knn=none)"
)


def resolve_knn(config: mlc.ConfigDict) -> tuple[mlc.ConfigDict, str]:
  """(config with eval.knn.dataset="auto" resolved, why k-NN is not measured or "").

  "auto" is Fashion-MNIST (`fashion_mnist_local`) where its files (or a prepared copy) are
  present, else no k-NN: the reason, which also says how to turn it on, is for the run's results
  (`knn_skipped`) and is logged. Any other dataset returns config itself and ""."""
  if config.eval.knn.dataset != KNN_AUTO:
    return config, ""
  missing = fashion_mnist.unavailable(config.eval.knn.data_dir or None)
  resolved = config.copy_and_resolve_references()
  resolved.eval.knn.dataset = "" if missing else fashion_mnist.NAME
  if not missing:
    return resolved, ""
  reason = (
      f"k-NN not measured: knn=auto found no Fashion-MNIST at {fashion_mnist.source_dir()}; to "
      "measure it, install the Debian package dataset-fashion-mnist (or set "
      f"${fashion_mnist.ENV_DIR} to its IDX files), or pass knn={image_folder.NAME}:DIR (a "
      "sub-folder per class) or a TFDS name"
  )
  logging.warning(reason)
  return resolved, reason


def check_knn_dataset(dataset: str, data_dir: str) -> None:
  """The k-NN set exists by name: Fashion-MNIST installed, or a TFDS name TFDS knows (the
  nearest names otherwise, not TFDS's list of all of them). Image folders are read later."""
  if dataset == KNN_AUTO:  # never an error: resolve_knn decides when the run starts
    return
  if dataset == fashion_mnist.NAME:
    missing = fashion_mnist.unavailable(data_dir or None)
    if missing:
      raise ConfigError(
          f"config.eval.knn.dataset={dataset!r}: {missing}; or measure no k-NN (convert_folder: "
          f"knn=none, or knn={KNN_AUTO}: Fashion-MNIST only when installed)"
      )
    return
  if dataset.startswith((image_folder.NAME, "jft:")):
    return
  import tensorflow_datasets as tfds  # noqa: PLC0415 - only for a TFDS name

  try:
    tfds.builder(dataset, data_dir=data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    names = tfds.list_builders(with_community_datasets=False)
    near = difflib.get_close_matches(dataset.split("/")[0].split(":")[0], names, n=5, cutoff=0.5)
    raise ConfigError(
        f"config.eval.knn.dataset={dataset!r}: no such TFDS dataset (nearest: "
        f"{', '.join(near) or 'none close'}); accepted: {_KNN_FORMS}"
    ) from None


def check_data(config: mlc.ConfigDict) -> None:
  """An image folder's training and eval splits each hold a photo, before the workdir exists (a
  folder too small would otherwise fail after the first stage's compute)."""
  data = config.data
  for dataset, split, field in (
      (data.dataset, data.train_split, "train_split"),
      (data.eval_dataset or data.dataset, data.eval_split, "eval_split"),
  ):
    if dataset != image_folder.NAME and not dataset.startswith(image_folder.NAME + ":"):
      continue
    folder = dataset[len(image_folder.NAME) + 1 :] or data.data_dir
    if not folder or gfile.is_remote(folder):
      continue
    try:
      image_folder.parse_split(split)
      index = image_folder.scan(folder)
    except (FileNotFoundError, ValueError) as e:
      raise ConfigError(f"config.data.{field}={split!r} of {folder}: {e}") from e
    try:
      image_folder.split_positions(index, split)
    except ValueError:
      found = len(index.files)
      raise ConfigError(
          f"config.data.{field}={split!r}: {index.root} holds {found} readable photo"
          f"{'' if found == 1 else 's'} and this split gets none; a training and a held-out "
          "split need at least 2 photos (add photos)"
      ) from None


def check_stage_fields(name: str, block: mlc.ConfigDict) -> None:
  """A stage block holds exactly its kind's fields (config_lib.stage): a field the kind does not
  read (it would be silently ignored) or one it misses is a ConfigError naming both."""
  kind = block.kind
  if kind not in config_lib.STAGE_KINDS:
    raise ConfigError(
        f"config.{name}.kind={kind!r}: unknown stage kind; known: {config_lib.STAGE_KINDS}"
    )
  fields = config_lib.stage_fields(kind)
  extra, missing = sorted(set(block) - fields), sorted(
      set(config_lib.stage_losses(kind)) - set(block)
  )
  if extra:
    where = " (its loss weights are config.distill's)" if kind == "distill_attention" else ""
    raise ConfigError(
        f"config.{name}.{extra[0]}: a {kind} stage does not read {extra}{where}; its fields: "
        f"{sorted(fields)}"
    )
  if missing:
    raise ConfigError(
        f"config.{name} ({kind} stage) lacks {missing}: build stage blocks with config_lib.stage"
    )


def check_knn_set(config: mlc.ConfigDict) -> None:
  """Reads the k-NN reference labels before any model compute: an unreadable set, or one whose
  reference split holds fewer than two classes, is a ConfigError naming eval.knn."""
  knn = config.eval.knn
  try:
    labels = [
        np.asarray(b[knn.label_key])[np.asarray(b["_mask"], bool)]
        for b in build.knn_batches(config, knn.train_split, knn.train_examples)
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
# Stage fields added after runs were recorded, at the value that reproduces those runs.
_STAGE_FIELDS_ADDED = {
    "pp_train": "",
    "start_weight": 0.0,
    "mixup": 0.0,
    "image_size": 0,
    "w_structure": 0.0,  # written only when on before 2026-12-06: absent and 0.0 are the same
}
# Student fields added after runs were recorded, likewise.
_STUDENT_FIELDS_ADDED = {
    "softmax_pick": "tf_cosine",
    "softmax_key_grid": 0,
    "softmax_pick_images": "sample",
}
_STAGE_BOOKKEEPING = (
    "checkpoint_every",
    "max_to_keep",
    "log_every",
    "eval_every",
    "progress",
    "max_nonfinite_in_a_row",
)


def check_same_run(workdir: str, config: mlc.ConfigDict) -> None:
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
    if isinstance(tree, dict) and key == "student":
      tree = {**_STUDENT_FIELDS_ADDED, **tree}
      # '32', 32 and '2.0x' / '2x' are one key grid each (a --config override keeps its text)
      tree["softmax_key_grid"] = config_lib.key_grid_canonical(tree["softmax_key_grid"])
    if isinstance(tree, dict) and key in new.get("stages", []):  # bookkeeping may change
      tree = {k: v for k, v in tree.items() if k not in _STAGE_BOOKKEEPING}
      # A run recorded before a stage field existed ran with that field's default; so did a
      # run recorded before every optimizer field was written into each stage's block.
      tree = {**_STAGE_FIELDS_ADDED, **tree}
      if isinstance(tree.get("optimizer"), dict):
        tree["optimizer"] = {**config_lib.OPTIMIZER_DEFAULTS, **tree["optimizer"]}
    return tree

  def diff(a: Any, b: Any, key: str) -> None:  # down to the leaves that differ
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        diff(a.get(k), b.get(k), f"{key}.{k}")
    elif a != b:
      diffs.append(f"{key}: {shorten(json.dumps(a))} there, {shorten(json.dumps(b))} now")

  keys = list(_RUN_IDENTITY) + list(new.get("stages", []))
  if run_identity.read(workdir) is None:  # a run recorded before identity.json: by name only
    keys.append("teacher.init")
  diffs: list[str] = []
  for key in keys:
    a, b = get(old, key), get(new, key)
    if key == "teacher.init":  # the same file may be reached by another path or machine
      a, b = (os.path.basename(x) if isinstance(x, str) else x for x in (a, b))
    diff(a, b, key)
  if diffs:
    more = f" (+{len(diffs) - 2} more)" if len(diffs) > 2 else ""
    raise ConfigError(
        f"workdir {workdir!r} holds a run of another config ({'; '.join(diffs[:2])}{more}); "
        "resuming it would mix the two. Nothing in it was changed: pass a new --workdir, or "
        "delete that one to start over."
    )


def probe_workdir(workdir: str) -> None:
  """prepare_workdir's check, leaving nothing behind: the folders it had to create are removed
  again (the run creates them under its lock once every other check has passed). A remote
  workdir is made and proven as prepare_workdir does (it has no lock to be made under)."""
  if gfile.is_remote(workdir):
    prepare_workdir(workdir)
    return
  created, path = [], os.path.abspath(workdir)
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    created.append(path)
    path = os.path.dirname(path)
  prepare_workdir(workdir)
  for folder in created:  # deepest first
    try:
      os.rmdir(folder)
    except OSError:
      break


def prepare_workdir(workdir: str) -> None:
  """Creates the workdir and proves it writable before any compute."""
  try:
    gfile.makedirs(workdir)
    probe = os.path.join(workdir, ".write_test")
    gfile.write_text(probe, "ok")
    gfile.remove(probe)  # proven: a workdir holds only what the run writes
  except Exception as e:  # noqa: BLE001 - any failure here means the same thing to the user
    raise ConfigError(f"workdir {workdir!r} is not writable: {type(e).__name__}: {e}") from e
