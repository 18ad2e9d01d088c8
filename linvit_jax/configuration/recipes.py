"""The blocks the shipped configs share, built on the schema (config_lib): the conversion on the
embedded Fashion-MNIST (demo, ablation), the student's linear attention, the labelled pod
conversion (imagenet_vit, jft_vit), and the named choices their options take (normalisations,
augmentations, the distillation lr per surgery policy).
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections as mlc

from linvit_jax.configuration.config_lib import base_config
from linvit_jax.configuration.config_lib import stage

# ------------------------------------------------------------------------------ embedded data

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
FMNIST_PP_TRAIN = (
    "decode(1)|flip_lr|value_range(-1,1)|"
    'onehot(10,key="label",key_result="labels")|keep("image","labels")'
)
FMNIST_PP_EVAL = (
    "decode(1)|value_range(-1,1)|"
    'onehot(10,key="label",key_result="labels")|keep("image","labels")'
)


def fmnist_conversion(
    *, feature_map: str, patch: int = 4, distill_steps: int, finetune_steps: int, tiny: bool = False
) -> mlc.ConfigDict:
  """The conversion recipe on the embedded Fashion-MNIST with a shipped teacher (demo, ablation).

  Distillation: only attention trains, lr 3e-2; fine-tuning: everything, lr 2e-4, labels plus the
  teacher's logits at temperature 2, decoupled weight decay 2e-6 on kernels (big_vision semantics;
  the same per-step decay as optax.adamw's 0.01 at this lr, which the shipped results used). `tiny`: a few steps on a slice of the test split (smoke runs).
  """
  c = base_config()
  c.model.patch_size = (patch, patch)
  c.data.pp_train, c.data.pp_eval = FMNIST_PP_TRAIN, FMNIST_PP_EVAL
  name = "teacher_fmnist_vit.npz" if patch == 4 else f"teacher_fmnist_vit_p{patch}.npz"
  c.teacher.init = os.path.join(ASSETS, name)
  c.student.attention = feature_map
  # lr 3e-2: fresh (copy_same) attention learns from random init; at 3e-3 every seed but the one
  # that shared the teacher's init key stalled near 0.81 attention cosine after 100 steps
  # (docs/distill_stability.md: 50-60 % before fine-tuning, vs 84.1-84.4 % at 3e-2).
  c.distill_attention = stage(
      "distill_attention", steps=distill_steps, batch_size=64, lr=3e-2, warmup_steps=30, wd=0.0
  )
  c.finetune = stage(
      "finetune",
      steps=finetune_steps,
      batch_size=64,
      lr=2e-4,
      warmup_steps=20,
      wd=2e-6,
      w_label=1.0,
      w_logit_kd=1.0,
      kd_temperature=2.0,
  )
  if tiny:
    c.distill_attention.steps = c.finetune.steps = 3
    c.distill_attention.batch_size = c.finetune.batch_size = 16
    c.data.eval_max_examples, c.data.eval_batch_size = 64, 32
    c.eval.fidelity_images, c.eval.throughput_batch, c.eval.curve_examples = 16, 8, 32
    c.data.shuffle_buffer = 256
  return c


# ------------------------------------------------------------------------------ shared blocks

# The input normalisations a config names (norm=): pp ops after the crop.
NORMS = {"imagenet": "vgg_value_range", "minus_one_one": "value_range(-1,1)"}
# Extra training-view augmentation a stage may add (convert_folder's `distill_augment=` /
# `align_augment=`): DINO's colour jitter and random grayscale, views a self-supervised teacher
# was trained on.
AUGMENTS = {"": "", "color": "|color_jitter|random_grayscale"}
# The distillation lr per surgery policy, measured (README, docs/distill_stability.md): fresh
# attention (copy_same) stalls at 3e-3 and below.
DISTILL_LR = {"copy_all": 1e-3, "copy_same": 3e-2}


def linear_attention(feature_map: str, **levers: Any) -> str | dict:
  """The student's `attention` field: the feature map's name, or, when a lever is on, a linear
  spec with attention.AttentionSpec's options inside each linear layer (exact_prefix_rows,
  center_keys, conv_v, window, sinks, num_features; num_features 0: the map's default width)."""
  if "num_features" in levers and not levers["num_features"]:
    del levers["num_features"]
  if not any(levers.values()):
    return feature_map
  return dict(kind="linear", feature_map=feature_map, **levers)


def attention_of(arg: mlc.ConfigDict) -> str | dict:
  """`linear_attention` from a config's own options of the same names (demo, convert_folder):
  feature_map, exact_prefix, center_keys, conv_v, window, sinks and num_features if it has one."""
  return linear_attention(
      arg.feature_map,
      exact_prefix_rows=arg.exact_prefix,
      center_keys=arg.center_keys,
      conv_v=arg.conv_v,
      window=arg.window,
      sinks=arg.sinks,
      num_features=arg.get("num_features", 0),  # hedgehog: its projection's width; favor: its own
  )


def labelled_data(res: int, norm_labels: str, **fields: Any) -> dict:
  """The `data` block of a labelled pod conversion (imagenet_vit, jft_vit): Inception crops and
  flips for training, resize-and-centre-crop for eval (ImageNet's 8/7 ratio), `norm_labels` (the
  normalisation and label ops) after both; `fields` name the dataset, splits and classes."""
  images = f'{norm_labels}|keep("image","labels")'
  return dict(
      image_size=res,
      label_key="labels",
      shuffle_buffer=250_000,
      compose=0.0,
      eval_batch_size=1024,
      pp_train=f"decode_jpeg_and_inception_crop({res})|flip_lr|{images}",
      pp_eval=f"decode|resize_small({res * 8 // 7})|central_crop({res})|{images}",
      **fields,
  )


def labelled_conversion(arg: mlc.ConfigDict, *, data: dict, finetune: dict) -> mlc.ConfigDict:
  """A big ViT converted on a labelled set on TPU pods (imagenet_vit, jft_vit): the `data` block,
  the teacher from `arg.init` (its architecture read from it unless `arg.variant` describes it),
  `head=fresh` leaving its head out, attention distillation, then a fine-tune with `finetune`'s
  losses and schedule. `arg` holds the options both configs share (variant, pool, posemb,
  rep_size, init, head, feature_map, policy, lr_distill, distill_steps, finetune_steps, batch,
  fsdp)."""
  c = base_config()
  c.mesh = (("data", -1), ("fsdp", arg.fsdp))
  c.data = data
  c.model = dict(c.model.to_dict(), num_classes=data["num_classes"], pool_type=arg.pool)
  if arg.variant:  # the architecture described here, not read from the checkpoint
    c.model.update(variant=arg.variant, posemb=arg.posemb, rep_size=arg.rep_size)
  else:
    c.teacher.architecture = "init"
  c.teacher.init = arg.init
  if arg.head == "fresh":
    c.teacher.dont_load = c.student.dont_load = ("head/.*",)
  c.student.attention = arg.feature_map
  c.surgery.policy = arg.policy
  c.distill.routing_queries = 64
  c.distill_attention = stage(
      "distill_attention",
      steps=arg.distill_steps,
      batch_size=arg.batch,
      lr=arg.lr_distill or DISTILL_LR.get(arg.policy, 1e-3),
      warmup_steps=arg.distill_steps // 20,
      wd=0.0,
      grad_clip=1.0,
  )
  c.finetune = stage(
      "finetune", steps=arg.finetune_steps, batch_size=arg.batch, lr=1e-4, wd=1e-4, **finetune
  )
  for name in ("distill_attention", "finetune"):
    c[name].checkpoint_every = 1000
    c[name].log_every = 50
  return c
