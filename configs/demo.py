r"""The embedded default: convert the shipped Fashion-MNIST softmax ViT into a linear ViT.

  python -m linvit_jax.main --config configs/demo.py --workdir workdirs/demo
  python -m linvit_jax.main --config configs/demo.py:feature_map=elu1 --workdir workdirs/demo_elu1

Recipe: copy the operator-agnostic weights (`copy_same`), calibrate the fresh attention's output
scale on one batch, distill the attention sublayers teacher-forced (output matching + routing
loss), then fine-tune the whole student on labels plus the teacher's logits. Runs on 2 CPU cores
in a few minutes; every number it prints is measured on the untouched test split.

Args: feature_map (elu1 | relu | hedgehog | favor), policy (copy_same | copy_all | copy_none |
copy_attention_only), distill_steps, finetune_steps, tiny (a few steps, for the tests).
"""

import os

from linvit_jax import config_lib

TEACHER = os.path.join(os.path.dirname(os.path.abspath(config_lib.__file__)), "assets",
                       "teacher_fmnist_vit.npz")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, feature_map="hedgehog", policy="copy_same", distill_steps=300,
                             finetune_steps=200, tiny=False)
  c = config_lib.base_config()
  c.data.pp_train = ('decode(1)|flip_lr|value_range(-1,1)|'
                     'onehot(10,key="label",key_result="labels")|keep("image","labels")')
  c.data.pp_eval = 'decode(1)|value_range(-1,1)|onehot(10,key="label",key_result="labels")|keep("image","labels")'
  c.teacher.init = TEACHER
  c.student.attention = arg.feature_map
  c.surgery.policy = arg.policy
  c.distill_attention = config_lib.stage("distill_attention", steps=arg.distill_steps,
                                         batch_size=64, lr=3e-3, warmup_steps=30, wd=0.0)
  c.finetune = config_lib.stage("finetune", steps=arg.finetune_steps, batch_size=64, lr=2e-4,
                                warmup_steps=20, wd=0.01, w_label=1.0, w_logit_kd=1.0,
                                kd_temperature=2.0)
  if arg.tiny:  # a smoke run: the whole path, a few steps, a slice of the test split
    c.distill_attention.steps = c.finetune.steps = 3
    c.distill_attention.batch_size = c.finetune.batch_size = 16
    c.data.eval_max_examples = 64
    c.data.eval_batch_size = 32
    c.eval.fidelity_images = 16
    c.eval.throughput_batch = 8
    c.data.shuffle_buffer = 256
  return c
