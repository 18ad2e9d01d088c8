r"""Convert any ViT checkpoint to linear attention on a folder of images, label-free.

  python -m linvit_jax.main \
    --config configs/convert_folder.py:init=/path/vit.npz,images=/path/photos,res=224 \
    --workdir workdirs/convert

The recipe: surgery (`policy`) → distill_attention (teacher-forced attention outputs, attention
params only, `distill_fraction` of the `max_images` budget) → optional hybrid (`softmax_layers`)
→ align (the student's own forward matched block by block, on the rest of the budget) → fidelity
report on the validation photos, the test photos' evaluation (photo_eval.py), k-NN, speed,
export. What each default measured: README, "Real pretrained ViTs", and docs/levers.md.

The teacher and the photos:
  init: a big_vision .npz, or a Hugging Face / timm model folder or .safetensors file; it alone
    decides the architecture (read by the driver when the run starts, not here), and how many
    channels the photos are decoded to (a grayscale teacher's: 1; then norm= must not be
    ImageNet's RGB mean/std: minus_one_one, or the source's declared one)
  images: a folder of jpg/png photos, searched recursively; no label is read
  res: the training and evaluation resolution, a multiple of the teacher's patch
  gelu: exact | tanh; empty: the source's, else exact
  norm: imagenet | minus_one_one | source; empty: the source's mean/std, else imagenet
  pool: gap | 0 | none, the pool type of a teacher without a cls token (default gap)
  holdout: the fraction of photos held out, by a hash of each path, in (0, 1): half of them
    (by a second hash) validate the run's choices, the other half are the test photos it reports
    at res, 2·res and 4·res (eval.test; fewer than 8 of either: the run says so)
  eval_images: how many held-out crops the fidelity report measures
  eval_folder: a folder of photos from other sources than `images` (debian_photos --set cross):
    the run validates on one half of it and reports the test table on the other (val@1 / test@1,
    by a hash of each path) instead of on the held-out share of `images`, which then stays unseen
    for `python -m linvit_jax.compare` (the in-source figures); empty: off

The student's linear attention:
  feature_map: hedgehog_exp | hedgehog | elu1 | relu | favor
  num_features: the feature map's width (0: the map's default)
  center_keys: keys centred per image and head before the feature map
  conv_v: a zero-initialised depthwise 3x3 convolution of v over the patch grid
  exact_prefix: the cls and register queries get exact softmax over all keys
  window: w odd: exact softmax over each patch's w x w neighbourhood (0: off)
  sinks: m > 0: the m patch keys of largest norm are exact for every query (0: off)
  policy: the surgery policy (copy_all: the teacher's q/k/v/out start the student)
  softmax_layers: how many layers go back to softmax after distillation (default 1: +0.016 /
    +0.012 cls / patch at 448 px over none, mean of two seeds, docs/operators.md; 0: all linear)
  softmax_pick: sensitivity (largest end-to-end gain, the default) | sensitivity_worst (the
    same gain on the quarter of held-out views the student is furthest on) | tf_cosine (lowest
    teacher-forced cosine) | the layers themselves, '8', '4+8' (as many as softmax_layers)
  softmax_pick_images: sample (the random training-style views of the held-out photos that the
    run's fidelity is measured on) | eval_view (each held-out photo's centre view, pp_eval)
  softmax_key_grid: g > 0: on a patch grid wider than g (a larger deploy size), the softmax
    layers attend to the cls/register keys and the patch keys averaged to at most g x g blocks,
    each weighted by its count: linear in tokens (0: every key); 'Nx': N times the training
    grid res / patch (2x, the default: 32 for a /14 teacher at 224 px), the same for any teacher

Training budget and the distillation stage:
  max_images: the training images of both stages together, at least `batch`
  distill_fraction: the share of max_images the distillation gets, in (0, 1] (1: no align)
  batch: the batch size of both stages
  compose: the fraction of each batch made 2x2 mosaics of four photos (0: off)
  lr_distill: the distillation's learning rate
  distill_trainable: distill_attention | attention_routing | attention_features | a path regex
  distill_augment: "" | color (DINO's colour jitter and grayscale on the training views)
  distill_mixup: p > 0: each view blended with its batch neighbour, weight ~ Beta(p, p) (0: off)

The align stage (ignored when distill_fraction=1):
  lr_align: the align stage's learning rate (a relative step under param_rms)
  align_trainable: attention | all | a path regex
  align_update_scale: absolute | param_rms (steps relative to each output column's RMS)
  align_warmup: the align stage's warm-up, a fraction of its steps
  align_lora: r > 0: every trained kernel moves within a rank-r update (0: full rank, the default;
    8 was until 2026-12-07)
  align_start_weight: w in [0, 1): hand on (1 - w) * trained + w * distilled params
  align_ema: a decay in [0, 1): hand on the moving average of its params (0: off)
  align_average: f in [0, 1]: hand on the average over its last f of steps (0: off)
  align_w_feature: the weight of the final tokens' loss
  align_w_blocks: the weight of every block output's loss
  align_top_weight: the last block's weight over the first
  align_w_attn_tf: the weight of the teacher-forced attention outputs (0: off, the default: the
    same student, an align step about a fifth cheaper; 1 was until 2026-12-07)
  align_w_structure: the weight of the final patch tokens' deviations from their photo's mean
    token (what tells parts apart; distill.token_structure_loss; 0: off)
  align_augment: "" | color (DINO's colour jitter and grayscale on the align views)
  align_mixup: p > 0: label-free mixup of the align views, Beta(p, p) (0: off; default 1)
  deploy_res: a resolution the student will run at (a multiple of the patch; 0: res only): the
    last deploy_fraction of the align steps run there as their own stage (align_deploy), both
    models resampling their position tables as the report does
  deploy_fraction: that share of the align steps, each with batch·(res/deploy_res)² views (so a
    step holds about as many pixels as an align step)

The k-NN check (weighted k-NN top-1 of the pooled feature, teacher vs student):
  knn: auto (Fashion-MNIST when installed, else skipped and the results say so) | none |
    fashion_mnist_local | image_folder:<DIR> (a sub-folder per class) | a TFDS name
  knn_data_dir: the TFDS data_dir of the k-NN set
  knn_train: how many reference images
  knn_eval: how many classified images
  tiny: a few steps and images, for the tests
"""

from linvit_jax.configuration import config_checks
from linvit_jax.configuration import config_lib
from linvit_jax.configuration import options
from linvit_jax.configuration import recipes

# The options and their defaults (the docstring says what each means): parse_arg types a value
# after its default, config_checks.convert_folder checks it.
OPTIONS = dict(
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
    softmax_layers=1,
    softmax_pick="sensitivity",
    softmax_pick_images="sample",
    softmax_key_grid=options.NumberOrText("2x"),
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
    align_lora=0,
    align_w_feature=1.0,
    align_w_blocks=1.0,
    align_top_weight=1.0,
    align_w_attn_tf=0.0,
    align_w_structure=0.0,
    distill_augment="",
    align_augment="",
    distill_mixup=0.0,
    align_mixup=1.0,
    deploy_res=0,
    deploy_fraction=0.25,
    holdout=0.2,
    eval_images=32,
    eval_folder="",
    exact_prefix=False,
    center_keys=True,
    conv_v=True,
    window=0,
    sinks=0,
    compose=0.0,
    knn="auto",
    knn_data_dir="",
    knn_train=1000,
    knn_eval=500,
    tiny=False,
)


def train_pp(res: int, norm: str, augment: str) -> str:
  """The training views: Inception crops of the photos, flipped, with `augment`'s extra ops."""
  return f'decode|inception_crop({res})|flip_lr{recipes.AUGMENTS[augment]}|{norm}|keep("image")'


def get_config(arg=None):
  arg = options.parse_arg(arg, **OPTIONS)
  config_checks.check_options("convert_folder", arg)
  config_checks.say_budget("convert_folder", arg, OPTIONS)  # a dropped stage, unread options: said
  # The architecture, and the input normalisation a source declares, are read from `init` by the
  # driver (teacher.architecture="init", the pp op `init_norm`): this file reads no checkpoint.
  # norm="": the source's mean/std, else ImageNet's; "source": the source's, or an error.
  norm = recipes.NORMS.get(arg.norm) or (
      "init_norm(required=True)" if arg.norm == "source" else "init_norm"
  )
  c = config_lib.base_config()
  res, split = arg.res, f"@{arg.holdout}"
  c.data = dict(
      dataset="image_folder",
      data_dir=arg.images,
      train_split="train" + split,
      # The run's choices (hybrid layers, curves, calibration) and its fidelity sample: the
      # validation half of the held-out photos; the test half is only reported (eval.test).
      eval_split="val@1" if arg.eval_folder else "val" + split,
      eval_dataset=f"image_folder:{arg.eval_folder}" if arg.eval_folder else "",
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
  c.model.update(variant="", pool_type=arg.pool or "gap", gelu_approximate=arg.gelu == "tanh")
  given = (("gelu_approximate", arg.gelu), ("pool_type", arg.pool))
  c.teacher.update(
      architecture="init", init=arg.init, config_fields=tuple(n for n, v in given if v)
  )
  attention = recipes.attention_of(arg)
  c.student = dict(
      c.student.to_dict(),
      attention=attention,
      softmax_layers=arg.softmax_layers,
      softmax_pick=arg.softmax_pick,
      softmax_pick_images=arg.softmax_pick_images,
      # digits as an int (how runs recorded it before 'Nx' existed), 'Nx' in one spelling
      softmax_key_grid=config_lib.key_grid_field(arg.softmax_key_grid),
  )
  c.surgery.policy = arg.policy

  steps_a, steps_b, steps_d = _steps(arg)
  c.distill_attention = config_lib.stage(
      "distill_attention",
      steps=steps_a,
      batch_size=arg.batch,
      lr=arg.lr_distill,
      warmup_steps=max(1, steps_a // 20),
      wd=0.0,
      trainable=arg.distill_trainable,
      pp_train=train_pp(res, norm, arg.distill_augment) if arg.distill_augment else "",
      mixup=arg.distill_mixup,
  )
  c.stages = ("distill_attention",)
  for name, steps, size in (("align", steps_b, res), ("align_deploy", steps_d, arg.deploy_res)):
    if steps:  # align_deploy: about as many pixels a step as align's
      c[name] = _align(arg, steps, size, norm)
      c.stages += (name,)
  for name in c.stages:
    steps = c[name].steps
    c[name].update(eval_every=max(1, steps // 8), checkpoint_every=max(1, steps // 8))
    c[name].log_every = max(1, steps // 40)
  _eval(c, arg)
  return c


def _steps(arg) -> tuple[int, int, int]:
  """The steps of distill_attention, align and align_deploy: `max_images` split by
  `distill_fraction`, then the last `deploy_fraction` of align's at deploy_res (tiny: 2 each)."""
  distill_images = int(arg.max_images * arg.distill_fraction)
  steps_a = max(1, distill_images // arg.batch)
  steps_b = (arg.max_images - distill_images) // arg.batch
  deploy = arg.deploy_res and arg.deploy_res != arg.res
  steps_d = int(steps_b * arg.deploy_fraction) if deploy else 0
  if arg.tiny:
    return 2, 2, 2 if deploy else 0
  return steps_a, steps_b - steps_d, steps_d


def _align(arg, steps: int, size: int, norm: str) -> dict:
  """An align stage of `steps` at resolution `size`, with `batch·(res/size)²` views a step."""
  at_res = size == arg.res
  batch = arg.batch if at_res else max(1, round(arg.batch * (arg.res / size) ** 2))
  return config_lib.align_stage(
      steps=steps,
      batch_size=batch,
      lr=arg.lr_align,
      warmup=arg.align_warmup,
      update_scale=arg.align_update_scale,
      trainable=arg.align_trainable,
      ema_decay=arg.align_ema,
      average_last=arg.align_average,
      lora_rank=arg.align_lora,
      start_weight=arg.align_start_weight,
      w_feature=arg.align_w_feature,
      w_blocks=arg.align_w_blocks,
      blocks_top_weight=arg.align_top_weight,
      w_attn_tf=arg.align_w_attn_tf,
      w_structure=arg.align_w_structure,
      pp_train=train_pp(size, norm, arg.align_augment) if arg.align_augment or not at_res else "",
      mixup=arg.align_mixup if batch > 1 else 0.0,  # a view has no batch neighbour to blend
      image_size=0 if at_res else size,
  )


def _eval(c, arg) -> None:
  """Fidelity on random crops of held-out photos (a fixed seed: a folder may hold out only a few
  files, and crops at several scales are what the student will see); the test photos (every size
  from the original photo, intervals over photos, the dense measure: photo_eval.py; never chosen
  on); the k-NN check."""
  few = min(16, arg.eval_images)
  c.eval.update(sample_pp=c.data.pp_train, fidelity_images=arg.eval_images, curve_images=few)
  c.eval.update(throughput_batch=8, attention_map_images=4, resolution_factors=(1, 2))
  c.eval.resolution_fidelity_images = few
  c.eval.test.split = "test@1" if arg.eval_folder else f"test@{arg.holdout}"
  if arg.knn not in ("", "none"):  # auto: resolved when the run starts (preflight.resolve_knn)
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
    c.eval.update(throughput_batch=2, attention_map_images=2)
    c.eval.test.factors = (1, 2)
