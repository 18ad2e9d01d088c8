r"""A tiny config for the robustness tests: the demo's recipe on a width-32, depth-2 ViT.

  python -m linvit_jax.main --config tests/helpers/robust_config.py:teacher=T.npz --workdir W

`teacher` is an npz written by `make_teacher(path)` (a randomly initialised softmax ViT of the
same shape: the tests exercise the machinery, not the accuracy). Every stage is a handful of
steps on batch 8, evaluation on 32 test images, no plots or resolution sweep.

Args: teacher (path; empty: no teacher, `stages=train`), steps (distill_attention),
finetune_steps, checkpoint_every, feature_map, stages ('+'-separated: distill_attention+finetune).
"""

from __future__ import annotations

from linvit_jax.configuration import config_lib
from linvit_jax.configuration import options

MODEL = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=(7, 7))


def make_teacher(path: str, seed: int = 0, **model_over) -> None:
  """Saves a random softmax ViT with MODEL's shape (or `model_over`) as a big_vision npz."""
  import jax
  import numpy as np

  from linvit_jax.models import checkpoints
  from linvit_jax.models import vit

  kw = {**MODEL, **model_over}
  model = vit.Model(
      num_classes=10,
      attention="softmax",
      posemb="learn",
      pool_type="tok",
      head_zeroinit=False,
      **kw,
  )
  params = model.init(jax.random.PRNGKey(seed), np.zeros((1, 28, 28, 1), np.float32))["params"]
  checkpoints.save_npz(path, jax.device_get(params))


def get_config(arg=None):
  arg = options.parse_arg(
      arg,
      teacher="",
      steps=3,
      finetune_steps=3,
      checkpoint_every=1,
      feature_map="elu1",
      stages="distill_attention+finetune",
  )
  c = config_lib.base_config()
  c.model.update(MODEL)
  c.data.pp_train = (
      "decode(1)|value_range(-1,1)|"
      'onehot(10,key="label",key_result="labels")|keep("image","labels")'
  )
  c.data.pp_eval = c.data.pp_train
  c.data.eval_max_examples = 32
  c.data.eval_batch_size = 16
  c.data.shuffle_buffer = 64
  c.teacher.init = arg.teacher
  c.student.attention = arg.feature_map
  c.distill_attention = config_lib.stage(
      "distill_attention", steps=arg.steps, batch_size=8, lr=1e-3, warmup_steps=1
  )
  c.finetune = config_lib.stage(
      "finetune", steps=arg.finetune_steps, batch_size=8, lr=1e-4, warmup_steps=1
  )
  c.train = config_lib.stage("train", steps=arg.steps, batch_size=8, lr=1e-3, warmup_steps=1)
  c.stages = arg.stages.split("+")
  for name in ("distill_attention", "finetune", "train"):
    c[name].checkpoint_every = arg.checkpoint_every
    c[name].log_every = 1
  c.eval.curve_examples = 16
  c.eval.fidelity_images = 8
  c.eval.attention_map_images = 0
  c.eval.throughput_batch = 8
  c.eval.resolution_factors = [1]
  c.eval.plots = False
  return c
