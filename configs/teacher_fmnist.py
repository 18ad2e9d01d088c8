r"""Trains the demo's softmax ViT teacher on the embedded Fashion-MNIST (no teacher, one stage).

This is the config that produced the shipped `linvit_jax/assets/teacher_fmnist_vit.npz`:

  python -m linvit_jax.main --config configs/teacher_fmnist.py:epochs=3 --workdir workdirs/teacher
  cp workdirs/teacher/student.npz linvit_jax/assets/teacher_fmnist_vit.npz

and the 17-token teacher of the token-count study (`teacher_fmnist_vit_p7.npz`):

  python -m linvit_jax.main --config configs/teacher_fmnist.py:epochs=2,patch=7 \
      --workdir workdirs/teacher_p7

Model: width 128, depth 4, 4 heads, MLP 256, patch 4 on 28×28 → 7×7 = 49 patches + cls = 50 tokens
(enough tokens that attention routing is not trivial, cheap enough for 2 CPU cores).
`:epochs=` sets the training length (default 4), `:patch=` the patch size (4 or 7).
"""

from linvit_jax.configuration import config_lib
from linvit_jax.configuration import options
from linvit_jax.configuration import recipes

STEPS_PER_EPOCH = 60_000 // 128


def get_config(arg=None):
  arg = options.parse_arg(arg, epochs=4, patch=4)
  c = config_lib.base_config()
  c.model.patch_size = (arg.patch, arg.patch)
  c.data.pp_train, c.data.pp_eval = recipes.FMNIST_PP_TRAIN, recipes.FMNIST_PP_EVAL
  c.teacher.init = ""
  c.student.attention = "softmax"
  c.surgery.policy = "copy_none"
  c.surgery.calibrate = False
  c.stages = ("train",)
  # wd: big_vision's decoupled decay, the per-step decay of the optax.adamw(weight_decay=0.05) at
  # lr 2e-3 that trained the shipped teacher (which also decayed pos_embedding and cls).
  c.train = config_lib.stage(
      "train",
      steps=arg.epochs * STEPS_PER_EPOCH,
      batch_size=128,
      lr=2e-3,
      wd=1e-4,
      warmup_steps=STEPS_PER_EPOCH // 2,
  )
  c.eval.attention_map_images = 0
  c.eval.resolution_factors = (1,)
  return c
