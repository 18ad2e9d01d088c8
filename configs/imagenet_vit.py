r"""Convert an ImageNet ViT to linear attention, on TPU pods (or any JAX devices).

  python -m linvit_jax.main \
    --config configs/imagenet_vit.py:init=gs://big_vision/vit_s16_i1k_300ep.npz,data_dir=gs://BUCKET/tensorflow_datasets \
    --workdir gs://BUCKET/linvit/s16

`init` decides the architecture (the driver reads it from the checkpoint: teacher.architecture=
"init"): a big_vision npz (any layout, AugReg-era included) or a Hugging Face / timm folder. What a
checkpoint cannot tell: `pool=gap|0|none` for a model without cls token or MAP head (default gap,
as big_vision's `vit_s16_i1k`), `norm=minus_one_one|imagenet` (big_vision's [-1, 1], default; DeiT
and DINOv2 use ImageNet mean/std). `variant=S/16` (with `pool=`, `posemb=`, `rep_size=`) describes
the architecture in the config instead, as before.

An i21k (or any other-class) teacher: `head=fresh` leaves its head out (teacher.dont_load and
student.dont_load `head/.*`), gives the student a new 1000-class head trained on labels only
(w_logit_kd=0: there are no teacher logits to distil) and reports no teacher top-1.

The recipe is the one this project measured best (README, "Real pretrained ViTs"): surgery
`copy_all` (the teacher's q/k/v/out start the linear attention), `hedgehog_exp`, distillation lr
1e-3. The seed paper's `policy=copy_same` (fresh attention) needs a larger distillation lr: 3e-2
is its default here (docs/distill_stability.md: fresh attention stalls at 3e-3 and below).

Hyper-parameters taken from big_vision's `configs/vit_s16_i1k.py` where they apply, with its
optimizer semantics (`big_vision/optax.py`, reproduced by `optim.make_optimizer`): batch 1024,
scale_by_adam b2=0.999, gradient clip 1.0, cosine schedule with linear warmup, decoupled weight
decay wd=1e-4 added after the lr scaling (so not multiplied by the lr) and only on `.*/kernel`;
the same preprocessing (inception crop 224 + flip; resize_small 256 + central crop 224; value
range [-1, 1]); training on `train[:99%]`. Evaluation on `validation` (the 50,000 labelled
images: the number papers report; `eval_split=train[99%:]` is big_vision's minival).

Differences, on purpose: no randaug(2,10) and no mixup(p=0.2). big_vision uses them to regularise
300 epochs of training from scratch; here a converged checkpoint is distilled and fine-tuned for
~16 epochs toward its own teacher's logits (KD), where strong augmentation slows the short
fine-tune and the teacher's soft targets already regularise (big_vision's own fine-tuning configs,
`configs/transfer.py`, use neither). mu_dtype stays float32 (big_vision: bfloat16 to save memory).
Our choices (no published value exists for this recipe): distillation 5k steps on attention
parameters only; fine-tuning 20k steps at lr 1e-4 with label + KD losses.
`data_dir` must hold a prepared TFDS imagenet2012 (see launch/README.md).
"""

from linvit_jax.configuration import config_checks
from linvit_jax.configuration import options
from linvit_jax.configuration import recipes


def get_config(arg=None):
  arg = options.parse_arg(
      arg,
      init="gs://big_vision/vit_s16_i1k_300ep.npz",
      variant="",
      feature_map="hedgehog_exp",
      data_dir="",
      policy="copy_all",
      lr_distill=0.0,
      head="keep",
      norm="minus_one_one",
      pool="gap",
      posemb="sincos2d",
      rep_size=True,
      res=224,
      distill_steps=5000,
      finetune_steps=20000,
      batch=1024,
      fsdp=1,
      eval_split="validation",
  )
  config_checks.check_options("imagenet_vit", arg)
  norm_labels = f'{recipes.NORMS[arg.norm]}|onehot(1000,key="label",key_result="labels")'
  data = recipes.labelled_data(
      arg.res,
      norm_labels,
      dataset="imagenet2012",
      data_dir=arg.data_dir,
      train_split="train[:99%]",
      eval_split=arg.eval_split,
      eval_dataset="",
      num_classes=1000,
      eval_max_examples=0,
  )
  c = recipes.labelled_conversion(
      arg,
      data=data,
      finetune=dict(
          warmup_steps=arg.finetune_steps // 20,
          w_label=1.0,
          w_logit_kd=0.0 if arg.head == "fresh" else 1.0,  # a fresh head: no teacher logits
          kd_temperature=1.0,
      ),
  )
  c.eval.fidelity_images = 64
  c.eval.throughput_batch = 64
  c.eval.resolution_factors = (1, 2)
  return c
