r"""The embedded default: convert the shipped Fashion-MNIST softmax ViT into a linear ViT.

  python -m linvit_jax.main --config configs/demo.py --workdir workdirs/demo
  python -m linvit_jax.main --config configs/demo.py:feature_map=elu1 --workdir workdirs/demo_elu1

Recipe: copy the operator-agnostic weights (`copy_same`), calibrate the fresh attention's output
scale on one batch, distill the attention sublayers teacher-forced (output matching + routing
loss), then fine-tune the whole student on labels plus the teacher's logits. Runs on 2 CPU cores
in minutes; every number it prints is measured on the untouched test split.

Args: feature_map (elu1 | relu | hedgehog | favor), policy (copy_same | copy_all | copy_none |
copy_attention_only), distill_steps, finetune_steps, the levers inside each linear layer
(center_keys, conv_v, window, sinks, exact_prefix: attention.AttentionSpec's options, off by default),
align_steps (0: off; n: convert_folder's label-free `align` stage, every parameter, param_rms steps
at lr 2e-4, between the distillation and the fine-tune), align_lora (r > 0: that stage's kernels
move within rank-r updates, LoRA; 0: off), tiny (a few steps, for the tests).
"""

from linvit_jax.configuration import config_checks
from linvit_jax.configuration import config_lib
from linvit_jax.configuration import options
from linvit_jax.configuration import recipes


def get_config(arg=None):
  arg = options.parse_arg(
      arg,
      feature_map="hedgehog",
      policy="copy_same",
      distill_steps=300,
      finetune_steps=200,
      center_keys=False,
      conv_v=False,
      window=0,
      sinks=0,
      exact_prefix=False,
      align_steps=0,
      align_lora=0,
      tiny=False,
  )
  config_checks.check_options("demo", arg)
  c = recipes.fmnist_conversion(
      feature_map=arg.feature_map,
      distill_steps=arg.distill_steps,
      finetune_steps=arg.finetune_steps,
      tiny=arg.tiny,
  )
  c.surgery.policy = arg.policy
  c.student = dict(
      c.student.to_dict(preserve_field_references=True),  # softmax_key_grid takes either form
      attention=recipes.attention_of(arg),
  )
  if arg.align_steps:  # convert_folder's label-free end-to-end stage, at its default settings
    steps = 3 if arg.tiny else arg.align_steps
    c.align = config_lib.align_stage(
        steps=steps, batch_size=c.finetune.batch_size, lora_rank=arg.align_lora
    )
    c.stages = ("distill_attention", "align", "finetune")
  return c
