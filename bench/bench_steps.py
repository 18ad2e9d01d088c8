"""Cost of the two training steps (attention distillation, fine-tuning) vs a plain forward+backward.

    python -m bench.bench_steps                    # ViT-S/16 at 224 px, batch 8 (CPU)
    python -m bench.bench_steps --plan gpu         # same, bf16 matmuls, 8192³ reference
    python -m bench.bench_steps --plan smoke       # "mu/16" at 64 px, seconds

The steps are the project's own: the model, distill and stage blocks of configs/imagenet_vit.py,
`stages.build` for the loss and trainable mask, `optim.make_optimizer` and
`train_step.make_train_step` (jitted exactly as the stage runner calls them:
`step(state, frozen_teacher_params, batch)`); the JSON names them (`implementation`).

Timed interleaved with the reference matmul, median of the rounds, warm-up excluded:
  student_fwdbwd  plain student forward+backward (label xent), no optimizer: the 1.5x yardstick
  teacher_fwd     one softmax-teacher forward (what distillation adds on top of the student)
  distill_step    one distill_attention train step (teacher forward + teacher-forced student
                  attention layers + routing loss + masked AdamW update)
  finetune_step   one finetune train step (student forward+backward, label + teacher-logit KD)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mlc

from bench import common
from linvit_jax import build
from linvit_jax.conversion import optim
from linvit_jax.conversion import stages
from linvit_jax.conversion import train
from linvit_jax.conversion import train_step
from linvit_jax.models import attention as attn_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLEMENTATION = "project (stages.build + train.make_train_step, configs/imagenet_vit.py)"


def _project_config(variant: str, feature_map: str, image_size: int) -> mlc.ConfigDict:
  """configs/imagenet_vit.py, the recipe a real conversion of ViT-S/16 runs."""
  spec = importlib.util.spec_from_file_location(
      "imagenet_vit", os.path.join(REPO, "configs", "imagenet_vit.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(f"variant={variant},feature_map={feature_map},res={image_size},init=none")


def _flops(c: mlc.ConfigDict, feature_map: str, image_size: int) -> dict[str, float]:
  """Analytic FLOPs per image of each step (see common.py for the conventions)."""
  variant = c.model.variant
  d = common.vit_dims(variant)
  n = common.tokens_for(image_size, d["patch"], cls_token=c.model.pool_type == "tok")
  student_spec = attn_lib.parse_spec(feature_map)
  teacher_spec = attn_lib.AttentionSpec()
  cls = c.model.pool_type == "tok"
  student = common.vit_flops(student_spec, image_size, variant, cls_token=cls)
  teacher = common.vit_flops(teacher_spec, image_size, variant, cls_token=cls)
  # Teacher-forced attention layers train their params only: no gradient w.r.t. the (teacher's)
  # input, so the q/k/v projections' input-gradient matmuls are skipped: 9 projection matmuls
  # (4 forward, out: 2 backward, q/k/v: 1 backward each) + 3x the core.
  proj = 2.0 * n * d["width"] ** 2
  core = common.attention_core_flops(student_spec, n, d["heads"], d["head_dim"])
  forced = d["depth"] * (9 * proj + 3 * core)
  return dict(
      student_fwdbwd=3 * student,
      teacher_fwd=teacher,
      distill_step=teacher + forced,
      finetune_step=3 * student + teacher,
  )


def _project_steps(c: mlc.ConfigDict, batch: dict[str, jax.Array], rng: jax.Array):
  """The distill and finetune steps exactly as train.run_stage builds them."""
  teacher, student = build.models(c)
  k_t, k_s, k_state = jax.random.split(rng, 3)
  t_params = jax.jit(teacher.init)(k_t, batch["image"][:1])["params"]
  s_params = jax.jit(student.init)(k_s, batch["image"][:1])["params"]
  steps = {}
  for name in ("distill_attention", "finetune"):
    stage_cfg = c[name]
    loss_fn, mask = stages.build(stage_cfg.kind, stage_cfg, c, teacher, student, s_params)
    mask = optim.trainable_mask(s_params, mask)
    settings = train.stage_settings(stage_cfg)
    tx, schedule = optim.make_optimizer(settings["optimizer"], settings["steps"], mask)
    step = jax.jit(train_step.make_train_step(loss_fn, tx, schedule, mask), donate_argnums=())
    state = train_step.init_train_state(s_params, tx, k_state)
    steps[name] = (step, state)
  return teacher, student, t_params, s_params, steps


def _compiled_cases(c: mlc.ConfigDict, batch: dict[str, jax.Array], rng: jax.Array) -> dict:
  """name -> (compiled fn, its args): the student's plain fwd+bwd, the teacher's forward and the
  project's distill and finetune steps."""
  teacher, student, t_params, s_params, steps = _project_steps(c, batch, rng)
  images = batch["image"]

  def xent(logits, y):
    return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits.astype(jnp.float32)), -1))

  student_fb = jax.jit(
      jax.value_and_grad(
          lambda sp, b: xent(student.apply({"params": sp}, b["image"])[0], b["labels"])
      )
  )
  teacher_fwd = jax.jit(lambda tp, im: teacher.apply({"params": tp}, im)[0])
  (dist_step, dist_state), (ft_step, ft_state) = steps["distill_attention"], steps["finetune"]
  return dict(
      student_fwdbwd=(student_fb.lower(s_params, batch).compile(), (s_params, batch)),
      teacher_fwd=(teacher_fwd.lower(t_params, images).compile(), (t_params, images)),
      distill_step=(
          dist_step.lower(dist_state, t_params, batch).compile(),
          (dist_state, t_params, batch),
      ),
      finetune_step=(
          ft_step.lower(ft_state, t_params, batch).compile(),
          (ft_state, t_params, batch),
      ),
  )


def _rows(t: Any, flops: dict[str, float], memory: dict, batch_size: int, ref_flops: float) -> list:
  """One row per case from the interleaved timings `t`: ms, images/s, share of the matmul rate,
  cost against the student's plain fwd+bwd, memory."""
  rows = []
  for name in ("student_fwdbwd", "teacher_fwd", "distill_step", "finetune_step"):
    s = common.median(t.wall[name])
    f = batch_size * flops[name]
    rows.append(
        dict(
            name=name,
            ms=1e3 * s,
            images_per_s=batch_size / s,
            gflops=f / s / 1e9,
            matmul_gflops=ref_flops / common.median(t.ref_wall[name]) / 1e9,
            pct_matmul=100 * common.efficiency(f, t.wall[name], ref_flops, t.ref_wall[name]),
            pct_matmul_cpu_time=100 * common.efficiency(f, t.cpu[name], ref_flops, t.ref_cpu[name]),
            cost_vs_student_fwdbwd=common.median_ratio(t.wall[name], t.wall["student_fwdbwd"]),
            flops_per_image=flops[name],
            times_s=t.wall[name],
            cpu_s=t.cpu[name],
            matmul_times_s=t.ref_wall[name],
            memory=memory[name],
        )
    )
  return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--plan", default="cpu", choices=("cpu", "gpu", "smoke"))
  p.add_argument("--out", default=None)
  p.add_argument("--feature-map", default="hedgehog", help="the student's (config default)")
  p.add_argument("--batch", type=int, default=None)
  p.add_argument("--reps", type=int, default=None)
  args = p.parse_args(argv)

  smoke, gpu = args.plan == "smoke", args.plan == "gpu"
  variant, size = ("mu/16", 32) if smoke else ("S/16", 224)
  batch_size = args.batch or (2 if smoke else 8)
  reps = args.reps or (2 if smoke else 7)
  ref_n = 8192 if gpu else 256 if smoke else common.REFERENCE_N
  dtype = "bfloat16" if gpu else "float32"
  out_path = args.out or os.path.join(REPO, "bench", "results", f"{args.plan}_steps.json")
  t_start = time.time()

  c = _project_config(variant, args.feature_map, size)
  c.model.dtype_mm = dtype
  c.model.num_classes = 1000
  rng = jax.random.PRNGKey(0)
  images = jax.random.normal(rng, (batch_size, size, size, 3), jnp.float32)
  labels = jax.nn.one_hot(jax.random.randint(rng, (batch_size,), 0, 1000), 1000)
  compiled = _compiled_cases(c, {"image": images, "labels": labels}, rng)
  memory = {k: common.memory_stats(fn) for k, (fn, _) in compiled.items()}
  a = jax.random.normal(rng, (ref_n, ref_n), jnp.float32).astype(dtype)
  mm = jax.jit(jnp.matmul)
  cases = {k: (lambda fn=fn, args=args: fn(*args)) for k, (fn, args) in compiled.items()}
  print(f"compiled in {time.time() - t_start:.0f}s; timing {reps} rounds", flush=True)
  t = common.time_interleaved(cases, reps=reps, reference=lambda: mm(a, a))

  ref_flops = 2.0 * ref_n**3
  rows = _rows(t, _flops(c, args.feature_map, size), memory, batch_size, ref_flops)
  result = dict(
      plan=args.plan,
      implementation=IMPLEMENTATION,
      variant=variant,
      image_size=size,
      batch=batch_size,
      feature_map=args.feature_map,
      dtype=dtype,
      model=c.model.to_dict(),
      distill=c.distill.to_dict(),
      matmul_gflops=ref_flops / common.median(sum(t.ref_wall.values(), [])) / 1e9,
      reference_n=ref_n,
      machine=common.machine_summary(),
      rows=rows,
      wall_s=time.time() - t_start,
      date=time.strftime("%Y-%m-%d %H:%M"),
  )
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  with open(out_path, "w") as f:
    json.dump(result, f, indent=1)
  for r in rows:
    print(
        f"{r['name']:15s} {r['ms']:9.1f} ms  {r['images_per_s']:7.2f} img/s  "
        f"{r['pct_matmul']:5.1f}% of matmul  {r['cost_vs_student_fwdbwd']:.2f}x student f+b"
    )
  print(f"wrote {out_path} after {result['wall_s']:.0f}s")
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
