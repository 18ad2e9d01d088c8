r"""The ablation table on the embedded data: which parts of the teacher are worth copying?

  python -m linvit_jax.studies.ablation --config configs/ablation.py --workdir workdirs/ablation
  python -m linvit_jax.studies.ablation --config configs/ablation.py:patch=7 --workdir workdirs/ablation_p7

Arms (see linvit_jax/studies/ablation.py): teacher_ft, random, copy_attention, copy_same,
copy_same_distill, copy_all_distill, copy_same_distill_in_budget — each with the same fine-tune
budget, over `seeds`. Writes ablation.md and ablation.png into the workdir. `patch=7` uses the
17-token teacher (4×4 patches + cls) for the token-count study; the default is 50 tokens.
Args: feature_map, patch (4 | 7), seeds (how many: 0..seeds-1), seed_list ('+'-separated seeds,
instead of `seeds`), finetune_steps, distill_steps, arms ('+'-separated subset), tiny, report_only
(write ablation.md/png from the finished runs, run nothing).

The table can be built in parts, one arm × seed per invocation if need be, in one workdir:
finished runs are skipped, and the report covers every finished run there with the same budget:

  python -m linvit_jax.studies.ablation --config configs/ablation.py:arms=copy_same,seed_list=3 --workdir W
"""

from linvit_jax.configuration import options
from linvit_jax.configuration import recipes

# The arms run by default, in the table's order: every arm linvit_jax/studies/ablation.py defines (its
# ARMS; tests/test_config_files.py keeps the two the same). The driver reads the config, not back.
ARMS = (
    "teacher_ft",
    "random",
    "copy_attention",
    "copy_same",
    "copy_same_distill",
    "copy_all_distill",
    "copy_same_distill_in_budget",
)


def get_config(arg=None):
  arg = options.parse_arg(
      arg,
      feature_map="hedgehog",
      patch=4,
      seeds=3,
      seed_list="",
      finetune_steps=150,
      distill_steps=100,
      arms="+".join(ARMS),
      eval_every=50,
      tiny=False,
      report_only=False,
  )
  c = recipes.fmnist_conversion(
      feature_map=arg.feature_map,
      patch=arg.patch,
      distill_steps=arg.distill_steps,
      finetune_steps=arg.finetune_steps,
      tiny=arg.tiny,
  )
  c.eval.curve_examples = min(c.eval.curve_examples, 1000)
  c.ablation = dict(
      arms=tuple(arg.arms.split("+")),
      seeds=(
          tuple(int(x) for x in str(arg.seed_list).split("+"))
          if str(arg.seed_list)
          else tuple(range(arg.seeds))
      ),
      finetune_steps=arg.finetune_steps,
      distill_steps=arg.distill_steps,
      eval_every=arg.eval_every,
      report_only=arg.report_only,
  )
  if arg.tiny:
    c.ablation.finetune_steps, c.ablation.distill_steps, c.ablation.eval_every = 4, 2, 2
  return c
