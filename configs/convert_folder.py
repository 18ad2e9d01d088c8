r"""Convert any ViT checkpoint to linear attention on a folder of images, label-free.

  python -m linvit_jax.main \
    --config configs/convert_folder.py:init=/path/vit.npz,images=/path/photos,res=224,gelu=exact,norm=imagenet \
    --workdir workdirs/convert
  python -m linvit_jax.main \
    --config configs/convert_folder.py:init=/path/dinov2-small,images=/path/photos \
    --workdir workdirs/convert_dinov2

`init` is a big_vision .npz, or a Hugging Face / timm model folder or .safetensors file
(DINOv2 with or without registers, ViT/DeiT, SigLIP vision towers, timm ViTs: see
`linvit_jax.models.foreign`). `init` alone decides the architecture: width, depth, heads, MLP,
patch, pool type, position embedding, registers, head or none are read from the checkpoint
by the driver when the run starts (`teacher.architecture="init"`: this file reads no checkpoint, so
printing or checking the config needs none); a 'gap' / '0' / 'none' pool stores nothing that tells
them apart, so `pool=` can say which (default 'gap' when there is no cls token). Two things a big_vision
npz cannot tell: `gelu=exact|tanh` (big_vision trains with tanh; DINOv2-style models with the exact
erf) and `norm=imagenet|minus_one_one|source` (input normalisation: ImageNet mean/std, big_vision's
[-1, 1], or the source's own mean/std). Left empty (the default), both come from the source's
config (config.json / preprocessor_config.json, or the JSON import_weights writes beside an npz)
and, where it says nothing, are exact and imagenet.

`images` is a folder of jpg/png photos (recursive; sub-folders are not needed: no label is read).
A stable hash of each file's path holds out `holdout` of them (default 20 %, at least one file);
fidelity is only ever measured on crops of held-out photos. The recipe (see README, "Real
pretrained ViTs"):

  1. surgery `policy` (default copy_all: the teacher's q/k/v/out start the linear attention; the
     seed paper's copy_same keeps them fresh) → out-projection calibration when fresh;
  2. distill_attention: teacher-forced attention-output matching + routing loss, attention params
     only, on `distill_fraction` of the `max_images` budget (default 0.6);
  3. optional hybrid: the `softmax_layers` layers that linearize worst (teacher-forced cosine on
     held-out crops) go back to softmax with the teacher's weights;
  4. align (when distill_fraction < 1, the default): the student's own forward matched to the
     teacher's block by block and at the final tokens, plus the teacher-forced term, on the rest
     of the budget, on label-free mixup views (`align_mixup=1`: each crop blended with its batch
     neighbour, weight ~ Beta(1, 1), the teacher and the student seeing the same blend, as in
     big_vision's function-matching distillation); every kernel moves within a rank-8 update
     (`align_lora=8`, LoRA as in LoLCATs' stage 2, written as an optimizer transformation so the
     params stay merged), biases, norms and embeddings as usual, Adam steps relative to each
     output column's RMS (`align_update_scale=param_rms`, lr 2e-4), a quarter of the stage
     warm-up; the stage hands on its trained weights (`align_start_weight=0`). On the shared
     ViT-S/14 at 224 px (6,000 + 4,000 images, seeds 0 / 1): cls 0.950 / 0.953, patch 0.958 /
     0.966, k-NN 100 / 102 %, 448 px 0.919 / 0.916 (seed 0 against 0.943 / 0.953 / 98.5 % /
     0.910, one seed, for full-rank `align` handing on the midpoint of its trained weights and
     the distilled ones: `align_lora=0,align_start_weight=0.5`, the default before; weight
     interpolation as in WiSE-FT); full-rank `align` handing on its trained weights loses 224-px
     fidelity (cls 0.917 → 0.912: it starts to fit the photos); at lr ≥ 2e-5 in parameter units
     the stage is unstable (docs/levers.md);
  5. fidelity report (per layer, end to end, curves vs images seen, cls attention maps), speed and
     memory at res and 2·res, export (student.npz + student_config.json).

Downstream check (in every report unless `knn=`): weighted k-NN top-1 (DINO's protocol: k 20,
cosine, votes exp(sim / 0.07)) on the final pooled feature, teacher vs student, and the retention
ratio, on `knn=` a labelled set: the embedded Fashion-MNIST upsampled to `res` (default,
`fashion_mnist_local`), a TFDS name (`knn_data_dir=`), or `image_folder:<DIR>` with one sub-folder
per class (`knn_train` / `knn_eval` images of each split: its `train@H` / `holdout@H` path-hash
split, H = `holdout`); `knn=none` turns it off. The same images give the teacher/student cosine of
the pooled feature (mean, worst) beside it: a fidelity sample of every unseen image of that set.

Levers inside each linear layer (attention.AttentionSpec options): `center_keys` (on: keys
centred per image and head before φ: softmax ignores a shift shared by all keys, a feature map
does not), `conv_v` (on: a zero-initialised depthwise 3×3 convolution of v over the patch grid),
`exact_prefix` (off: the cls and register queries get exact softmax over all keys, O(N)),
`window` (0, off; w odd: exact softmax over each patch's w×w neighbourhood and the cls/register
keys, linear attention over the rest, one normaliser, a learned per-head gate; O(N·w²)),
`sinks` (0, off; m > 0: the cls/register keys and the m patch keys of largest norm per image and
head are exact for every query, under the same gate; O(N·m)). The
defaults are the best measured (docs/levers.md): on the shared ViT-S/14 at 224 px, 6,000 images,
final cls / patch cosine 0.917 / 0.930 against 0.882 / 0.889 without them at 10,000.

Args: init, images, res, gelu, norm, feature_map (hedgehog_exp | hedgehog | elu1 | relu | favor),
num_features (0: the map's default; hedgehog maps: the per-head projection width, 2× features),
exact_prefix, center_keys, conv_v, window, sinks, compose (a fraction of each training batch made
2×2 mosaics of four of its photos' crops; 0: off),
knn, knn_data_dir, knn_train, knn_eval, max_images,
distill_fraction, policy, softmax_layers, pool (gap | 0 | none, only without a cls token), batch,
lr_distill, distill_trainable (distill_attention | attention_routing: v/out frozen |
attention_features: q/k frozen | a path regex), lr_align, align_trainable (attention | all | a
path regex), align_update_scale (absolute | param_rms: lr_align is then a step relative to each
output column's RMS), align_warmup (fraction of the align steps), align_ema (0: off; a decay:
the stage hands on the moving average of its params), align_average (0: off; a fraction f: the
stage hands on the uniform average of its params over its last f of steps), align_start_weight
(w, default 0: the stage hands on (1 − w)·its trained params + w·the distilled ones it started
from; 0.5 was the best measured for full-rank `align`),
align_lora (r > 0, default 8: every trained kernel moves within a rank-r update, LoRA as in
LoLCATs' stage 2, column-scaled under param_rms; biases, norms and embeddings step as usual; 0:
full-rank steps; ignored, like every align_* field, when distill_fraction=1 leaves no align stage),
align_w_feature (final tokens),
align_w_blocks (every block's output), align_top_weight (the last block's weight over the
first), align_w_attn_tf (teacher-forced attention outputs), distill_augment / align_augment
("" | color: DINO's colour jitter and random grayscale on that stage's training views; fidelity
is still measured on plain crops), distill_mixup / align_mixup (p > 0: each of that stage's
training views blended with its batch neighbour, weight ~ Beta(p, p): label-free mixup, the
teacher and the student seeing the same blend; 0: off; align's default 1, distillation's 0:
on the shared ViT-S/14 mixup in the distillation lowered the final cls 0.943 → 0.928),
holdout, eval_images,
tiny (a few steps, for the tests).
"""

import math
import os

from linvit_jax import config_lib

NORMS = {"imagenet": "vgg_value_range", "minus_one_one": "value_range(-1,1)"}
# Extra training-view augmentation a stage may add (`distill_augment=` / `align_augment=`): DINO's
# colour jitter and random grayscale, views a self-supervised teacher was trained on.
AUGMENTS = {"": "", "color": "|color_jitter|random_grayscale"}


def train_pp(res: int, norm: str, augment: str) -> str:
  """The training views: Inception crops of the photos, flipped, with `augment`'s extra ops."""
  return f'decode|inception_crop({res})|flip_lr{AUGMENTS[augment]}|{norm}|keep("image")'


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg,
      init="",
      images="",
      res=224,
      gelu="",
      norm="",
      feature_map="hedgehog_exp",
      num_features=0,
      max_images=10_000,
      distill_fraction=0.6,
      policy="copy_all",
      softmax_layers=0,
      pool="",
      batch=8,
      lr_distill=1e-3,
      distill_trainable="distill_attention",
      lr_align=config_lib.ALIGN_RECIPE["lr"],
      align_trainable=config_lib.ALIGN_RECIPE["trainable"],
      align_update_scale=config_lib.ALIGN_RECIPE["update_scale"],
      align_warmup=config_lib.ALIGN_RECIPE["warmup"],
      align_ema=0.0,
      align_average=0.0,
      align_start_weight=0.0,
      align_lora=8,
      align_w_feature=1.0,
      align_w_blocks=1.0,
      align_top_weight=1.0,
      align_w_attn_tf=1.0,
      distill_augment="",
      align_augment="",
      distill_mixup=0.0,
      align_mixup=1.0,
      holdout=0.2,
      eval_images=32,
      exact_prefix=False,
      center_keys=True,
      conv_v=True,
      window=0,
      sinks=0,
      compose=0.0,
      knn="fashion_mnist_local",
      knn_data_dir="",
      knn_train=1000,
      knn_eval=500,
      tiny=False,
  )
  if not arg.init:
    raise ValueError("convert_folder needs init=<big_vision .npz checkpoint>")
  if not arg.images:
    raise ValueError("convert_folder needs images=<folder of jpg/png photos>")
  if arg.gelu not in ("", "exact", "tanh"):
    raise ValueError(f"gelu={arg.gelu!r}: expected exact or tanh (or empty: from the source)")
  if arg.norm not in ("", "source", *NORMS):
    raise ValueError(f"norm={arg.norm!r}: expected one of {sorted(NORMS) + ['source']}")
  if not 0 < arg.distill_fraction <= 1:
    raise ValueError(f"distill_fraction={arg.distill_fraction}: expected in (0, 1]")
  for field in ("align_start_weight", "align_ema"):
    if not 0 <= arg[field] < 1:
      raise ValueError(f"{field}={arg[field]}: expected in [0, 1) (0: off)")
  if isinstance(arg.align_lora, bool) or not isinstance(arg.align_lora, int) or arg.align_lora < 0:
    raise ValueError(f"align_lora={arg.align_lora!r}: expected a rank >= 0 (0: off)")
  if not 0 <= arg.align_average <= 1:
    raise ValueError(f"align_average={arg.align_average}: expected in [0, 1] (0: off)")
  if arg.align_average and arg.align_ema:
    raise ValueError("align_average and align_ema are two averages: choose one (the other 0)")
  for field in ("distill_mixup", "align_mixup"):
    if not (math.isfinite(arg[field]) and arg[field] >= 0):
      raise ValueError(f"{field}={arg[field]}: a Beta concentration, expected >= 0 (0: off)")
    if arg[field] and arg.batch < 2:
      raise ValueError(
          f"{field}={arg[field]} blends images within a batch: batch={arg.batch} (set {field}=0)"
      )
  for field in ("distill_augment", "align_augment"):
    if arg[field] not in AUGMENTS:
      raise ValueError(f"{field}={arg[field]!r}: expected one of {sorted(AUGMENTS)}")
  if "://" not in arg.images and not os.path.isdir(arg.images):
    raise ValueError(f"images={arg.images!r} is not a folder")
  # The architecture, and the input normalisation a source declares, are read from `init` by the
  # driver (teacher.architecture="init", the pp op `init_norm`): this file reads no checkpoint.
  if arg.norm in NORMS:
    norm = NORMS[arg.norm]
  else:  # "": the source's mean/std, else ImageNet's; "source": the source's, or an error
    norm = "init_norm(required=True)" if arg.norm == "source" else "init_norm"

  c = config_lib.base_config()
  res = arg.res
  split = f"@{arg.holdout}"
  c.data = dict(
      dataset="image_folder",
      data_dir=arg.images,
      train_split="train" + split,
      eval_split="holdout" + split,
      eval_dataset="",
      image_size=res,
      num_classes=0,
      label_key="labels",
      shuffle_buffer=1000,
      compose=arg.compose,
      eval_batch_size=8,
      eval_max_examples=0,
      pp_train=train_pp(res, norm, ""),
      pp_eval=f'decode|resize_small({res * 8 // 7})|central_crop({res})|{norm}|keep("image")',
  )
  # Width, depth, heads, MLP, patch, position embedding, registers, classes, and where the source
  # declares them the GELU form and LayerNorm epsilon: from init. What a big_vision npz cannot say
  # stays as set here: the pool type without a cls token or MAP head (pool=, default 'gap') and
  # the GELU form (gelu=, else the source's, else exact).
  c.model = dict(
      c.model.to_dict(),
      variant="",
      pool_type=arg.pool or "gap",
      gelu_approximate=arg.gelu == "tanh",
      scan=False,
  )
  c.teacher.architecture = "init"
  c.teacher.config_fields = tuple(
      name for name, given in (("gelu_approximate", arg.gelu), ("pool_type", arg.pool)) if given
  )
  c.teacher.init = arg.init
  levers = dict(
      exact_prefix_rows=arg.exact_prefix,
      center_keys=arg.center_keys,
      conv_v=arg.conv_v,
      window=arg.window,
      sinks=arg.sinks,
  )
  if arg.num_features:  # the feature map's width (hedgehog: its projection; favor: features)
    levers["num_features"] = arg.num_features
  student = c.student.to_dict()
  student["attention"] = arg.feature_map
  if any(levers.values()):  # attention.AttentionSpec's options inside each linear layer
    student["attention"] = dict(kind="linear", feature_map=arg.feature_map, **levers)
  c.student = student
  c.student.softmax_layers = arg.softmax_layers
  c.surgery.policy = arg.policy

  distill_images = int(arg.max_images * arg.distill_fraction)
  align_images = arg.max_images - distill_images
  steps_a, steps_b = max(1, distill_images // arg.batch), align_images // arg.batch
  if arg.tiny:
    steps_a, steps_b = 2, 2
  c.distill_attention = config_lib.stage(
      "distill_attention",
      steps=steps_a,
      batch_size=arg.batch,
      lr=arg.lr_distill,
      warmup_steps=max(1, steps_a // 20),
      wd=0.0,
      grad_clip=1.0,
      trainable=arg.distill_trainable,
      pp_train=train_pp(res, norm, arg.distill_augment) if arg.distill_augment else "",
      mixup=arg.distill_mixup,
  )
  c.stages = ("distill_attention",)
  if steps_b:
    c.align = config_lib.stage(
        "align",
        steps=steps_b,
        batch_size=arg.batch,
        lr=arg.lr_align,
        warmup_steps=max(1, int(steps_b * arg.align_warmup)),
        wd=0.0,
        grad_clip=1.0,
        update_scale=arg.align_update_scale,
        # only when on: runs recorded before the field existed keep resuming
        **({"ema_decay": arg.align_ema} if arg.align_ema else {}),
        **({"average_last": arg.align_average} if arg.align_average else {}),
        **({"lora_rank": arg.align_lora} if arg.align_lora else {}),
        start_weight=arg.align_start_weight,
        trainable=arg.align_trainable,
        w_feature=arg.align_w_feature,
        w_blocks=arg.align_w_blocks,
        blocks_top_weight=arg.align_top_weight,
        w_attn_tf=arg.align_w_attn_tf,
        pp_train=train_pp(res, norm, arg.align_augment) if arg.align_augment else "",
        mixup=arg.align_mixup,
    )
    c.stages = ("distill_attention", "align")
  for name in c.stages:
    steps = c[name].steps
    c[name].eval_every = max(1, steps // 8)
    c[name].log_every = max(1, steps // 40)
    c[name].checkpoint_every = max(1, steps // 8)

  # Fidelity on random crops of held-out photos (a fixed seed): a folder may hold out only a few
  # files, and crops at several scales are what the student will see.
  c.eval.sample_pp = c.data.pp_train
  c.eval.fidelity_images = arg.eval_images
  c.eval.curve_images = min(16, arg.eval_images)
  c.eval.throughput_batch = 8
  c.eval.attention_map_images = 4
  c.eval.resolution_factors = (1, 2)
  c.eval.resolution_fidelity_images = min(16, arg.eval_images)
  if arg.knn != "none":
    folder = arg.knn.startswith("image_folder")
    c.eval.knn.update(
        dataset=arg.knn,
        data_dir=arg.knn_data_dir,
        train_split=f"train@{arg.holdout}" if folder else "train",
        eval_split=f"holdout@{arg.holdout}" if folder else "test",
        train_examples=arg.knn_train,
        eval_examples=arg.knn_eval,
    )
  if arg.tiny:
    c.eval.knn.update(train_examples=64, eval_examples=32, batch_size=32)
    c.eval.fidelity_images = c.eval.curve_images = c.eval.resolution_fidelity_images = 4
    c.eval.throughput_batch = 2
    c.eval.attention_map_images = 2
  return c
