"""The conversion pipeline, one step per line of `run`: load the teacher → build the student →
transplant → run the stages → report → export. main.py (the CLI), `linvit_jax.convert` (the Python
API), the ablation and the notebook all call `run`; each step's work lives in its own module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections as mlc
import numpy as np

from linvit_jax import build
from linvit_jax import preflight
from linvit_jax import report
from linvit_jax import run_identity
from linvit_jax.artifacts import export_folder
from linvit_jax.configuration import config_lib
from linvit_jax.conversion import calibrate
from linvit_jax.conversion import stages
from linvit_jax.conversion import surgery
from linvit_jax.conversion import train
from linvit_jax.evaluation import evaluate
from linvit_jax.evaluation import layer_swap
from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import results as results_lib
from linvit_jax.models import vit
from linvit_jax.runtime import compile_cache
from linvit_jax.runtime import distributed
from linvit_jax.runtime import gfile

# Folded into the seed's key for a converted student's init (see `_init_student`).
STUDENT_INIT_SALT = 0x5EED


def run(config: mlc.ConfigDict, workdir: str) -> results_lib.Results:
  """Runs a config in workdir and returns its results record (written as results.json)."""
  distributed.maybe_initialize_distributed()
  compile_cache.enable(config.compile_cache or None)
  # The teacher (and an exported student to continue) read once, each into one record that the
  # architecture, the normalisation, the load and the workdir's identity all take.
  teacher = build.read_checkpoint(config.teacher.init)
  student = build.read_checkpoint(config.student.init)
  config = build.resolve_from_init(config, teacher)  # what the config asks to read from init
  config, knn_skipped = preflight.resolve_knn(config)  # knn="auto": Fashion-MNIST if installed
  mesh = preflight.check(config, workdir)  # every check that needs no compute; writes nothing
  sample = build.sample_images(config)
  if report.test_block(config):  # a bad test split fails now, not after the training
    test_paths, _, val_paths = report.test_sets(config)
    few = photo_eval.too_few_message(len(test_paths), len(val_paths), config.eval.test.min_photos)
    if few:  # said before the training too: the user may rather add photos now
      logging.warning("test photos: %s", few)
  if config.eval.knn.dataset:
    preflight.check_knn_set(config)
  # What the run is made from, by content (the teacher's bytes, the photos), read once: a rerun
  # made from other inputs is refused before anything in the workdir is written.
  identity = run_identity.of_run(config, {"teacher": teacher, "student": student})
  records = [teacher, student]
  del teacher, student  # _run lets go of the records once their params are loaded
  with _workdir(config, workdir, identity):
    return _run(config, workdir, mesh, sample, identity, knn_skipped, records)


@contextlib.contextmanager
def _workdir(config: mlc.ConfigDict, workdir: str, identity: dict[str, Any]) -> Iterator[None]:
  """The workdir, created and held (run_identity.locked) by process 0 for the run, once the
  config and the identity recorded there (if any) agree with this run. preflight.check compared
  the config and proved the place writable; a refused identity touches nothing, not even the lock
  file, and both are compared again under the lock (another run may have ended meanwhile)."""
  if jax.process_index() != 0:
    yield
    return

  def check() -> None:
    preflight.check_same_run(workdir, config)
    run_identity.check(workdir, identity)

  run_identity.check(workdir, identity)
  with run_identity.locked(workdir, check):
    yield


def _run(config, workdir, mesh, sample, identity, knn_skipped, records) -> results_lib.Results:
  """run() once its inputs are checked and its workdir is held; `records`: (teacher, student)
  checkpoints as read, or None each."""
  teacher_model, student_model = build.models(config)
  labelled = build.labelled(config)
  # Never a silent k-NN skip: the summary and the model card say why and the fix.
  record = results_lib.Results(config.to_dict(), labelled=labelled, knn_skipped=knn_skipped or None)
  t_start = time.time()

  rng = jax.random.PRNGKey(config.seed)
  teacher_params = _load_teacher(config, teacher_model, rng, sample, records[0])
  fresh, student_params = _init_student(config, student_model, rng, sample, records[1])
  records.clear()  # the loaded params hold what is needed; the records' trees go
  if jax.process_index() == 0:  # written once the inputs load: a failed start blocks no rerun
    run_identity.write(workdir, identity)
    gfile.write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=1))
  scorer = report.Scorer(config, mesh, labelled, teacher_model, teacher_params, sample)

  t0 = time.time()
  if teacher_params is not None:
    student_params = _convert(config, workdir, scorer, student_model, student_params, fresh, record)
  record.timing_s["convert_and_evaluate"] = time.time() - t0

  student_model, student_params = _run_stages(
      config, workdir, mesh, scorer, student_model, student_params, record
  )
  _report(config, workdir, scorer, student_model, student_params, record)
  record.timing_s["total"] = time.time() - t_start
  # A fingerprint of the exported model: its output on 4 fixed images (logits, or the pooled
  # representation of a headless backbone).
  record.student_logits_sample = np.asarray(
      evaluate.make_predict_fn(student_model)(student_params, sample[:4])
  ).tolist()
  if jax.process_index() == 0:
    kwargs = build.model_kwargs(config.model)
    student_cfg = export_folder.student_config(kwargs, record.student_attention, config, record)
    export_folder.save(
        workdir,
        student_params,
        student_cfg,
        npz=config.export.npz,
        safetensors=config.export.safetensors,
    )
    gfile.write_text(os.path.join(workdir, "results.json"), record.dumps())
  return record


def _load_teacher(config, teacher_model, rng, sample, record) -> Any:
  """The teacher's params from teacher.init (None without one), read and checked before any
  compute: a bad checkpoint fails fast."""
  if not config.teacher.init:
    return None
  teacher_shapes = jax.eval_shape(teacher_model.init, rng, sample[:1])["params"]
  if config.teacher.dont_load:  # params not loaded keep an init value: a real one, not a shape
    teacher_shapes = jax.jit(teacher_model.init)(rng, sample[:1])["params"]
  kwargs = build.model_kwargs(config.model)
  return vit.load(teacher_shapes, record, kwargs, tuple(config.teacher.dont_load))


def _init_student(config, student_model, rng, sample, record) -> tuple[Any, Any]:
  """(fresh params, the student's params): fresh, or an exported student (student.init)."""
  # A converted student's fresh params must not come from the key that initialised its teacher:
  # a teacher trained from scratch by this code with the same seed started from PRNGKey(seed),
  # and its trained attention kernels keep ~0.9 cosine to that init, so "fresh" attention would
  # secretly be a copy (seed 0 alone distilled to 82 % in 100 steps, every other seed to ~53 %).
  init_rng = jax.random.fold_in(rng, STUDENT_INIT_SALT) if config.teacher.init else rng
  fresh = jax.jit(student_model.init)(init_rng, sample[:1])["params"]
  if not config.student.init:  # else an exported student: evaluate it, or train it further
    return fresh, fresh
  kwargs = build.model_kwargs(config.model)
  return fresh, vit.load(fresh, record, kwargs, tuple(config.student.dont_load))


def _convert(config, workdir, scorer, student_model, student_params, fresh, record) -> Any:
  """The converted student's params (the teacher's copied by surgery, then calibrated, unless
  student.init gives them), scored with the teacher into `record`."""
  teacher_model, teacher_params = scorer.teacher_model, scorer.teacher_params
  if not config.student.init:
    student_params, copied_attention = _transplant(
        config, workdir, teacher_params, student_params, fresh, record
    )
    if config.surgery.calibrate and not copied_attention:
      student_params = calibrate.calibrate(
          teacher_model, teacher_params, student_model, student_params, scorer.sample[:64]
      )
  if config.eval.teacher and not build.teacher_head_skipped(config):
    record.teacher_scored = True  # (not with a new head)
    record.teacher_top1 = scorer.top1(teacher_model, teacher_params)
  top1 = scorer.top1(student_model, student_params)
  fidelity = scorer.fidelity(student_model, student_params)
  record.converted = results_lib.Stage(results_lib.CONVERTED, top1=top1, fidelity=fidelity)
  return student_params


def _transplant(config, workdir, teacher_params, params, fresh, record) -> tuple[Any, bool]:
  """(params, whether the attention was copied): copy the same (surgery.policy), keep
  student.dont_load fresh (record.student_kept_fresh); the report goes to the workdir."""
  params, surgery_report = surgery.transplant(teacher_params, params, config.surgery.policy)
  kept = None
  if config.student.dont_load:
    params, kept = surgery.keep_fresh(params, fresh, config.student.dont_load)
    record.student_kept_fresh = kept
  if jax.process_index() == 0:
    # The whole table (one row per tensor, ~270 for a ViT-B) goes to a file; the run says one line.
    surgery_report.to_json(os.path.join(workdir, "surgery_report.json"))
    table_path = os.path.join(workdir, "surgery_report.txt")
    gfile.write_text(table_path, surgery_report.table() + "\n")
    extra = f"; student.dont_load keeps {len(kept)} fresh" if kept else ""
    print(f"surgery: {surgery_report.summary()}{extra}, table in {table_path}")
  return params, surgery_report.copied_attention()


def _run_stages(config, workdir, mesh, scorer, student_model, student_params, record):
  """Each stage of config.stages in turn (resumable from its checkpoints), scored after it into
  record.stages; the hybrid swap (student.softmax_layers) after the first distill_attention
  stage."""
  histories, images_seen = {}, 0
  last_top1 = record.converted.top1 if record.converted else None
  hybrid_pending = bool(config.student.softmax_layers)
  teacher_params = scorer.teacher_params
  for i, name in enumerate(config.stages):
    stage_cfg = config[name]
    t0 = time.time()
    stage = results_lib.Stage(name)
    if stage_cfg.kind in ("finetune", "align") and last_top1 is not None:
      stage.top1_before = record.top1_before_finetune = last_top1
    student_params, history = _train_stage(
        config, workdir, mesh, scorer, i, student_model, student_params
    )
    for row in history:  # images seen over the whole run, for curves across stages
      row["images_seen"] = images_seen + row.get("step", 0) * stage_cfg.batch_size
    images_seen += stage_cfg.steps * stage_cfg.batch_size
    histories[name] = history
    record.timing_s[name] = time.time() - t0
    record.stages.append(stage)
    last_top1 = stage.top1 = scorer.top1(student_model, student_params)
    if teacher_params is None:
      continue
    stage.fidelity = scorer.fidelity(student_model, student_params)
    if hybrid_pending and stage_cfg.kind == "distill_attention":
      student_model, student_params = _hybrid_swap(
          config, scorer, stage, student_model, student_params
      )
      hybrid_pending = False
  record.student_top1 = (
      last_top1 if last_top1 is not None else scorer.top1(student_model, student_params)
  )
  record.histories = histories
  record.images_seen = images_seen
  record.student_attention = export_folder.attention_json(student_model)
  return student_model, student_params


def _train_stage(config, workdir, mesh, scorer, i, student_model, student_params):
  """(params, logged rows) of stage `config.stages[i]` (train.run_stage: resumed or skipped when
  its checkpoints say so), trained from `student_params` with the teacher frozen."""
  name = config.stages[i]
  stage_cfg = config[name]
  teacher_at, student_at = build.stage_models(
      config, stage_cfg, scorer.teacher_model, student_model
  )
  loss_fn, mask = stages.build(
      stage_cfg.kind, stage_cfg, config, teacher_at, student_at, student_params
  )
  return train.run_stage(
      stage_cfg=stage_cfg,
      name=name,
      loss_fn=loss_fn,
      init_params=student_params,
      trainable_mask=mask,
      frozen=scorer.teacher_params,
      workdir=workdir,
      mesh=mesh,
      batch_iter_fn=build.stage_stream(config, i),
      param_rules=[tuple(r) for r in config.param_rules],
      seed=config.seed + i,
      eval_fn=scorer.curve_fn(student_model) if stage_cfg.eval_every else None,
  )


def _hybrid_swap(config, scorer, stage, student_model, student_params) -> tuple[Any, Any]:
  """(model, params) with k layers back to softmax with the teacher's weights; later stages
  train around them. Which k (student.softmax_pick): those that linearize worst (teacher-forced
  cosine on the held-out images, `stage.fidelity`), or those whose teacher attention alone brings
  the student's final tokens closest to the teacher's on the same images (layer_swap.fix_gains),
  on all of them or on the quarter the student is furthest on ("sensitivity_worst"). The images:
  the fidelity sample, or with student.softmax_pick_images="eval_view" the held-out images as the
  exported student sees them (pp_eval).
  The layers, the gains when measured and the hybrid's fidelity go to `stage`."""
  rows = stage.fidelity.layers
  k = config.student.softmax_layers
  pick = config.student.get("softmax_pick", "tf_cosine")
  if config.student.get("softmax_pick_images", "sample") == "eval_view":
    images = build.eval_view_images(config, config.eval.fidelity_images)
    rows = evaluate.attention_fidelity(
        scorer.teacher_model, scorer.teacher_params, student_model, student_params, images
    )
  else:
    images = scorer.fidelity_images()
  fixed = config_lib.fixed_softmax_layers(pick)
  if fixed is not None:  # named by the config: nothing to measure
    layers = sorted(fixed)
  elif pick in ("sensitivity", "sensitivity_worst"):
    gains = layer_swap.fix_gains(
        scorer.teacher_model,
        scorer.teacher_params,
        student_model,
        student_params,
        images,
        worst_share=layer_swap.WORST_SHARE if pick == "sensitivity_worst" else 1.0,
    )
    layers = layer_swap.most_sensitive(gains, k)
    stage.softmax_gains = [round(g, 6) for g in gains]
    logging.info("hybrid: end-to-end cosine gain of each layer's softmax %s", stage.softmax_gains)
  else:
    layers = surgery.worst_layers(rows, k)
  key_grid = config_lib.key_grid_patches(
      config.student.get("softmax_key_grid", 0),
      config.data.image_size,
      student_model.patch_size[0],
  )
  student_model, student_params = surgery.to_softmax_layers(
      scorer.teacher_params, student_model, student_params, layers, key_grid=key_grid
  )
  stage.softmax_layers = layers
  logging.info(
      "hybrid: layers %s (teacher-forced cosine %s) keep softmax attention%s",
      layers,
      [round(rows[l]["cosine"], 3) for l in layers],
      f", patch keys pooled to {key_grid}x{key_grid} on wider grids" if key_grid else "",
  )
  stage.hybrid = scorer.fidelity(student_model, student_params)
  return student_model, student_params


def _report(config, workdir, scorer, student_model, student_params, record) -> None:
  """report.MEASURES on the final student (k-NN, test photos, speed, resolutions, ...) and the
  plots, into the record."""
  report.take_measures(scorer, student_model, student_params, record)
  if scorer.teacher_params is not None and jax.process_index() == 0 and config.eval.plots:
    t0 = time.time()
    report.write_plots(
        config,
        workdir,
        record,
        scorer.teacher_model,
        scorer.teacher_params,
        student_model,
        student_params,
        scorer.sample,
    )
    record.add_time(report.PLOTS_TIMING, time.time() - t0)
