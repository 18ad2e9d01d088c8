r"""Convert a ViT on JFT-style multi-label data (TFRecords of jpeg + label-id lists), TPU pods.

  python -m linvit_jax.main \
    --config 'configs/jft_vit.py:variant=B/16,init=gs://BUCKET/vit_b16_jft.npz,files=gs://BUCKET/jft/train-*.tfrecord,eval_files=gs://BUCKET/jft/val-*.tfrecord,num_classes=18291' \
    --workdir gs://BUCKET/linvit/jft_b16

Labels are multi-hot over `num_classes` and trained with the sigmoid cross-entropy, as big_vision
does for JFT (its `configs/vit_i21k.py`: batch 4096, scale_by_adam b2=0.999, lr 1e-3 with 10k
warmup, decoupled weight decay wd=1e-4 on `.*/kernel` (big_vision's optax.py: added after the lr
scaling, not multiplied by it), gradient clip 1.0, inception crop 224 + flip). The same wd=1e-4
with the same semantics is used for fine-tuning here. Not used: big_vision's randaug/mixup for
i21k (regularisers for from-scratch pre-training; a short KD fine-tune does not need them). Top-1 in
the report counts a hit when the top-scoring class is any positive label.
`init` decides the architecture (teacher.architecture="init", read by the driver) unless
`variant=` describes it here (with `pool=`, `posemb=`, `rep_size=`); `pool=` also says gap / 0 /
none for a checkpoint without cls token or MAP head. A teacher whose head has another class count
is loaded without it (`head=fresh`: a new head trained on labels).
Recipe: `copy_all` + `hedgehog_exp` with distillation lr 1e-3, the project's measured best
(`policy=copy_same` gets its measured lr 3e-2). Distillation 10k steps (attention only),
fine-tuning 50k steps (lr 1e-4).
"""

from linvit_jax.configuration import config_checks
from linvit_jax.configuration import options
from linvit_jax.configuration import recipes


def get_config(arg=None):
  arg = options.parse_arg(
      arg,
      variant="",
      feature_map="hedgehog_exp",
      init="",
      files="",
      eval_files="",
      num_classes=18291,
      policy="copy_all",
      lr_distill=0.0,
      head="keep",
      pool="gap",
      posemb="learn",
      rep_size=False,
      res=224,
      distill_steps=10000,
      finetune_steps=50000,
      batch=4096,
      fsdp=1,
  )
  config_checks.check_options("jft_vit", arg)
  norm_labels = f'value_range(-1,1)|multi_hot({arg.num_classes},key="labels",key_result="labels")'
  data = recipes.labelled_data(
      arg.res,
      norm_labels,
      dataset=f"jft:{arg.files}",
      data_dir="",
      train_split="train",
      eval_split="train",
      # a held-out set of files; otherwise the first 50k training examples
      eval_dataset=f"jft:{arg.eval_files}" if arg.eval_files else "",
      num_classes=arg.num_classes,
      eval_max_examples=50_000,
  )
  return recipes.labelled_conversion(
      arg,
      data=data,
      finetune=dict(warmup_steps=2000, label_loss="sigmoid_xent", w_label=1.0, w_logit_kd=0.0),
  )
