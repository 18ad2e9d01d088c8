"""The attention-distillation step on a real pretrained ViT, and what each loss term costs.

    python -m bench.bench_distill_real                       # ../shared/fixtures/real ViT-S/14
    python -m bench.bench_distill_real --init PATH.npz --batch 8 --out OUT.json

The teacher is the checkpoint (DINOv2-style ViT-S/14 at 224 px: 257 tokens), the student its
copy_all surgery with the feature map configs/convert_folder.py defaults to, the step the one
`train.run_stage` runs (`stages.build` + `train_step.make_train_step`, jitted with the frozen
teacher params as an argument). Timed interleaved with the reference matmul (bench/common.py):

  teacher_fwd         one teacher forward (every distill step pays it)
  student_fwdbwd      the student's own forward+backward (a plain training step's core)
  minimal_step        teacher forward + teacher-forced attention nmse + masked adam: the floor
  distill_step        the configured step (attention nmse + routing, the config's defaults)
  no_routing          the same with w_routing = 0       → routing's share
  + lookahead2        + lookahead k=2, w_lookahead = 1  → lookahead's cost
  + feature           + w_feature = 1 (the student's own forward on encoded tokens)
  teacher_fwd_bf16    the teacher forward with bf16 matmuls (float32 accumulation)
  bf16_teacher        distill_step with distill.teacher_dtype_mm = bfloat16
  bf16_both           ... and distill.student_dtype_mm = bfloat16 (mixed precision)

`--extra ",sinks=16"` (convert_folder args) times a lever's student; every ratio is to the
float32 teacher forward measured in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from bench import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "real", "dinov2s14_focus_bv.npz")
VARIANTS = {
    "distill_step": {},
    "no_routing": {"w_routing": 0.0},
    "plus_lookahead2": {"lookahead": 2, "w_lookahead": 1.0},
    "plus_feature": {"w_feature": 1.0},
    "bf16_teacher": {"teacher_dtype_mm": "bfloat16"},
    "bf16_both": {"teacher_dtype_mm": "bfloat16", "student_dtype_mm": "bfloat16"},
}


def _config(init: str, batch: int, feature_map: str, res: int = 224, extra: str = ""):
  """configs/convert_folder.py's recipe for this checkpoint (what a real conversion runs)."""
  import importlib.util

  path = os.path.join(REPO, "configs", "convert_folder.py")
  spec = importlib.util.spec_from_file_location("convert_folder", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  with tempfile.TemporaryDirectory() as folder:  # the config checks that the folder exists
    return mod.get_config(
        f"init={init},images={folder},batch={batch},feature_map={feature_map},res={res}{extra}"
    )


def build(
    init: str,
    batch: int,
    feature_map: str,
    only: Sequence[str] = (),
    res: int = 224,
    extra: str = "",
) -> dict[str, Any]:
  """The compiled cases with their arguments, and the config."""
  from linvit_jax import build
  from linvit_jax.conversion import surgery
  from linvit_jax.models import vit_checkpoint

  c = build.resolve_from_init(_config(init, batch, feature_map, res, extra))
  teacher, student = build.models(c)
  size = c.data.image_size
  rng = jax.random.PRNGKey(0)
  images = jax.random.normal(rng, (batch, size, size, 3), jnp.float32)
  b = {"image": images}
  t_init = jax.jit(teacher.init)(rng, images[:1])["params"]
  t_params = jax.tree.map(
      jnp.asarray, vit_checkpoint.load_vit_params(t_init, init, build.model_kwargs(c.model))
  )
  s_init = jax.jit(student.init)(jax.random.PRNGKey(1), images[:1])["params"]
  s_params, _ = surgery.transplant(t_params, s_init, c.surgery.policy)

  cases = {}
  teacher_fwd = jax.jit(lambda tp, im: teacher.apply({"params": tp}, im)[1]["encoded"])
  if not only or "teacher_fwd" in only:
    cases["teacher_fwd"] = (teacher_fwd.lower(t_params, images).compile(), (t_params, images))
  teacher16 = teacher.clone(dtype_mm="bfloat16")
  teacher16_fwd = jax.jit(lambda tp, im: teacher16.apply({"params": tp}, im)[1]["encoded"])
  if not only or "teacher_fwd_bf16" in only:
    cases["teacher_fwd_bf16"] = (
        teacher16_fwd.lower(t_params, images).compile(),
        (t_params, images),
    )

  def own_loss(sp, im):  # the student's own forward+backward, on a feature target
    return jnp.mean(student.apply({"params": sp}, im)[1]["encoded"] ** 2)

  fb = jax.jit(jax.value_and_grad(own_loss))
  if not only or "student_fwdbwd" in only:
    cases["student_fwdbwd"] = (fb.lower(s_params, images).compile(), (s_params, images))

  cases.update(_step_cases(c, teacher, student, t_params, s_params, b, only))
  return {"cases": cases, "config": c}


def _step_cases(c, teacher, student, t_params, s_params, b, only: Sequence[str]) -> dict:
  """name -> (compiled step, its args): the distill_attention step with each of VARIANTS'
  distill overrides, and the minimal step (`_minimal_loss`), as train.run_stage builds them."""
  from linvit_jax.conversion import optim
  from linvit_jax.conversion import stages
  from linvit_jax.conversion import train
  from linvit_jax.conversion import train_step

  cases = {}
  stage_cfg = c.distill_attention
  settings = train.stage_settings(stage_cfg)
  for name, overrides in {"minimal_step": {"w_routing": 0.0, "minimal": True}, **VARIANTS}.items():
    if only and name not in only:
      continue
    cc = c.copy_and_resolve_references()
    for k, v in overrides.items():
      if k != "minimal":
        cc.distill[k] = v
    loss_fn, mask = stages.build(stage_cfg.kind, stage_cfg, cc, teacher, student, s_params)
    if overrides.get("minimal"):
      loss_fn = _minimal_loss(teacher, student)
    mask = optim.trainable_mask(s_params, mask)
    tx, schedule = optim.make_optimizer(settings["optimizer"], settings["steps"], mask)
    step = jax.jit(train_step.make_train_step(loss_fn, tx, schedule, mask))
    state = train_step.init_train_state(s_params, tx, jax.random.PRNGKey(2))
    cases[name] = (step.lower(state, t_params, b).compile(), (state, t_params, b))
  return cases


def _minimal_loss(teacher, student):
  """Teacher forward + teacher-forced student attention + nmse, nothing else (the floor)."""
  from linvit_jax.models import probe

  def loss(sp, tp, batch, rng):
    targets = probe.teacher_targets(teacher, tp, batch["image"])
    sa = probe.student_attention_outputs(student, sp, targets["attn_input"])
    err = jnp.mean((sa - targets["sa"]) ** 2, axis=(1, 2, 3))
    l = jnp.mean(err / (jnp.var(targets["sa"], axis=(1, 2, 3)) + 1e-6))
    return l, {"loss": l}

  return loss


def _row(name: str, t: Any, batch: int) -> dict[str, Any]:
  """One case's timings: ms, images/s, and its cost against distill_step, teacher_fwd and
  student_fwdbwd (those that ran)."""
  s = common.median(t.wall[name])

  def vs(other: str) -> float | None:
    return common.median_ratio(t.wall[name], t.wall[other]) if other in t.wall else None

  return dict(
      name=name,
      ms=1e3 * s,
      images_per_s=batch / s,
      vs_distill_step=common.median_ratio(t.wall[name], t.wall["distill_step"]),
      vs_teacher_fwd=vs("teacher_fwd"),
      vs_student_fwdbwd=vs("student_fwdbwd"),
      times_s=t.wall[name],
      matmul_times_s=t.ref_wall[name],
  )


def _shares(rows: list[dict[str, Any]], base: float) -> dict[str, float]:
  """The share of the step each term costs, from the cases that ran (all of them unless --only);
  `base`: distill_step's median seconds."""
  by = {r["name"]: r for r in rows}
  shares = {}
  if "no_routing" in by:
    shares["routing (of distill_step)"] = 1 - by["no_routing"]["ms"] / by["distill_step"]["ms"]
  if "plus_lookahead2" in by:
    shares["lookahead k=2 (added, of that step)"] = 1 - base * 1e3 / by["plus_lookahead2"]["ms"]
  if "plus_feature" in by:
    shares["feature alignment (added, of that step)"] = 1 - base * 1e3 / by["plus_feature"]["ms"]
  if "teacher_fwd" in by:
    shares["teacher forward (of distill_step)"] = by["teacher_fwd"]["ms"] / by["distill_step"]["ms"]
  return shares


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--init", default=REAL, help="big_vision ViT checkpoint (.npz)")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--res", type=int, default=224, help="image side (the posemb is resampled)")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--feature-map", default="hedgehog_exp")
  p.add_argument("--only", default="", help="comma-separated case names (diagnosis)")
  p.add_argument(
      "--extra", default="", help='convert_folder args for the student, e.g. ",sinks=16"'
  )
  p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "distill_real.json"))
  args = p.parse_args(argv)
  t0 = time.time()
  built = build(
      args.init,
      args.batch,
      args.feature_map,
      tuple(filter(None, args.only.split(","))),
      args.res,
      args.extra,
  )
  print(f"compiled {len(built['cases'])} cases in {time.time() - t0:.0f}s", flush=True)
  n = common.REFERENCE_N
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  mm = jax.jit(jnp.matmul)
  calls = {k: (lambda fn=fn, xs=xs: fn(*xs)) for k, (fn, xs) in built["cases"].items()}
  t = common.time_interleaved(calls, reps=args.reps, reference=lambda: mm(a, a))
  rows = [_row(name, t, args.batch) for name in calls]
  shares = _shares(rows, common.median(t.wall["distill_step"]))
  c = built["config"]
  result = dict(
      init=os.path.basename(args.init),
      extra=args.extra,
      batch=args.batch,
      feature_map=args.feature_map,
      image_size=c.data.image_size,
      model={k: v for k, v in c.model.to_dict().items()},
      distill=c.distill.to_dict(),
      matmul_gflops=2.0 * n**3 / common.median(sum(t.ref_wall.values(), [])) / 1e9,
      machine=common.machine_summary(),
      rows=rows,
      shares=shares,
      wall_s=time.time() - t0,
      date=time.strftime("%Y-%m-%d %H:%M"),
  )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  for r in rows:
    print(
        f"{r['name']:16s} {r['ms']:8.0f} ms {r['images_per_s']:6.2f} img/s "
        f"{r['vs_distill_step']:.2f}x distill_step"
        + (f", {r['vs_teacher_fwd']:.2f}x teacher_fwd" if r["vs_teacher_fwd"] else "")
    )
  for k, v in shares.items():
    print(f"  share {k}: {100 * v:.0f} %")
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
