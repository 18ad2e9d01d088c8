"""Config-as-code helpers: the `:arg` string parser, the base config every run starts from, one
schema per stage kind, and the blocks the shipped configs share (the student's linear attention,
the align stage, the labelled pod conversion).

A config file's `get_config(arg)` starts from `base_config()` and overrides fields; main.py locks
the result, so a typo such as `--config.finetune.stpes=10` is an error instead of a silent no-op.
A config file imports this module only (its option checks are reached through `check_options`).
"""

from __future__ import annotations

import difflib
import logging
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

import ml_collections as mlc

from linvit_jax.runtime.errors import UserError

STAGE_KINDS = ("train", "distill_attention", "finetune", "align")


class OptionError(UserError, ValueError):
  """A config option (`:arg` name or a keyword of `linvit_jax.convert`) that is unknown or whose
  value does not fit its default's type; the message names the option."""


def _unknown(key: str, defaults: Mapping[str, Any]) -> OptionError:
  close = difflib.get_close_matches(key, list(defaults), n=3)
  hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
  if len(defaults) <= 12:
    known = f"known: {', '.join(sorted(defaults))}"
  else:  # a list of dozens of names hides the one line that matters
    known = f"the config file's docstring lists its {len(defaults)} options"
  return OptionError(f"unknown config arg {key!r}{hint} ({known})")


def _parse_text(key: str, value: str, default: Any) -> Any:
  """`value` as the `:arg` text spells it, typed after `default`."""
  if isinstance(default, bool):
    if value.lower() not in ("true", "false", "1", "0"):
      raise OptionError(f"config arg {key}={value!r} is not a boolean")
    return value.lower() in ("true", "1")
  if isinstance(default, (int, float)):
    try:
      return type(default)(value)
    except ValueError:
      what = "an integer" if isinstance(default, int) else "a number"
      raise OptionError(f"config arg {key}={value!r} is not {what}") from None
  return value


def _check_value(key: str, value: Any, default: Any) -> Any:
  """A Python `value` for option `key`, checked against (and converted to) its default's type.

  Text is read as the `:arg` string would spell it (what a CLI wrapper forwards); a path object is
  its string; a square pair (448, 448) is one int where the option is an int (a resolution).
  """
  if isinstance(value, str) and not isinstance(default, str) and default is not None:
    return _parse_text(key, value, default)
  if isinstance(default, bool):
    if type(value).__name__ in ("bool", "bool_"):  # numpy's bool too, never 0 / 1
      return bool(value)
    raise OptionError(f"config arg {key}={value!r} is not a boolean (True or False)")
  if isinstance(default, int):
    if isinstance(value, (list, tuple)) and value and len(set(value)) == 1:
      # Why: a caller may write res=(448, 448); the configs take a square side.
      value = value[0]
    elif isinstance(value, (list, tuple)):
      raise OptionError(
          f"config arg {key}={value!r}: this option is one integer (a square resolution takes "
          "one side)"
      )
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
      return int(value)
    raise OptionError(f"config arg {key}={value!r} is not an integer")
  if isinstance(default, float):
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
      return float(value)
    raise OptionError(f"config arg {key}={value!r} is not a number")
  if isinstance(default, str):
    if isinstance(value, os.PathLike):
      return os.fspath(value)
    if isinstance(value, str):
      return value
    raise OptionError(f"config arg {key}={value!r} is not a string")
  if isinstance(default, tuple):
    if isinstance(value, (list, tuple)):
      return tuple(value)
    raise OptionError(f"config arg {key}={value!r} is not a tuple")
  return value


class _Defaults(Exception):
  """Carries a config's option defaults out of its get_config (option_defaults)."""

  def __init__(self, defaults: dict[str, Any]):
    super().__init__("option defaults")
    self.defaults = defaults


# The arg with which get_config's parse_arg hands back its defaults instead of a config.
_ASK_DEFAULTS = ("linvit_jax: ask the option defaults",)


def option_defaults(get_config: Any) -> dict[str, Any]:
  """The `:arg` options of a config file's `get_config` and their defaults, in its order.

  Read from its parse_arg call, before any of its checks run: a config whose options need a
  real file (init=, images=) still answers.
  """
  try:
    get_config(_ASK_DEFAULTS)
  except _Defaults as e:
    return e.defaults
  raise ValueError(f"{get_config.__module__}.get_config does not read its arg with parse_arg")


def parse_arg(arg: str | Mapping[str, Any] | None, **defaults: Any) -> mlc.ConfigDict:
  """The options of a config file's `get_config(arg)`, typed after `defaults`.

  `arg` is the `:arg` text 'k=v,k2=v2' of `--config file.py:arg` (a value may contain '/' or
  ':', a variant 'S/16' or a path 'gs://b/x.npz', not ','), or a Mapping of Python values (the
  Python API: any string, a bool, a number; each checked against its default's type). An unknown
  name or a value of the wrong type is an OptionError (a UserError and a ValueError).
  """
  if arg is _ASK_DEFAULTS:
    raise _Defaults(dict(defaults))
  out = mlc.ConfigDict(defaults)
  if not arg:
    return out
  if isinstance(arg, Mapping):
    for key, value in arg.items():
      if key not in defaults:
        raise _unknown(key, defaults)
      out[key] = _check_value(key, value, defaults[key])
    return out
  for item in arg.split(","):
    if not item:
      continue
    if "=" not in item:
      raise OptionError(f"config arg {item!r} is not of the form key=value (in {arg!r})")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise _unknown(key, defaults)
    out[key] = _parse_text(key, value, defaults[key])
  return out


def check_options(config: str, arg: mlc.ConfigDict) -> None:
  """Raises a ValueError naming the first option of shipped config `config` (its file's stem)
  whose value `arg` holds out of range or out of its choices (config_checks.py)."""
  # Imported here: config_checks reads this module's tables, and a config file imports only this
  # module (tests/test_layering.py), so the checks are reached through it.
  from linvit_jax.configuration import config_checks

  config_checks.CHECKS[config](arg)


def say_budget(config: str, arg: mlc.ConfigDict, defaults: Mapping[str, Any]) -> None:
  """Logs one warning when shipped config `config`'s budget drops a stage its options ask for,
  or options are set that the run will not read (config_checks.budget_note)."""
  from linvit_jax.configuration import config_checks

  note = config_checks.budget_note(arg, dict(defaults)) if config == "convert_folder" else ""
  if note:
    logging.warning(note)


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
# The fields every config stage block spells out (a locked config takes overrides of these only).
_OPTIMIZER_BLOCK = (
    "name",
    "lr",
    "wd",
    "b2",
    "grad_clip",
    "warmup_steps",
    "schedule",
    "accum_steps",
)


def optimizer(lr: float, **kw: Any) -> dict:
  """An optimizer block: `lr`, the commonly tuned fields at their OPTIMIZER_DEFAULTS, and any
  other OPTIMIZER_DEFAULTS field given in `kw` (e.g. wd=0.0, end_lr_ratio=0.1)."""
  unknown = sorted(set(kw) - set(OPTIMIZER_DEFAULTS))
  if unknown:
    raise ValueError(f"unknown optimizer field(s) {unknown}; known: {sorted(OPTIMIZER_DEFAULTS)}")
  block = {k: OPTIMIZER_DEFAULTS[k] for k in _OPTIMIZER_BLOCK}
  block.update(lr=lr, **kw)
  return block


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


# The stage kinds that read w_structure (a field only when on).
STRUCTURE_KINDS = ("train", "finetune", "align")


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
  # w > 0: the final patch tokens' deviations from their image's mean token matched
  # (distill.token_structure_loss; train / finetune / align). A field only when on: every run
  # recorded before it existed keeps its config, and resumes.
  w_structure = kw.pop("w_structure", 0.0)
  if not (float(w_structure) >= 0.0 and math.isfinite(float(w_structure))):
    raise ValueError(f"w_structure={w_structure!r}: a loss weight is finite and >= 0")
  if w_structure and kind not in STRUCTURE_KINDS:
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
      **({"w_structure": w_structure} if w_structure else {}),
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
      # only when on: runs recorded before the field existed keep resuming
      **({"ema_decay": ema_decay} if ema_decay else {}),
      **({"average_last": average_last} if average_last else {}),
      **({"lora_rank": lora_rank} if lora_rank else {}),
      **kw,
  )


def stage_blocks(config: mlc.ConfigDict) -> list[str]:
  """The names of config's stage blocks (a block with a `kind`), listed in config.stages or not."""
  return [k for k in config.keys() if isinstance(config[k], mlc.ConfigDict) and "kind" in config[k]]


def stage_fields(kind: str) -> set[str]:
  """Every field a `kind` stage block may hold (what `stage` writes, fields only-when-on included)."""
  optional = {"w_structure"} if kind in STRUCTURE_KINDS else set()
  return set(stage(kind, steps=1, batch_size=1, lr=1.0)) | optional


def distill() -> dict:
  """The `distill` block: the distill_attention stage's loss weights (distill.make_distill_loss)."""
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
  """Every field a run understands, with defaults; config files override what they need."""
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
  # softmax attention with the teacher's weights: a hybrid student. attention: the student's
  # operator: a feature map (elu1, relu, hedgehog, hedgehog_exp, favor), a spec, or one per layer.
  c.student = dict(attention="elu1", init="", dont_load=(), softmax_layers=0)
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


# ------------------------------------------------------------------------------ config reference


def field_docs() -> dict[str, str]:
  """One line per field, read from this file's own comments where base_config defines the field.

  Keys are dotted paths; '*' stands for any stage block ("*.steps", "*.optimizer.lr"). A trailing
  `# comment` documents the keyword on its line; a `# name: meaning` comment block above
  `c.<block> = dict(` documents `<block>.name`.
  """
  import ast
  import inspect
  import re
  import sys

  source = inspect.getsource(sys.modules[__name__])
  lines = source.splitlines()
  tree = ast.parse(source)
  docs: dict[str, str] = {}

  def trailing(lineno: int) -> str:
    line = lines[lineno - 1]
    return line.split("  # ", 1)[1].strip() if "  # " in line else ""

  def named(text: str, names: set[str], prefix: str) -> bool:
    """'a: meaning. b: meaning' comments, split at the names of the block's own fields."""
    alternatives = "|".join(sorted(names))
    found = re.findall(rf"\b({alternatives}): (.*?)(?=\s(?:{alternatives}): |$)", text)
    for name, meaning in found:
      docs.setdefault(prefix + name, meaning.strip())
    return bool(found)

  def keywords(call: ast.Call, prefix: str) -> None:
    names = {kw.arg for kw in call.keywords if kw.arg}
    for kw in call.keywords:
      text = trailing(kw.value.end_lineno)
      if kw.arg and text and not named(text, names, prefix):
        docs.setdefault(prefix + kw.arg, text)

  def block_comment(lineno: int, call: ast.Call, prefix: str) -> None:
    i, text = lineno - 2, []
    while i >= 0 and lines[i].strip().startswith("#"):
      text.insert(0, lines[i].strip()[1:].strip())
      i -= 1
    named(" ".join(text), {kw.arg for kw in call.keywords if kw.arg}, prefix)

  scopes = {
      "base_config": "",
      "distill": "distill.",
      "stage": "*.",
      "stage_bookkeeping": "*.",
      "stage_losses": "*.",
  }
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "OPTIMIZER_DEFAULTS":
      keywords(node.value, "*.optimizer.")
    if isinstance(node, ast.FunctionDef) and node.name in scopes:
      for sub in ast.walk(node):
        if isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Attribute):
          name = sub.targets[0].attr
          if isinstance(sub.value, ast.Call) and getattr(sub.value.func, "id", "") == "dict":
            block_comment(sub.lineno, sub.value, f"{name}.")
            keywords(sub.value, f"{name}.")
          elif text := trailing(sub.lineno):
            docs.setdefault(name, text)
        elif isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "dict":
          keywords(sub, scopes[node.name])
  return docs


def describe(config: mlc.ConfigDict) -> str:
  """Every field of `config`, one per line: `path = value  # meaning` (the meaning where the base
  config documents the field)."""
  docs = field_docs()
  flat: list[tuple[str, Any]] = []

  def walk(node: Any, prefix: str) -> None:
    for key in sorted(node.keys()) if hasattr(node, "keys") else ():
      value = node[key]
      if isinstance(value, mlc.ConfigDict):
        walk(value, f"{prefix}{key}.")
      else:
        flat.append((prefix + key, value))

  walk(config, "")
  stages = set(stage_blocks(config))
  out = []
  for path, value in flat:
    head, _, rest = path.partition(".")
    doc = docs.get(path) or (docs.get(f"*.{rest}") if head in stages else None)
    line = f"{path} = {value!r}"
    out.append(f"{line:<60s}  # {doc}" if doc else line)
  return "\n".join(out)
