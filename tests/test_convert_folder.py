"""configs/convert_folder.py end to end at a tiny size: a headless checkpoint, a folder of photos,
no labels anywhere; and the architecture inference on real checkpoints."""

import json
import os

import jax
import numpy as np
import pytest

from linvit_jax import build
from linvit_jax.models import checkpoints
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime.errors import ConfigError
from tests.helpers import real_dinov2
from tests.helpers import tiny_teacher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = real_dinov2.PATH
TINY = tiny_teacher.TINY
_headless_checkpoint = tiny_teacher.headless_checkpoint
_photos = tiny_teacher.smooth_photos
_config = tiny_teacher.convert_folder_config


def test_infer_vit_config_reads_architecture(tmp_path):
  path = str(tmp_path / "gap.npz")
  _headless_checkpoint(path, pool_type="gap", posemb="sincos2d", depth=3, num_classes=5)
  arch = vit_checkpoint.infer_vit_config(path)
  assert arch["depth"] == 3 and arch["width"] == 32 and arch["num_heads"] == 2
  assert arch["patch_size"] == (8, 8) and arch["mlp_dim"] == 64
  assert arch["pool_type"] == "gap" and arch["posemb"] == "sincos2d"
  assert arch["num_classes"] == 5 and arch["rep_size"] is False


def test_infer_vit_config_big_vision_fixture():
  arch = vit_checkpoint.infer_vit_config(
      os.path.join(ROOT, "tests", "data", "vit_w192_d4_p16_i64_tok_learn.npz")
  )
  with open(os.path.join(ROOT, "tests", "data", "vit_w192_d4_p16_i64_tok_learn.json")) as f:
    meta = json.load(f)
  cfg = meta["model_config"] if "model_config" in meta else meta["config"]
  assert arch["width"] == cfg["width"] and arch["depth"] == cfg["depth"]
  assert arch["pool_type"] == "tok" and arch["posemb"] == "learn"


def test_infer_vit_config_rejects_non_vit(tmp_path):
  path = str(tmp_path / "x.npz")
  np.savez(path, **{"foo/kernel": np.zeros((3, 3))})
  with pytest.raises(checkpoints.CheckpointError, match="embedding/kernel"):
    vit_checkpoint.infer_vit_config(path)


@pytest.mark.skipif(not os.path.exists(REAL + ".npz"), reason="shared real fixture missing")
def test_real_vit_s14_inferred_and_matches_reference():
  """The shared DINOv2-style ViT-S/14: inferred config + exact GELU reproduce big_vision's outputs."""
  arch = vit_checkpoint.infer_vit_config(REAL + ".npz")
  # The JSON beside the npz says how inputs are normalised (ImageNet mean/std).
  assert arch.pop("preprocessing")["mean"] == [0.485, 0.456, 0.406]
  assert arch == dict(real_dinov2.FIELDS, reg_tokens=0, rep_size=False, posemb_grid=(16, 16))
  kw = {k: v for k, v in arch.items() if k != "posemb_grid"}
  model = vit.Model(**kw, gelu_approximate=False)
  ref = np.load(REAL + ".ref.npz")
  images = ref["images_nhwc"][:2]
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  params = vit.load(shapes, REAL + ".npz", kw)
  _, out = jax.jit(model.apply)({"params": params}, images)
  np.testing.assert_allclose(out["encoded"], ref["bv_encoded_exact_gelu"][:2], atol=2e-3)


def test_convert_folder_rejects_bad_args(tmp_path):
  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  with pytest.raises(ValueError, match="gelu"):
    _config(path, str(tmp_path), ",gelu=erf")
  with pytest.raises(ValueError, match="norm"):
    _config(path, str(tmp_path), ",norm=zero_one")
  config = _config(path, str(tmp_path), ",pool=gap")  # reads no checkpoint: the driver does
  with pytest.raises(ConfigError, match="pool_type='gap': the checkpoint's pool type is 'tok'"):
    build.resolve_from_init(config)  # a cls-token checkpoint is 'tok'


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
  from linvit_jax import run as run_lib

  tmp = tmp_path_factory.mktemp("convert")
  ckpt = str(tmp / "teacher.npz")
  teacher_params = _headless_checkpoint(ckpt)
  _photos(str(tmp / "photos"))
  config = _config(
      ckpt,
      str(tmp / "photos"),
      ",softmax_layers=1,softmax_pick=sensitivity_worst,softmax_pick_images=eval_view,"
      "softmax_key_grid=0.5x,align_augment=color,"
      "align_mixup=1",
  )
  workdir = str(tmp / "work")
  real_iter_fn = build.train_iter_fn

  def recording_iter_fn(config, batch_size, seed, pp="", mixup=0.0):
    STAGE_PPS.append(pp)
    STAGE_MIXUPS.append(mixup)
    return real_iter_fn(config, batch_size, seed, pp=pp, mixup=mixup)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(build, "train_iter_fn", recording_iter_fn)
    results = run_lib.run(config, workdir)
  return config, workdir, results, teacher_params


STAGE_PPS = []  # the pp string each stage of folder_run's run asked its training stream for
STAGE_MIXUPS = []  # and the mixup concentration


def test_a_stage_trains_on_its_own_pp_string(folder_run, tmp_path):
  config, *_ = folder_run
  assert config.distill_attention.pp_train == ""  # the data block's views
  assert "color_jitter|random_grayscale" in config.align.pp_train
  assert "color_jitter" not in config.data.pp_train + config.eval.sample_pp  # fidelity: plain
  # What the run asked for: the data block's views for distillation, the align stage's own
  # (with init_norm resolved from the checkpoint, as the data block's is).
  assert len(STAGE_PPS) == 2 and STAGE_PPS[0] == ""
  assert "color_jitter|random_grayscale|vgg_value_range" in STAGE_PPS[1]
  assert STAGE_MIXUPS == [0.0, 1.0]  # align_mixup reached only the align stage's stream
  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  with pytest.raises(ValueError, match="align_augment='sepia'"):
    _config(path, str(tmp_path), ",align_augment=sepia")
  both = _config(path, str(tmp_path), ",distill_augment=color")
  assert "color_jitter" in both.distill_attention.pp_train and both.align.pp_train == ""
  mixed = _config(path, str(tmp_path), ",distill_mixup=0.2")
  assert (mixed.distill_attention.mixup, mixed.align.mixup) == (0.2, 1.0)  # align's default
  assert _config(path, str(tmp_path), ",align_mixup=0").align.mixup == 0.0
  with pytest.raises(ValueError, match=r"align_mixup=1.0 blends images within a batch: batch=1"):
    _config(path, str(tmp_path), ",batch=1")
  for bad in ("-1", "nan"):
    with pytest.raises(ValueError, match=rf"align_mixup={bad}.*: a Beta concentration"):
      _config(path, str(tmp_path), f",align_mixup={bad}")


def test_convert_folder_headless_end_to_end(folder_run):
  config, workdir, results, _ = folder_run
  assert config.teacher.architecture == "init"  # the config read no checkpoint; the run did:
  assert (
      results["config"]["model"]["num_classes"] is None
      and results["config"]["model"]["width"] == 32
  )
  assert config.stages == ("distill_attention", "align")
  assert results["labelled"] is False and results["student_top1"] is None
  for name in (
      "student.npz",
      "student_config.json",
      "results.json",
      "fidelity.png",
      "fidelity_curves.png",
      "attention_maps.png",
  ):
    assert os.path.exists(os.path.join(workdir, name)), name
  for tag in ("converted", "after_distill_attention", "after_align"):
    e2e = results[f"end_to_end_{tag}"]
    assert 0 < e2e["cls_cosine"] <= 1.0001 and 0 < e2e["patch_cosine"] <= 1.0001
    assert len(e2e["block_cosine"]) == 2
  # copy_all starts from the teacher's attention weights: closer than chance at once.
  assert results["end_to_end_converted"]["cls_cosine"] > 0.3
  # curves vs images seen: eval rows in both stages, images counted across stages
  rows = [r for h in results["histories"].values() for r in h if "eval/cls_cosine" in r]
  assert len(rows) >= 2 and rows[-1]["images_seen"] == results["images_seen"] == 16
  # resolution rows: fidelity, speed and memory for teacher and student at 1x and 2x
  assert [r["image_size"] for r in results["resolution"]] == [32, 64]
  for r in results["resolution"]:
    assert r["student_peak_bytes"] > 0 and r["teacher_images_per_s"] > 0 and "cls_cosine" in r
  # beside the random views: the held-out photos as encode() sees them, one central crop each,
  # in results, the export's config and its card
  from linvit_jax.data import image_folder

  files = sorted(os.listdir(config.data.data_dir))
  held = len(image_folder.split_files(files, "val@0.2"))  # the validation half of the holdout
  view = results["eval_view_fidelity"]
  assert (
      view["images"] == min(held, config.eval.fidelity_images) and 0 < view["cls_cosine"] <= 1.0001
  )
  assert view["patch_cosine_min_image"] <= view["patch_cosine"] <= 1.0001
  with open(os.path.join(workdir, "student_config.json")) as f:
    assert json.load(f)["fidelity"]["eval_view"] == view
  with open(os.path.join(workdir, "README.md")) as f:
    card = f.read()
  assert "as `encode` sees them" in card
  # the test photos (the other half of the holdout): reported at 1x and 2x from the original
  # photos, with intervals and the dense measure; too few of them is said, not hidden
  test = results["test"]
  assert (
      (test["split"], test["val_split"])
      == ("test@0.2", "val@0.2")
      == (
          config.eval.test.split,
          config.data.eval_split,
      )
  )
  n_test = len(image_folder.split_files(files, "test@0.2"))
  assert (test["n_test"], test["n_val"]) == (n_test, held) and n_test >= 1
  assert test["too_few"].startswith(f"test set: {n_test} photo")
  assert [(r["size"], r["view"]) for r in test["rows"]] == [
      (32, "whole"),
      (32, "crop"),
      (64, "whole"),
      (64, "crop"),
  ]
  for r in test["rows"]:
    c = r["patch_cosine"]
    assert 0 < c["lo"] <= c["mean"] <= c["hi"] <= 1.0001 and c["n"] == n_test
    assert 0 <= r["dense"]["drop_in"]["mean"] <= 1
  assert "## On test photos" in card and "| 64 px | crop |" in card
  # crop retrieval at 32 px (absent, with its reason, below 2 test photos): results and card
  retrieval = test["crop_retrieval"]
  if n_test >= 2:
    assert retrieval["n_queries"] == 8 * n_test and retrieval["size"] == 32
    assert 0 <= retrieval["student_top1"]["mean"] <= 1
  else:
    assert retrieval["absent"].endswith("retrieval needs at least 2")
  assert "Crop retrieval" in card


def test_convert_folder_hybrid_export_round_trips(folder_run):
  config, workdir, results, teacher_params = folder_run
  assert len(results["softmax_layers"]) == 1
  # picked by sensitivity: the layer whose softmax alone brought the student closest (on the
  # quarter of the held-out photos' centre views, pp_eval, the student is furthest on)
  gains = results["softmax_layers_fix_gains"]
  assert len(gains) == 2 and results["softmax_layers"] == [int(np.argmax(gains))]
  from linvit_jax.artifacts import export_format

  with open(os.path.join(workdir, "student_config.json")) as f:
    student_cfg = export_format.model_fields(json.load(f))
  attention = student_cfg["attention"]
  assert isinstance(attention, list) and len(attention) == 2
  # its softmax layer pools the 4×4 grid's keys to 2×2 (softmax_key_grid=0.5x: half the training
  # grid, resolved in patches before export), in training too
  assert attention[results["softmax_layers"][0]]["key_grid"] == 2
  assert attention[results["softmax_layers"][0]]["kind"] == "softmax"
  model = vit.Model(**student_cfg)
  images = np.random.RandomState(0).randn(2, 32, 32, 3).astype(np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  params = vit.load(shapes, os.path.join(workdir, "student.npz"), student_cfg)
  out = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x)[0])(params, images))
  assert np.all(np.isfinite(out)) and out.shape == (2, 32)


def test_convert_folder_resumes_finished_run(folder_run):
  from linvit_jax import run as run_lib

  config, workdir, results, _ = folder_run
  config = config.copy_and_resolve_references()
  config.eval.plots, config.eval.resolution_factors = False, [1]  # reporting only, not identity
  again = run_lib.run(config, workdir)  # every stage is checkpointed as finished: nothing retrains
  np.testing.assert_allclose(
      again["student_logits_sample"], results["student_logits_sample"], rtol=1e-5, atol=1e-6
  )
  assert again["softmax_layers"] == results["softmax_layers"]


def test_convert_folder_data_errors_are_one_line(tmp_path):
  """A missing folder fails at config time; an empty one as a ConfigError naming it."""
  from linvit_jax import run as run_lib

  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  with pytest.raises(ValueError, match="is not a folder"):
    _config(path, str(tmp_path / "nowhere"))
  empty = tmp_path / "empty"
  empty.mkdir()
  config = _config(path, str(empty))
  with pytest.raises(ConfigError, match="no image files in"):
    run_lib.run(config, str(tmp_path / "work"))
  # test photos that the run also chooses on: refused before any training
  _photos(str(tmp_path / "photos"))
  config = _config(path, str(tmp_path / "photos"))
  config.eval.test.split = "holdout@0.2"
  with pytest.raises(ConfigError, match=r"share 1 photo\(s\).*use 'val@F' and 'test@F'"):
    run_lib.run(config, str(tmp_path / "work2"))
  assert not os.path.exists(tmp_path / "work2" / "config.json")


def test_convert_folder_sinks_and_routing_only_distillation(tmp_path):
  """`sinks=` makes every layer an exact-set hybrid (its share reported per layer), and
  `distill_trainable=attention_routing` leaves v and out exactly the teacher's while q/k train."""
  from linvit_jax import run as run_lib

  ckpt = str(tmp_path / "teacher.npz")
  teacher = _headless_checkpoint(ckpt)
  _photos(str(tmp_path / "photos"), n=6)
  extra = ",sinks=2,distill_trainable=attention_routing,knn=none,softmax_layers=0"
  config = _config(ckpt, str(tmp_path / "photos"), extra)
  config.stages = ("distill_attention",)  # tiny adds an align stage, which trains v/out
  config.eval.plots, config.eval.resolution_factors = False, [1]
  assert config.distill_attention.trainable == "attention_routing"
  results = run_lib.run(config, str(tmp_path / "work"))
  shares = results["exact_share"]
  assert len(shares) == 2 and all(0.0 < s < 1.0 for s in shares), shares
  student = np.load(str(tmp_path / "work" / "student.npz"))
  attn = "Transformer/encoderblock_1/MultiHeadDotProductAttention_0"
  t_attn = teacher["Transformer"]["encoderblock_1"]["MultiHeadDotProductAttention_0"]
  for name in ("value", "out"):
    np.testing.assert_array_equal(student[f"{attn}/{name}/kernel"], t_attn[name]["kernel"])
  assert not np.array_equal(student[f"{attn}/query/kernel"], t_attn["query"]["kernel"])
  assert f"{attn}/sinks/logit" in student.files


def test_convert_folder_align_options_reach_the_stage(tmp_path):
  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  extra = (
      ",tiny=False,max_images=400,distill_fraction=0.5,align_trainable=all,lr_align=3e-4"
      ",align_update_scale=param_rms,align_warmup=0.25,align_w_feature=4,align_top_weight=3"
      ",align_w_blocks=0.5,align_w_attn_tf=2,align_ema=0.99"
  )
  config = _config(path, str(tmp_path), extra)
  assert config.stages == ("distill_attention", "align")
  a = config.align
  assert (a.steps, a.optimizer.warmup_steps, a.optimizer.lr) == (50, 12, 3e-4)
  assert a.optimizer.update_scale == "param_rms" and a.trainable == "all"
  assert (a.w_feature, a.blocks_top_weight, a.w_blocks, a.w_attn_tf) == (4.0, 3.0, 0.5, 2.0)
  assert a.w_structure == 0.0  # off unless asked: the field at its off value
  structured = _config(path, str(tmp_path), extra + ",align_w_structure=2")
  assert structured.align.w_structure == 2.0
  from linvit_jax import preflight

  for name in structured.stages:  # the run's own check accepts the field it asked for
    preflight.check_stage_fields(name, structured[name])
  from linvit_jax.conversion import optim

  assert optim.optimizer_settings(config.distill_attention.optimizer)["update_scale"] == "absolute"
  assert a.optimizer.ema_decay == 0.99
  assert a.start_weight == 0.0 and config.distill_attention.start_weight == 0.0  # the default
  assert _config(path, str(tmp_path), extra + ",align_start_weight=0.5").align.start_weight == 0.5
  with pytest.raises(ValueError, match="align_start_weight=1.0"):
    _config(path, str(tmp_path), ",align_start_weight=1.0")
  assert optim.optimizer_settings(config.distill_attention.optimizer)["ema_decay"] == 0.0
  # off: the field at its off value (workdirs recorded without it resume: test_preflight)
  assert _config(path, str(tmp_path), ",distill_fraction=0.5").align.optimizer.ema_decay == 0.0
  with pytest.raises(ValueError, match="align_ema=1.0"):
    _config(path, str(tmp_path), ",align_ema=1.0")
  tail = _config(path, str(tmp_path), ",distill_fraction=0.5,align_average=0.5").align.optimizer
  assert tail.average_last == 0.5 and tail.ema_decay == 0.0
  assert _config(path, str(tmp_path), ",distill_fraction=0.5").align.optimizer.average_last == 0.0
  with pytest.raises(ValueError, match="align_average=1.5"):
    _config(path, str(tmp_path), ",align_average=1.5")
  with pytest.raises(ValueError, match="choose one"):
    _config(path, str(tmp_path), ",align_average=0.5,align_ema=0.9")
  full = _config(path, str(tmp_path), ",distill_fraction=0.5").align.optimizer  # the default
  assert full.lora_rank == 0 and optim.optimizer_settings(full)["update_scale"] == "param_rms"
  assert _config(path, str(tmp_path), ",align_lora=16").align.optimizer.lora_rank == 16
  assert _config(path, str(tmp_path), ",align_lora=8").align.optimizer.lora_rank == 8
  # no align stage (the whole budget distils): the align_* fields, the rank too, have no stage
  no_align = _config(path, str(tmp_path), ",tiny=False,max_images=400,distill_fraction=1")
  assert (
      no_align.stages == ("distill_attention",)
      and no_align.distill_attention.optimizer.lora_rank == 0
  )
  for bad in ("-1", "2.5"):
    with pytest.raises(ValueError, match="align_lora="):
      _config(path, str(tmp_path), f",align_lora={bad}")


def test_convert_folder_num_features_reaches_the_spec(tmp_path):
  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  attention = _config(path, str(tmp_path), ",num_features=16").student.attention
  assert attention.feature_map == "hedgehog_exp" and attention.num_features == 16
  assert "num_features" not in _config(path, str(tmp_path)).student.attention  # the map's default


def test_a_workdir_of_the_previous_default_is_refused_then_finished_with_its_settings(tmp_path):
  """A run begun under the default before rank-8 LoRA (full rank handing on the midpoint, with the
  teacher-forced term) is refused naming the two fields that differ, and docs/recipe.md's options
  make it the same run again. The later defaults' own workdirs: test_config_files, against the
  configs those defaults wrote."""
  from linvit_jax import preflight

  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  previous = ",distill_fraction=0.5,align_start_weight=0.5,align_w_attn_tf=1"
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "config.json").write_text(_config(path, str(tmp_path), previous).to_json_best_effort())
  with pytest.raises(ConfigError, match="holds a run of another config") as e:
    preflight.check_same_run(str(workdir), _config(path, str(tmp_path), ",distill_fraction=0.5"))
  message = str(e.value)
  assert "align.start_weight" in message and "align.w_attn_tf" in message, message
  assert "align.optimizer.lora_rank" not in message and message.count(" there, ") == 2, message
  preflight.check_same_run(str(workdir), _config(path, str(tmp_path), previous))


def test_eval_folder_validates_and_tests_on_the_other_photos(tmp_path):
  """eval_folder=: validation and test are the two halves of that folder (val@1 / test@1) and
  nothing of it trains; the training folder keeps its holdout unseen; bad folders are one line."""
  from linvit_jax import report

  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  _photos(str(tmp_path / "train"), n=6)
  _photos(str(tmp_path / "cross"), n=10, seed=1)
  config = _config(path, str(tmp_path / "train"), f",eval_folder={tmp_path / 'cross'}")
  assert config.data.eval_dataset == f"image_folder:{tmp_path / 'cross'}"
  assert (config.data.train_split, config.data.eval_split) == ("train@0.2", "val@1")
  assert config.eval.test.split == "test@1"
  test_paths, _, val_paths = report.test_sets(config)
  assert not set(test_paths) & set(val_paths) and len(test_paths) + len(val_paths) == 10
  assert all(p.startswith(str(tmp_path / "cross")) for p in test_paths + val_paths)
  with pytest.raises(ValueError, match="eval_folder='/nowhere' is not a folder"):
    _config(path, str(tmp_path / "train"), ",eval_folder=/nowhere")
  with pytest.raises(ValueError, match="eval_folder= is the training folder"):
    _config(path, str(tmp_path / "train"), f",eval_folder={tmp_path / 'train'}/")
