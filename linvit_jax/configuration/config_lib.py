"""The config schema as code: the base config every run starts from (`base_config`), one schema
per stage kind (`stage`, `align_stage`, with every optimizer field: OPTIMIZER_DEFAULTS), and the
blocks of the base config (`distill`, `knn`, `photo_test`).

Every field exists in every run, at an off value when its feature is off (w_structure = 0,
ema_decay = 0, lora_rank = 0, ...), so `--config.<block>.<field>=...` overrides a field the same way
whether or not the config turned it on. A config file's `get_config(arg)` reads its options with
options.parse_arg, starts from `base_config()` (or a recipes block) and overrides fields; main.py
locks the result, so a typo such as `--config.finetune.stpes=10` is an error instead of a silent
no-op. Imports nothing of linvit_jax: the other configuration modules build on this one.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

import ml_collections as mlc

STAGE_KINDS = ("train", "distill_attention", "finetune", "align")
# How student.softmax_layers picks its layers (run._hybrid_swap).
SOFTMAX_PICKS = ("tf_cosine", "sensitivity", "sensitivity_worst")


def fixed_softmax_layers(pick: Any) -> tuple[int, ...] | None:
  """The layers a softmax_pick names itself ("8", "4,8" or "4+8", the form convert_folder's
  comma-separated options can hold: a study's or a user's own choice, not measured by the run),
  else None (a pick rule of SOFTMAX_PICKS, or not a list of layers)."""
  parts = str(pick).replace(" ", "").replace("+", ",").split(",")
  if isinstance(pick, bool) or not all(p.isdigit() for p in parts):
    return None
  return tuple(int(p) for p in parts)


def softmax_pick_valid(pick: Any) -> bool:
  return pick in SOFTMAX_PICKS or fixed_softmax_layers(pick) is not None


# What the pick measures on: "sample" the fidelity sample (eval.sample_pp's random views of the
# held-out images), "eval_view" the held-out images through data.pp_eval (one whole-image view
# each: what the exported student sees, and what photo_eval's views resemble).
SOFTMAX_PICK_IMAGES = ("sample", "eval_view")
# student.softmax_key_grid: a grid side in patches (int, 0: every key) or a multiple of the
# training grid ("2x": twice image_size // patch), so one setting means the same for any teacher.
KEY_GRID_FORMS = (
    "a grid side in patches >= 0 (0: every key) or a multiple of the training grid ('2x')"
)
_KEY_GRID_MULTIPLE = re.compile(r"([0-9]+(?:\.[0-9]+)?)x")


def key_grid_multiple(value: Any) -> float | None:
  """The N of a key grid written 'Nx' (N > 0, plain decimal digits), or None when `value` is not
  of that form."""
  match = _KEY_GRID_MULTIPLE.fullmatch(value) if isinstance(value, str) else None
  n = float(match.group(1)) if match else 0.0
  return n if n > 0 else None


def key_grid_valid(value: Any) -> bool:
  """Whether `value` is a student.softmax_key_grid: a whole number >= 0, its digits, or 'Nx'."""
  if isinstance(value, str) and value.isascii() and value.isdigit():
    return True
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    return value >= 0
  return key_grid_multiple(value) is not None


def key_grid_canonical(value: Any) -> Any:
  """One spelling per key grid (what config.json records, so a rerun resumes however it is
  written): a grid side as an int, 'Nx' with N in its shortest form ('2.0x' -> '2x'); anything
  else as it is (the checks name it)."""
  n = key_grid_multiple(value)
  if n is not None:
    return f"{n:g}x"
  return int(value) if key_grid_valid(value) else value


def key_grid_field(value: Any) -> mlc.FieldReference:
  """student.softmax_key_grid as a config field that takes either form: a plain int field would
  refuse `--config.student.softmax_key_grid=2x` (ml_collections keeps a field's type), a str one
  would read `=32` as text; an `object` field parses the flag as a literal (32 an int, 2x text).
  Written with `=` only: absl takes an `object` field's flag for a boolean one, so a value after a
  space is not its value. An override is recorded as written ('2.0x'); check_same_run compares
  canonical forms."""
  return mlc.FieldReference(key_grid_canonical(value), field_type=object)


def key_grid_patches(value: int | str, image_size: int, patch: int) -> int:
  """student.softmax_key_grid as a grid side in patches: a whole number (or its digits) as it is;
  'Nx' as N times the training grid image_size // patch, halves rounded up, at least 1."""
  if not key_grid_valid(value):
    raise ValueError(f"softmax_key_grid={value!r}: expected {KEY_GRID_FORMS}")
  n = key_grid_multiple(value)
  if n is None:
    return int(value)
  return max(1, math.floor(n * (image_size // patch) + 0.5))


# Every optimizer field and its default (big_vision's semantics: optim.make_optimizer). A config's
# stage block spells out the commonly tuned ones (`optimizer()`); the runner fills the fields a
# block omits from here, so a hand-written block means what a config block means.
OPTIMIZER_DEFAULTS = dict(
    name="adamw",  # "adamw" and "adam" are the same (decoupled) chain; or "sgd"
    lr=1e-3,  # the peak of the schedule
    # big_vision's decoupled weight decay: `wd · param` is added after the update is scaled by
    # the peak lr, and follows the schedule's shape only (update = -s(t)·(lr·adam + wd·param),
    # s(t) = schedule(t)/lr ∈ [0, 1]); NOT optax.adamw's lr·wd (1e-4 there is ~1e4× weaker).
    wd=1e-4,  # big_vision's i1k ViT value
    wd_pattern=r".*/kernel",  # the decayed leaves (big_vision's wd_mults default); None: ndim >= 2
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    momentum=0.9,  # sgd only
    grad_clip=1.0,  # global-norm clip over the trained params; 0 = off
    warmup_steps=0,
    schedule="cosine",  # after a linear warmup from 0: cosine | linear | constant
    end_lr_ratio=0.0,  # final lr = lr · end_lr_ratio (cosine, linear)
    accum_steps=1,  # micro-batches per step (gradient accumulation)
    # "absolute": lr is a step in parameter units (Adam's step is scale-free: every entry moves by
    # ~lr whatever its size). "param_rms": each update is multiplied by the RMS of its parameter over
    # every axis but the last (per output column of a Dense kernel, whole leaf for a vector), floored
    # at param_scale_floor, so lr is a relative step: columns that carry a tiny folded LayerScale
    # (DINOv2: 2e-4) move as much relative to their size as the large ones.
    update_scale="absolute",
    param_scale_floor=1e-4,
    # > 0: the stage also keeps an exponential moving average of its params (in the optimizer state,
    # so it is checkpointed and resumed), decay min(ema_decay, (1 + t) / (10 + t)) at update t, and
    # hands the average on as the stage's result (curves are drawn on it too). Batch-size-8 walks
    # swing held-out fidelity from step to step; the average does not follow one walk. While
    # t < 10/(1 − decay) the warm-up term is the smaller one and the average spans only the
    # last ~t/9 updates (a 500-step stage: ~55, whatever decay ≥ 0.98): use average_last there.
    ema_decay=0.0,
    # (0, 1]: instead, the uniform average of the params after each of the last `average_last`
    # fraction of the stage's updates (stochastic weight averaging over the schedule's tail),
    # handed on the same way. Exclusive with ema_decay.
    average_last=0.0,
    # r > 0: every trained kernel moves only within a rank-r update, W₀ + A·B (LoRA; the factors
    # are optimizer state, the params stay merged: lora.py); its other trained leaves (biases,
    # norms, embeddings) step as usual. With update_scale="param_rms" the product is scaled by
    # each output column's RMS at the stage's start. 0 = off (full-rank steps).
    lora_rank=0,
)


def optimizer(lr: float, **kw: Any) -> dict:
  """An optimizer block: every OPTIMIZER_DEFAULTS field, at its default unless given in `kw`
  (e.g. wd=0.0, end_lr_ratio=0.1), and `lr`."""
  unknown = sorted(set(kw) - set(OPTIMIZER_DEFAULTS))
  if unknown:
    raise ValueError(f"unknown optimizer field(s) {unknown}; known: {sorted(OPTIMIZER_DEFAULTS)}")
  return {**OPTIMIZER_DEFAULTS, **kw, "lr": lr}


def stage_bookkeeping(steps: int) -> dict:
  """The runner's fields of a stage block (train.run_stage), scaled to the stage's length; the
  runner fills the ones a block omits from here."""
  return dict(
      checkpoint_every=max(1, steps // 4),  # save every N steps (and at the end); 0: end
      max_to_keep=2,
      log_every=max(1, steps // 20),  # a metrics row every N steps (and first and last)
      eval_every=0,  # evaluate every N steps (and at the end); 0: end
      max_nonfinite_in_a_row=10,  # skipped non-finite updates before the stage stops
      progress=True,
  )  # tqdm bar on process 0


def stage_losses(kind: str) -> dict:
  """The loss fields a stage kind reads, at their defaults (its schema beside the common fields:
  kind, steps, batch_size, optimizer and the runner's bookkeeping)."""
  if kind in ("train", "finetune"):
    return dict(
        w_label=1.0,  # labels (softmax_xent / sigmoid_xent); 0: no label is read
        w_logit_kd=0.0,  # the teacher's logits, KL at kd_temperature
        kd_temperature=1.0,
        w_feature=0.0,  # the teacher's final tokens and pre_logits (the student's own forward)
        w_blocks=0.0,  # the teacher's residual stream after every block (the student's own)
        blocks_top_weight=1.0,  # w_blocks' weight of the last block over the first (linear ramp)
        w_attn_tf=0.0,  # teacher-forced attention outputs (nmse), every layer
        w_structure=0.0,  # the final patch tokens' deviations from their image's mean token
        label_loss="softmax_xent",  # softmax_xent | sigmoid_xent
    )
  if kind == "align":  # label-free, and what trains is chosen
    return dict(
        w_logit_kd=0.0,
        kd_temperature=1.0,
        w_feature=1.0,
        w_blocks=1.0,
        blocks_top_weight=1.0,  # the last block's weight over the first (linear ramp; 1: mean)
        w_attn_tf=1.0,
        w_structure=0.0,
        trainable="all",  # "all" | "attention" | a path regex (re.fullmatch)
    )
  if kind == "distill_attention":  # its loss weights are the `distill` block's
    # "distill_attention": every attention parameter (q/k/v/out, feature maps, lever params);
    # "attention_routing": v and out frozen at the teacher's values; "attention_features": q and
    # k frozen (the exact rows keep the teacher's scores); or a path regex.
    return dict(trainable="distill_attention")
  raise ValueError(f"unknown stage kind {kind!r}; known: {STAGE_KINDS}")


# The label-free end-to-end stage after attention distillation, as measured on the real ViT-S/14
# (docs/levers.md, last section): every parameter, Adam steps relative to each output column's
# RMS at lr 2e-4, a quarter of the stage warm-up (convert_folder's defaults, the demo's option).
ALIGN_RECIPE = dict(lr=2e-4, trainable="all", update_scale="param_rms", warmup=0.25)


def stage(kind: str, *, steps: int, batch_size: int, lr: float, **kw: Any) -> dict:
  """One stage block with exactly the fields its kind reads. kind: train (labels, from the current
  params), distill_attention (only attention + feature-map params train, teacher-forced losses
  weighted by the `distill` block), finetune (all params, labels and optionally teacher logits /
  features), align (label-free: the student's own block outputs and final tokens matched to the
  teacher's). Optimizer fields (wd, warmup_steps, ...; not `name`) go to the block's `optimizer`;
  `pp_train` overrides config.data.pp_train for this stage; `mixup` p > 0 blends each training
  image with its batch neighbour, weight ~ Beta(p, p) (label-free stages); `start_weight` w makes
  the stage hand on (1 − w)·trained + w·starting params; `image_size` trains at another
  resolution than data.image_size (with a pp_train of that size); any other keyword must be one of the
  kind's loss fields (`stage_losses`)."""
  losses = stage_losses(kind)
  opt_kw = {k: kw.pop(k) for k in OPTIMIZER_DEFAULTS if k in kw and k not in ("name", "lr")}
  # This stage's training pp string ("": config.data.pp_train), e.g. stronger augmentation for
  # one stage; the split, dataset and compose stay the data block's.
  pp_train = kw.pop("pp_train", "")
  mixup = kw.pop("mixup", 0.0)
  start_weight = kw.pop("start_weight", 0.0)
  image_size = kw.pop("image_size", 0)
  w_structure = kw.get("w_structure", 0.0)  # a loss field of train, finetune and align
  if not (float(w_structure) >= 0.0 and math.isfinite(float(w_structure))):
    raise ValueError(f"w_structure={w_structure!r}: a loss weight is finite and >= 0")
  if "w_structure" not in losses and kw.pop("w_structure", 0.0):
    raise ValueError(f"a {kind} stage has no field w_structure (train, finetune and align do)")
  unknown = sorted(set(kw) - set(losses))
  if unknown:
    raise ValueError(
        f"a {kind} stage has no field(s) {unknown}; its loss fields: {sorted(losses) or 'none'}"
    )
  return dict(
      kind=kind,
      steps=steps,
      batch_size=batch_size,
      pp_train=pp_train,
      # Beta(p, p) concentration of the weight blending each training image with its batch
      # neighbour (mixup without labels: more varied inputs to match the teacher on); 0 = off.
      mixup=mixup,
      # What the stage hands on: (1 − w)·its trained params + w·its starting params (weight
      # interpolation, WiSE-FT); 0 = its trained params alone.
      start_weight=start_weight,  # 0 = the trained params; 0.5 = midway back to the start
      # The stage's training resolution (0: data.image_size): both models resample their stored
      # position tables in the forward (vit's posemb_grid), so a stage at the resolution the
      # student will be deployed at trains the same params; its pp_train makes views of that size.
      image_size=image_size,
      optimizer=optimizer(lr, **opt_kw),
      **stage_bookkeeping(steps),
      **{**losses, **kw},
  )


def align_stage(
    *,
    steps: int,
    batch_size: int,
    lr: float = ALIGN_RECIPE["lr"],
    warmup: float = ALIGN_RECIPE["warmup"],
    update_scale: str = ALIGN_RECIPE["update_scale"],
    trainable: str = ALIGN_RECIPE["trainable"],
    ema_decay: float = 0.0,
    average_last: float = 0.0,
    lora_rank: int = 0,
    **kw: Any,
) -> dict:
  """An `align` stage block at ALIGN_RECIPE's settings unless given (convert_folder, the demo's
  align_steps): `warmup` a fraction of its steps, no weight decay; `kw` as `stage` takes them."""
  return stage(
      "align",
      steps=steps,
      batch_size=batch_size,
      lr=lr,
      warmup_steps=max(1, int(steps * warmup)),
      wd=0.0,
      update_scale=update_scale,
      trainable=trainable,
      ema_decay=ema_decay,
      average_last=average_last,
      lora_rank=lora_rank,
      **kw,
  )


def stage_blocks(config: mlc.ConfigDict) -> list[str]:
  """The names of config's stage blocks (a block with a `kind`), listed in config.stages or not."""
  return [k for k in config.keys() if isinstance(config[k], mlc.ConfigDict) and "kind" in config[k]]


def stage_fields(kind: str) -> set[str]:
  """Every field a `kind` stage block holds (what `stage` writes)."""
  return set(stage(kind, steps=1, batch_size=1, lr=1.0))


def distill() -> dict:
  """The `distill` block: the distill_attention stage's loss weights (distill_stage.make_distill_loss)."""
  return dict(
      metric="nmse",  # attention-output metric in the loss: "nmse" | "cosine"
      w_attn=1.0,
      w_routing=0.1,
      routing_temperature=1.0,  # τ of the teacher's softmax(QKᵀ/(τ√d)); >1 softens targets
      routing_queries=32,  # s sampled query tokens per step (0: all queries)
      routing_kind="xent",  # "xent" | "kl" (same gradient; kl is 0 at the optimum)
      lookahead=0,  # k: teacher sublayers the attention error is pushed through
      w_lookahead=0.0,
      w_feature=0.0,  # end-to-end alignment of the student's own stream
      feature_keys=("encoded", "pre_logits"),  # the student's own features w_feature matches
      w_logit_kd=0.0,
      kd_temperature=1.0,
      # The teacher forward that makes the targets: "float32", or "bfloat16" matmuls with float32
      # accumulation (stream, LayerNorms and softmax stay float32; evaluation is float32 always).
      teacher_dtype_mm="float32",
      # The student's teacher-forced attention in the loss: the same choice (params, gradients
      # and the optimizer stay float32: mixed precision).
      student_dtype_mm="float32",
  )


def knn() -> dict:
  """The `eval.knn` block: k-NN classification on the final pooled feature (evaluate.knn_top1)."""
  return dict(
      dataset="",  # "" = off; a TFDS name, image_folder:<DIR> (class sub-folders), fashion_mnist_local
      data_dir="",
      train_split="train",  # the reference bank's split
      eval_split="test",  # the classified split
      pp="",  # "" = the run's pp_eval image ops (resize, crop, normalisation) + the label
      label_key="label",  # an integer class id in the examples
      train_examples=1000,  # first N of train_split (0: all)
      eval_examples=500,  # first N of eval_split (0: all)
      k=20,  # neighbours voting (DINO: 20)
      temperature=0.07,  # vote weight exp(cosine / temperature) (DINO: 0.07)
      batch_size=64,
  )


def photo_test() -> dict:
  """The `eval.test` block: the student vs its teacher on the test photos of an image folder at
  native resolution, with bootstrap intervals and the dense measure (photo_eval.py); the dense
  measure's parts and probes are fitted on the data block's eval split (the validation photos)."""
  return dict(
      split="",  # "" = off; an image-folder split of data.dataset, e.g. "test@0.2"
      factors=(1, 2, 4),  # sizes, multiples of data.image_size, each made from the original photo
      views=("whole", "crop"),  # whole: resized to s×s; crop: shorter side to s, centre s×s
      min_photos=8,  # fewer test or validation photos: the run goes on and says so
      bootstrap=1000,  # resamples of the photos for each 95 % interval
      dense_k=8,  # the teacher's parts (k-means on its patch tokens); 0: no dense measure
  )


def base_config() -> mlc.ConfigDict:
  """Every field a run understands, with defaults; config files override what they need.

  One literal read top to bottom, as long as the schema is: each field's comment beside it is
  its documentation (reference.field_docs reads them for --print_config)."""
  c = mlc.ConfigDict()
  c.seed = 0
  c.compile_cache = ""  # XLA executables reused across runs; "" = ~/.cache/linvit_jax/xla, "none"
  # A tuple, so that `--config.mesh="(('data',4),('fsdp',2))"` works (lists are not overridable).
  c.mesh = (("data", -1), ("fsdp", 1))
  # Every sequence field is a tuple: ml_collections overrides tuples from the command line
  # (`--config.stages="('finetune',)"`, `--config.stages=finetune`, `--config.stages="()"`),
  # lists not at all. tests/test_main.py checks that no config file leaves a list behind.
  c.param_rules = ()  # ((path regex (fullmatch), "fsdp" | "replicate"), ...), first match wins

  c.data = dict(
      dataset="fashion_mnist_local",
      data_dir="",
      train_split="train",
      eval_split="test",
      eval_dataset="",
      pp_train="",
      pp_eval="",
      image_size=28,
      num_classes=10,
      label_key="labels",
      shuffle_buffer=10_000,
      # Label-free runs only: this fraction of every training batch becomes 2×2 mosaics of four
      # of the batch's images (input_pipeline.compose_2x2): more varied inputs from few photos.
      compose=0.0,
      eval_batch_size=512,
      eval_max_examples=0,
  )  # 0: the whole split

  # The teacher's architecture (big_vision ViT fields); the student is the same with `attention`.
  c.model = dict(
      variant="",
      num_classes=10,
      width=128,
      depth=4,
      mlp_dim=256,
      num_heads=4,
      patch_size=(4, 4),
      posemb="learn",
      pool_type="tok",
      rep_size=False,
      dropout=0.0,
      head_zeroinit=True,
      scan=False,
      remat_policy="nothing_saveable",
      dtype_mm="float32",
      gelu_approximate=True,
      layernorm_epsilon=1e-6,  # Hugging Face ViT/DeiT: 1e-12
      reg_tokens=0,  # learned prefix tokens after cls: DINOv2 registers, DeiT's distillation token
  )

  # init: big_vision npz (a path, gs://, or a big_vision short name such as "i1k-s16-300ep");
  # "" → no teacher (train a model). dont_load: regexes (re.fullmatch on "a/b/kernel" paths) of
  # checkpoint params not loaded, e.g. ("head/.*",) for an i21k head of another class count.
  # architecture: "config" (config.model describes the teacher) or "init" (the driver reads it
  # from teacher.init: width, depth, heads, MLP, patch, position embedding, registers, pool type
  # where the checkpoint has a cls token or MAP head, the head's classes unless dont_load skips
  # the head, and the GELU form / LayerNorm epsilon where the source declares them). config_fields:
  # model fields the config decides even with architecture "init" (e.g. ("gelu_approximate",));
  # a pool_type there must agree with a checkpoint that has a cls token or MAP head. A pp string's
  # op `init_norm` (or `init_norm(required=True)`) becomes the input normalisation teacher.init's
  # source declares (else ImageNet's; else, when required, an error) when the run starts.
  c.teacher = dict(init="", dont_load=(), architecture="config", config_fields=())
  # init: a student exported by an earlier run (its student.npz; student_config.json beside it
  # gives its per-layer attention) instead of surgery from the teacher: with `stages=()` this is
  # evaluate-only, with stages it continues training. dont_load: student params that keep their
  # fresh init instead of being copied (from student.init, or from the teacher by surgery).
  # softmax_layers: k layers that linearize worst (after the first distill_attention stage) keep
  # softmax attention with the teacher's weights: a hybrid student; softmax_pick says which:
  # "tf_cosine" the k of lowest teacher-forced attention cosine, "sensitivity" the k whose
  # teacher attention, swapped into the student alone, brings its final tokens closest to the
  # teacher's (evaluation/layer_swap.fix_gains: error that compounds counts), "sensitivity_worst"
  # the same gain over the quarter of those images the student is furthest on; softmax_pick_images:
  # which held-out images both measure on (SOFTMAX_PICK_IMAGES); or the layers themselves, "8" or
  # "4,8" (fixed_softmax_layers); softmax_key_grid:
  # g > 0: those layers pool their patch keys to at most g×g on a larger grid (AttentionSpec
  # key_grid: linear in tokens; 0: every key), or "Nx": N times the training grid (either form,
  # also as --config.student.softmax_key_grid=: key_grid_field).
  # attention: the student's operator: a feature map (elu1, relu, hedgehog, hedgehog_exp,
  # favor), a spec, or one per layer.
  c.student = dict(
      attention="elu1",
      init="",
      dont_load=(),
      softmax_layers=0,
      softmax_pick="tf_cosine",
      softmax_pick_images="sample",
      softmax_key_grid=key_grid_field(0),
  )
  # policy: what surgery copies from the teacher: copy_same (all but attention), copy_all,
  # copy_attention_only, copy_none. calibrate: data-dependent out-projection init of fresh
  # attention.
  c.surgery = dict(policy="copy_same", calibrate=True)

  c.distill = distill()

  c.stages = ("distill_attention", "finetune")  # () = convert (or evaluate student.init) only
  c.distill_attention = stage(
      "distill_attention", steps=500, batch_size=64, lr=3e-3, warmup_steps=25
  )
  c.finetune = stage("finetune", steps=500, batch_size=64, lr=3e-4, warmup_steps=25)
  c.train = stage("train", steps=0, batch_size=64, lr=1e-3)

  # sample_pp: "" → the fidelity sample is the first eval images (pp_eval); a pp string → random
  # views of the eval split drawn with it under a fixed seed (few held-out files, many crops).
  # knn: downstream check of the final pooled feature, teacher vs student (DINO's weighted k-NN).
  c.eval = dict(
      teacher=True,
      curve_examples=2000,
      curve_images=16,
      fidelity_images=128,
      attention_map_images=4,
      throughput_batch=64,
      resolution_factors=(1, 2),
      resolution_examples=2000,
      resolution_fidelity_images=16,
      plots=True,
      sample_pp="",
      knn=knn(),
      test=photo_test(),
  )
  # npz: write student.npz (big_vision layout). safetensors: write student.safetensors (config in
  # its metadata). student_config.json and the model card README.md are always written.
  c.export = dict(npz=True, safetensors=True)
  return c
