r"""The ablation table on the embedded data: which parts of the teacher are worth copying?

  python -m linvit_jax.main --config configs/ablation.py --workdir workdirs/ablation
  python -m linvit_jax.main --config configs/ablation.py:patch=7 --workdir workdirs/ablation_p7

Arms (see linvit_jax/ablation.py): teacher_ft, random, copy_attention, copy_same,
copy_same_distill, copy_all_distill, copy_same_distill_in_budget — each with the same fine-tune
budget, over `seeds`. Writes ablation.md and ablation.png into the workdir. `patch=7` uses the
17-token teacher (4×4 patches + cls) for the token-count study; the default is 50 tokens.
Args: feature_map, patch (4 | 7), seeds (how many), finetune_steps, distill_steps, arms
('+'-separated subset), tiny.
"""

import os

from linvit_jax import config_lib
from linvit_jax.ablation import ARMS

ASSETS = os.path.join(os.path.dirname(os.path.abspath(config_lib.__file__)), "assets")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, feature_map="hedgehog", patch=4, seeds=3, finetune_steps=150,
                             distill_steps=100, arms="+".join(ARMS), eval_every=50, tiny=False)
  c = config_lib.base_config()
  c.model.patch_size = (arg.patch, arg.patch)
  c.data.pp_train = ('decode(1)|flip_lr|value_range(-1,1)|'
                     'onehot(10,key="label",key_result="labels")|keep("image","labels")')
  c.data.pp_eval = 'decode(1)|value_range(-1,1)|onehot(10,key="label",key_result="labels")|keep("image","labels")'
  c.teacher.init = os.path.join(ASSETS, "teacher_fmnist_vit.npz" if arg.patch == 4
                                else f"teacher_fmnist_vit_p{arg.patch}.npz")
  c.student.attention = arg.feature_map
  c.distill_attention = config_lib.stage("distill_attention", steps=arg.distill_steps,
                                         batch_size=64, lr=3e-3, warmup_steps=30, wd=0.0)
  c.finetune = config_lib.stage("finetune", steps=arg.finetune_steps, batch_size=64, lr=2e-4,
                                warmup_steps=20, wd=0.01, w_label=1.0, w_logit_kd=1.0,
                                kd_temperature=2.0)
  c.ablation = dict(arms=arg.arms.split("+"), seeds=list(range(arg.seeds)),
                    finetune_steps=arg.finetune_steps, distill_steps=arg.distill_steps,
                    eval_every=arg.eval_every)
  if arg.tiny:
    c.ablation.finetune_steps, c.ablation.distill_steps, c.ablation.eval_every = 4, 2, 2
    c.distill_attention.batch_size = c.finetune.batch_size = 16
    c.data.eval_max_examples, c.data.eval_batch_size = 64, 32
    c.eval.fidelity_images, c.eval.throughput_batch = 16, 8
    c.eval.curve_examples = 32
    c.data.shuffle_buffer = 256
  c.eval.curve_examples = min(c.eval.curve_examples, 1000)
  return c
