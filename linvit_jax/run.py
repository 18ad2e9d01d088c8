"""The conversion pipeline, one step per line of `run`: load the teacher → build the student →
transplant → run the stages → report → export. main.py (the CLI), `linvit_jax.convert` (the Python
API), the ablation and the notebook all call `run`; each step's work lives in its own module.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import jax
import ml_collections as mlc
import numpy as np

from linvit_jax import compile_cache
from linvit_jax import evaluate
from linvit_jax import export
from linvit_jax import gfile
from linvit_jax import photo_eval
from linvit_jax import preflight
from linvit_jax import report
from linvit_jax import sharding
from linvit_jax import stages
from linvit_jax import surgery
from linvit_jax import train
from linvit_jax.data import pp_spec
from linvit_jax.data import sources
from linvit_jax.errors import ConfigError
from linvit_jax.models import from_config
from linvit_jax.models import vit

# Folded into the seed's key for a converted student's init (see `_init_student`).
STUDENT_INIT_SALT = 0x5EED


def run(config: mlc.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs a config in workdir and returns the results dict (also written to results.json)."""
  sharding.maybe_initialize_distributed()
  compile_cache.enable(config.compile_cache or None)
  config = from_config.resolve_from_init(config)  # what the config asks to read from init
  config, knn_skipped = preflight.resolve_knn(config)  # knn="auto": Fashion-MNIST if installed
  mesh = preflight.check(config, workdir)  # every check that needs no compute
  teacher_model, student_model = from_config.build_models(
      config.model, export.student_attention(config)
  )
  sample = sources.sample_images(config)
  if _test_block(config):  # a bad test split fails now, not after the training
    test_paths, _, val_paths = _test_sets(config)
    few = photo_eval.too_few_message(len(test_paths), len(val_paths), config.eval.test.min_photos)
    if few:  # said before the training too: the user may rather add photos now
      logging.warning("test photos: %s", few)
  if config.eval.knn.dataset:
    preflight.check_knn_set(config)
  labelled = sources.labelled(config)
  results: dict[str, Any] = {"config": config.to_dict(), "timing_s": {}, "labelled": labelled}
  if knn_skipped:  # never a silent skip: the summary and the model card say why and the fix
    results["knn_skipped"] = knn_skipped
  t_start = time.time()

  rng = jax.random.PRNGKey(config.seed)
  teacher_params = _load_teacher(config, teacher_model, rng, sample)
  fresh, student_params = _init_student(config, student_model, rng, sample)
  if jax.process_index() == 0:  # written once the inputs load: a failed start blocks no rerun
    gfile.write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=1))
  scorer = report.Scorer(config, mesh, labelled, teacher_model, teacher_params, sample)

  t0 = time.time()
  if teacher_params is not None and not config.student.init:
    student_params = _transplant(
        config,
        workdir,
        teacher_model,
        teacher_params,
        student_model,
        student_params,
        fresh,
        sample,
        results,
    )
  if teacher_params is not None:
    if config.eval.teacher and not from_config.teacher_head_skipped(config):
      results["teacher_top1"] = scorer.top1(teacher_model, teacher_params)  # (not with a new head)
    results["student_top1_converted"] = scorer.top1(student_model, student_params)
    scorer.fidelity(results, "converted", student_model, student_params)
  results["timing_s"]["convert_and_evaluate"] = time.time() - t0

  student_model, student_params = _run_stages(
      config, workdir, mesh, scorer, student_model, student_params, results
  )
  _report(config, workdir, scorer, student_model, student_params, results)
  results["timing_s"]["total"] = time.time() - t_start
  # A fingerprint of the exported model: its output on 4 fixed images (logits, or the pooled
  # representation of a headless backbone).
  results["student_logits_sample"] = np.asarray(
      evaluate.make_predict_fn(student_model)(student_params, sample[:4])
  ).tolist()
  if jax.process_index() == 0:
    kwargs = from_config.model_kwargs(config.model)
    student_cfg = export.student_config(kwargs, results["student_attention"], config, results)
    export.save(
        workdir,
        student_params,
        student_cfg,
        npz=config.export.npz,
        safetensors=config.export.safetensors,
    )
    results_json = json.dumps(results, indent=1, default=float)
    gfile.write_text(os.path.join(workdir, "results.json"), results_json)
  return results


def _load_teacher(config, teacher_model, rng, sample) -> Any:
  """The teacher's params from teacher.init (None without one), read and checked before any
  compute: a bad checkpoint fails fast."""
  if not config.teacher.init:
    return None
  teacher_shapes = jax.eval_shape(teacher_model.init, rng, sample[:1])["params"]
  if config.teacher.dont_load:  # params not loaded keep an init value: a real one, not a shape
    teacher_shapes = jax.jit(teacher_model.init)(rng, sample[:1])["params"]
  kwargs = from_config.model_kwargs(config.model)
  return vit.load(teacher_shapes, config.teacher.init, kwargs, tuple(config.teacher.dont_load))


def _init_student(config, student_model, rng, sample) -> tuple[Any, Any]:
  """(fresh params, the student's params): fresh, or an exported student (student.init)."""
  # A converted student's fresh params must not come from the key that initialised its teacher:
  # a teacher trained from scratch by this code with the same seed started from PRNGKey(seed),
  # and its trained attention kernels keep ~0.9 cosine to that init, so "fresh" attention would
  # secretly be a copy (seed 0 alone distilled to 82 % in 100 steps, every other seed to ~53 %).
  init_rng = jax.random.fold_in(rng, STUDENT_INIT_SALT) if config.teacher.init else rng
  fresh = jax.jit(student_model.init)(init_rng, sample[:1])["params"]
  if not config.student.init:  # else an exported student: evaluate it, or train it further
    return fresh, fresh
  kwargs = from_config.model_kwargs(config.model)
  return fresh, vit.load(fresh, config.student.init, kwargs, tuple(config.student.dont_load))


def _transplant(
    config, workdir, teacher_model, teacher_params, student_model, params, fresh, sample, results
) -> Any:
  """Copy the same (surgery.policy), keep student.dont_load fresh, calibrate fresh attention."""
  params, surgery_report = surgery.transplant(teacher_params, params, config.surgery.policy)
  if config.student.dont_load:
    params, kept = surgery.keep_fresh(params, fresh, config.student.dont_load)
    results["student_kept_fresh"] = kept
  if jax.process_index() == 0:
    # The whole table (one row per tensor, ~270 for a ViT-B) goes to a file; the run says one line.
    surgery_report.to_json(os.path.join(workdir, "surgery_report.json"))
    table_path = os.path.join(workdir, "surgery_report.txt")
    gfile.write_text(table_path, surgery_report.table() + "\n")
    kept = results.get("student_kept_fresh")
    extra = f"; student.dont_load keeps {len(kept)} fresh" if kept else ""
    print(f"surgery: {surgery_report.summary()}{extra}, table in {table_path}")
  if config.surgery.calibrate and not surgery_report.copied_attention():
    params = stages.calibrate(teacher_model, teacher_params, student_model, params, sample[:64])
  return params


def _run_stages(config, workdir, mesh, scorer, student_model, student_params, results):
  """Each stage of config.stages in turn (resumable from its checkpoints), scored after it; the
  hybrid swap (student.softmax_layers) after the first distill_attention stage."""
  histories, images_seen = {}, 0
  last_top1 = results.get("student_top1_converted")
  hybrid_pending = bool(config.student.softmax_layers)
  teacher_params = scorer.teacher_params
  for i, name in enumerate(config.stages):
    stage_cfg = config[name]
    t0 = time.time()
    if stage_cfg.kind in ("finetune", "align") and last_top1 is not None:
      results["student_top1_before_finetune"] = last_top1
    teacher_at, student_at = _models_at(config, stage_cfg, scorer.teacher_model, student_model)
    loss_fn, mask = stages.build(
        stage_cfg.kind, stage_cfg, config, teacher_at, student_at, student_params
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
        batch_iter_fn=sources.train_iter_fn(
            config,
            stage_cfg.batch_size,
            config.seed + 1000 * (i + 1),
            pp=stage_cfg.get("pp_train", ""),
            mixup=stage_cfg.get("mixup", 0.0),
        ),
        param_rules=[tuple(r) for r in config.param_rules],
        seed=config.seed + i,
        eval_fn=scorer.curve_fn(student_model) if stage_cfg.eval_every else None,
    )
    for row in history:  # images seen over the whole run, for curves across stages
      row["images_seen"] = images_seen + row.get("step", 0) * stage_cfg.batch_size
    images_seen += stage_cfg.steps * stage_cfg.batch_size
    histories[name] = history
    results["timing_s"][name] = time.time() - t0
    last_top1 = results[f"student_top1_after_{name}"] = scorer.top1(student_model, student_params)
    if teacher_params is None:
      continue
    scorer.fidelity(results, f"after_{name}", student_model, student_params)
    if hybrid_pending and stage_cfg.kind == "distill_attention":
      # The k layers that linearize worst (teacher-forced cosine on held-out images) go back to
      # softmax with the teacher's weights; later stages train around them.
      rows = results[f"fidelity_after_{name}"]
      layers = surgery.worst_layers(rows, config.student.softmax_layers)
      student_model, student_params = surgery.to_softmax_layers(
          teacher_params, student_model, student_params, layers
      )
      results["softmax_layers"], hybrid_pending = layers, False
      logging.info(
          "hybrid: layers %s (teacher-forced cosine %s) keep softmax attention",
          layers,
          [round(rows[l]["cosine"], 3) for l in layers],
      )
      scorer.fidelity(results, f"hybrid_after_{name}", student_model, student_params)
  results["student_top1"] = (
      last_top1 if last_top1 is not None else scorer.top1(student_model, student_params)
  )
  results["histories"] = histories
  results["images_seen"] = images_seen
  results["student_attention"] = export.attention_json(student_model)
  return student_model, student_params


def _models_at(config, stage_cfg, teacher_model, student_model) -> tuple[Any, Any]:
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


def _report(config, workdir, scorer, student_model, student_params, results) -> None:
  """k-NN retention, forward speed, resolution scaling and the plots, into results."""
  teacher_model, teacher_params, sample = scorer.teacher_model, scorer.teacher_params, scorer.sample
  if config.eval.knn.dataset and teacher_params is not None:
    t0 = time.time()
    results["knn"] = report.knn_retention(
        config, teacher_model, teacher_params, student_model, student_params
    )
    results["timing_s"]["knn"] = time.time() - t0
  if teacher_params is not None:
    view = report.eval_view_fidelity(
        config, teacher_model, teacher_params, student_model, student_params
    )
    if view is not None:
      results["eval_view_fidelity"] = view
  if _test_block(config) and teacher_params is not None:
    t0 = time.time()
    results["test"] = _test_photos(
        config, teacher_model, teacher_params, student_model, student_params
    )
    results["timing_s"]["test_photos"] = time.time() - t0
  if any(spec.window or spec.sinks for spec in vit.layer_specs(student_model)):
    images = sample[: config.eval.fidelity_images]
    results["exact_share"] = evaluate.exact_shares(student_model, student_params, images)
  t0 = time.time()
  tb = sample[: config.eval.throughput_batch]
  if len(tb) < config.eval.throughput_batch:
    tb = np.resize(tb, (config.eval.throughput_batch,) + tb.shape[1:])
  results["student_images_per_s"] = evaluate.images_per_second(student_model, student_params, tb)
  if teacher_params is not None:
    results["teacher_images_per_s"] = evaluate.images_per_second(teacher_model, teacher_params, tb)
    results["resolution"] = report.resolution_scaling(
        config,
        scorer.mesh,
        teacher_model,
        teacher_params,
        student_model,
        student_params,
        scorer.labelled,
        sample,
        known={k: results[k] for k in ("teacher_images_per_s", "student_images_per_s")},
    )
    if jax.process_index() == 0 and config.eval.plots:
      report.write_plots(
          config,
          workdir,
          results,
          teacher_model,
          teacher_params,
          student_model,
          student_params,
          sample,
      )
  results["timing_s"]["speed_resolution_plots"] = time.time() - t0


def _test_block(config) -> Any:
  """config.eval.test when it is on (a config recorded before the block existed has none)."""
  test = config.eval.get("test")
  return test if test is not None and test.split else None


def _test_sets(config) -> tuple[list[str], list[str], list[str]]:
  """(test paths, their names, validation paths); a photo in both is a ConfigError: a choice made
  on a test photo would be reported as if it had not been."""
  test_paths, names = sources.photo_paths(config, config.eval.test.split)
  val_paths, _ = sources.photo_paths(config, config.data.eval_split, "data.eval_split")
  shared = sorted(set(test_paths) & set(val_paths))
  if shared:
    raise ConfigError(
        f"config.eval.test.split={config.eval.test.split!r} and data.eval_split="
        f"{config.data.eval_split!r} share {len(shared)} photo(s) (e.g. {shared[0]}): the run "
        "chooses on the eval split; use 'val@F' and 'test@F' (the two halves of holdout@F)"
    )
  return test_paths, names, val_paths


def _test_photos(config, teacher_model, teacher_params, student_model, student_params) -> dict:
  """The student vs its teacher on the test photos (eval.test.split), reported and never chosen
  on: native sizes, intervals, the dense measure, whose parts and probes are fitted on the
  validation photos (data.eval_split, where the run made its choices). photo_eval.py."""
  test = config.eval.test
  test_paths, names, val_paths = _test_sets(config)
  size = config.data.image_size
  out = photo_eval.evaluate_photos(
      teacher_model,
      teacher_params,
      student_model,
      student_params,
      test_paths,
      val_paths,
      pp=pp_spec.inference_pp(config.data.pp_eval),  # its decode and normalisation
      res=int(size[0] if isinstance(size, (tuple, list)) else size),
      factors=tuple(test.factors),
      views=tuple(test.views),
      bootstrap=test.bootstrap,
      dense_k=test.dense_k,
      min_photos=test.min_photos,
      seed=config.seed,
      test_names=names,
  )
  return {"split": test.split, "val_split": config.data.eval_split, **out}
