"""Training at the resolution the student is deployed at (convert_folder's `deploy_res`): the
position table resampled inside the forward by the rule the report and `load_student` use, a
stage at its own image_size, and the run end to end at a tiny size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linvit_jax.models import posemb
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime.errors import ConfigError
from tests.helpers.tiny_teacher import TINY
from tests.helpers.tiny_teacher import convert_folder_config as _config
from tests.helpers.tiny_teacher import headless_checkpoint as _headless_checkpoint
from tests.helpers.tiny_teacher import smooth_photos as _photos


@pytest.mark.parametrize(
    "old, new",
    [((4, 4), (8, 8)), ((16, 16), (64, 64)), ((8, 8), (4, 4)), ((6, 4), (9, 10)), ((5, 5), (5, 5))],
)
def test_in_graph_resampling_is_resample_posemb(old, new):
  pe = np.random.RandomState(0).randn(1, old[0] * old[1], 6).astype(np.float32)
  want = posemb.resample_posemb(pe, (1, new[0] * new[1], 6), old, new)
  got = vit.resample_posemb_in_graph(jnp.asarray(pe), old, new)
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


def test_zoom_matrix_rows_are_interpolation_weights():
  m = posemb.zoom_matrix(4, 7)
  assert m.shape == (7, 4)
  np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-6)  # a convex blend of two inputs
  assert (m >= 0).all() and ((m > 0).sum(axis=1) <= 2).all()
  np.testing.assert_allclose(m[[0, -1]], np.eye(4)[[0, -1]])  # corners map to corners


def test_a_model_with_posemb_grid_runs_any_size_as_the_resampled_params_do():
  model = vit.Model(**TINY)
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3), np.float32))["params"]
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 64, 64, 3))
  at_grid = model.clone(posemb_grid=(4, 4))
  _, out = at_grid.apply({"params": params}, images)  # the params keep their 4x4 table
  resampled = vit_checkpoint.with_posemb_grid(params, (8, 8))
  _, want = model.apply({"params": resampled}, images)
  np.testing.assert_allclose(out["encoded"], want["encoded"], atol=2e-5)
  # The stored table trains through the resampling.
  grads = jax.grad(lambda p: jnp.sum(at_grid.apply({"params": p}, images)[1]["encoded"] ** 2))(
      params
  )
  assert grads["pos_embedding"].shape == params["pos_embedding"].shape
  assert float(jnp.abs(grads["pos_embedding"]).max()) > 0
  # At its own grid the field changes nothing.
  _, same = at_grid.apply({"params": params}, images[:, :32, :32])
  _, plain = model.apply({"params": params}, images[:, :32, :32])
  np.testing.assert_array_equal(same["encoded"], plain["encoded"])


def test_deploy_res_adds_a_stage_at_that_size(tmp_path):
  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  extra = ",tiny=False,max_images=400,distill_fraction=0.5,deploy_res=64,deploy_fraction=0.5"
  config = _config(path, str(tmp_path), extra)
  plain = _config(path, str(tmp_path), ",tiny=False,max_images=400,distill_fraction=0.5")
  assert config.stages == ("distill_attention", "align", "align_deploy")
  deploy, align = config.align_deploy, config.align
  assert deploy.kind == "align" and deploy.image_size == 64 and align.image_size == 0
  assert "inception_crop(64)" in deploy.pp_train and align.pp_train == ""
  assert deploy.batch_size == 1  # batch 4 at 32 px: as many pixels as one 64-px view
  assert deploy.mixup == 0.0 and align.mixup == 1.0  # no batch neighbour to blend at batch 1
  assert align.steps + deploy.steps == plain.align.steps and deploy.steps == plain.align.steps // 2
  for same in (",deploy_res=32", ",deploy_res=0"):  # the training size itself, or off
    assert _config(path, str(tmp_path), extra.replace(",deploy_res=64", "") + same).stages == (
        "distill_attention",
        "align",
    )
  with pytest.raises(ValueError, match="deploy_fraction=1.0"):
    _config(path, str(tmp_path), extra.replace("deploy_fraction=0.5", "deploy_fraction=1.0"))


def test_deploy_res_not_a_multiple_of_the_patch_is_refused_before_work(tmp_path):
  from linvit_jax import build
  from linvit_jax import preflight

  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  _photos(str(tmp_path / "photos"))
  config = _config(path, str(tmp_path / "photos"), ",deploy_res=60,batch=8")
  config = build.resolve_from_init(config)
  with pytest.raises(
      ConfigError,
      match=r"config.align_deploy.image_size=60 \(convert_folder: "
      r"deploy_res=60\) is not a multiple of the model's 8-px patch",
  ):
    preflight.validate(config)


def test_a_run_with_deploy_res_trains_there_and_keeps_the_grid(tmp_path):
  from linvit_jax import build
  from linvit_jax import run as run_lib

  path = str(tmp_path / "t.npz")
  _headless_checkpoint(path)
  _photos(str(tmp_path / "photos"))
  config = _config(path, str(tmp_path / "photos"), ",deploy_res=64,knn=none,batch=8")
  shapes = []
  real_iter_fn = build.train_iter_fn

  def recording_iter_fn(config, batch_size, seed, pp="", mixup=0.0):
    make = real_iter_fn(config, batch_size, seed, pp=pp, mixup=mixup)

    def first_shape(*a, **kw):
      it = make(*a, **kw)
      batch = next(it)
      shapes.append(np.shape(batch["image"])[1:3])
      yield batch
      yield from it

    return first_shape

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(build, "train_iter_fn", recording_iter_fn)
    results = run_lib.run(config, str(tmp_path / "work"))
  assert shapes == [(32, 32), (32, 32), (64, 64)]
  assert "align_deploy" in results["timing_s"] and "fidelity_after_align_deploy" in results
  student = np.load(str(tmp_path / "work" / "student.npz"))
  assert student["pos_embedding"].shape == (1, 16, 32)  # the training grid, 4x4
