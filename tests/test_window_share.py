"""studies/window_share: the window's key mask against an explicit loop (border, the query's own
patch), the teacher's masses against a brute-force numpy softmax on a tiny ViT (a 10×10 grid: the
hybrid's tiles padded, borders, sinks), a window over the whole grid holding all the mass, the
parts adding up, and the CLI with and without a student."""

import json
import os

import jax
import numpy as np
import pytest

from linvit_jax.models import checkpoints
from linvit_jax.models import layout
from linvit_jax.models import vit
from linvit_jax.studies import window_share
from tests.helpers import student_export
from tests.helpers import tiny_teacher

SIDE = 10  # 40 px at patch 4: tiled 6×6 with padding for a 3×3 window (grid_tiles), 2 prefix tokens
IMAGES = np.random.RandomState(0).randn(2, 4 * SIDE, 4 * SIDE, 3).astype(np.float32)


def _explicit_window(side: int, window: int) -> np.ndarray:
  r = window // 2
  out = np.zeros((side * side, side * side), bool)
  for qi in range(side):
    for qj in range(side):
      for ki in range(max(0, qi - r), min(side, qi + r + 1)):
        for kj in range(max(0, qj - r), min(side, qj + r + 1)):
          out[qi * side + qj, ki * side + kj] = True
  return out


@pytest.mark.parametrize("side,window", [(4, 3), (10, 3), (10, 5), (13, 3), (9, 1)])
def test_the_window_is_the_hybrids_band_clipped_at_the_border_with_the_query_in_it(side, window):
  near = window_share.neighbourhood(side, window)
  np.testing.assert_array_equal(near, _explicit_window(side, window))
  assert near[0].sum() == (window // 2 + 1) ** 2 and np.all(np.diag(near))


@pytest.fixture(scope="module")
def teacher():
  model = vit.Model(**student_export.FIELDS, attention="softmax")
  params = jax.jit(model.init)(jax.random.PRNGKey(0), IMAGES[:1])["params"]
  params = jax.tree.map(np.asarray, params)
  # a cls token that is not all zeros; sharper attention than at init, so masses differ
  params["cls"] = np.full_like(params["cls"], 0.5)
  for name in layout.block_names(params):
    attn = params["Transformer"][name][layout.ATTN]
    attn["query"]["kernel"] = 4 * attn["query"]["kernel"]
  return model, params


def _brute_force(model, params, window: int, sinks: int) -> list[dict[str, float]]:
  """Every mass from the full softmax in float64, the explicit window mask and sinks picked by
  numpy's argsort."""
  qs, ks = window_share._queries_keys(model, params, IMAGES)  # what the layers sow
  prefix, out = model.num_prefix_tokens, []
  near = _explicit_window(SIDE, window) if window else np.zeros((SIDE**2, SIDE**2), bool)
  for layer in range(model.depth):
    q, k = np.asarray(qs[layer], np.float64), np.asarray(ks[layer], np.float64)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True))[:, :, prefix:]  # patch query rows
    kp = k[:, prefix:] - k[:, prefix:].mean(1, keepdims=True)
    top = np.argsort(-np.sum(kp**2, -1), axis=1)[:, :sinks]  # [B,m,H]
    is_sink = np.zeros(probs.shape[:2] + (SIDE**2,), bool)  # [B,H,M]
    for b, h in np.ndindex(*is_sink.shape[:2]):
      is_sink[b, h, top[b, :, h]] = True
    sink_keys = is_sink[:, :, None, :] & ~near  # [B,H,M,M]: sinks outside each query's window
    masses = {
        "prefix": probs[..., :prefix].sum(-1).mean(),
        "window": (probs[..., prefix:] * near).sum(-1).mean(),
        "sinks": (probs[..., prefix:] * sink_keys).sum(-1).mean(),
    }
    out.append({**masses, "exact": sum(masses.values())})
  return out


@pytest.mark.parametrize("window,sinks", [(3, 0), (3, 4), (0, 4)])
def test_teacher_masses_equal_a_brute_force_softmax(teacher, window, sinks):
  model, params = teacher
  batch = 3 if sinks and window else 2  # 3: a padded batch
  got = window_share.teacher_masses(model, params, IMAGES, window, sinks, batch_size=batch)
  want = _brute_force(model, params, window, sinks)
  for g, w in zip(got, want):
    for m in window_share.MASSES:
      assert g[m] == pytest.approx(w[m], abs=2e-6), (m, g, w)
    assert 0.05 < g["window"] + g["sinks"] < 0.95 if window else g["window"] == 0
    # the parts add up (c)
    assert g["prefix"] + g["window"] + g["sinks"] == pytest.approx(g["exact"], abs=1e-6)
  assert (got[0]["sinks"] > 0) == bool(sinks)


def test_a_window_over_the_whole_grid_holds_all_the_mass(teacher):
  model, params = teacher
  rows = window_share.teacher_masses(model, params, IMAGES, 2 * SIDE - 1, batch_size=2)
  for row in rows:
    assert row["exact"] == pytest.approx(1, abs=1e-5)
    assert row["prefix"] + row["window"] == pytest.approx(row["exact"], abs=1e-6)


def test_cli_with_and_without_a_student(teacher, tmp_path, capsys):
  attention = {"kind": "linear", "feature_map": "elu1", "window": 3}
  model = vit.Model(**student_export.FIELDS, attention=attention)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3), np.float32))
  folder = tmp_path / "student"
  student = student_export.make_export(folder, attention=attention, params=params["params"])
  init = str(tmp_path / "teacher.npz")
  checkpoints.save_npz(init, teacher[1])  # a headless ViT (FIELDS) at 40 px
  photos = str(tmp_path / "photos")
  tiny_teacher.smooth_photos(photos, n=2)
  out, png = str(tmp_path / "w.json"), str(tmp_path / "w.png")
  args = ["--teacher", init, "--photos", photos, "--factors", "1,2"]
  assert window_share.main([*args, "--student", student, "--out", out, "--plot", png]) == 0
  with open(out) as f:
    results = json.load(f)
  assert (results["window"], results["sinks"], results["res"]) == (3, 0, 16)
  assert [b["res"] for b in results["resolutions"]] == [16, 32]
  assert [b["grid"] for b in results["resolutions"]] == [[4, 4], [8, 8]]
  for block in results["resolutions"]:
    assert block["n_photos"] == 2 and [r["layer"] for r in block["layers"]] == [0, 1]
    for row in block["layers"]:
      assert set(row) == {"layer", "student_share"} | {
          f"teacher_{m}_mass" for m in window_share.MASSES
      }
      assert 0 < row["teacher_window_mass"] < row["teacher_exact_mass"] <= 1 + 1e-6
      assert 0 < row["student_share"] < 1
  assert os.path.getsize(png) > 1000 and "wrote" in capsys.readouterr().out

  one = ["--window", "5", "--res", "16", "--max_photos", "1", "--factors", "1"]
  assert window_share.main([*args[:4], *one]) == 0
  assert "window 5, sinks 0, 1 photo(s)" in capsys.readouterr().out
  assert window_share.main([*args, "--student", student, "--window", "5"]) == 2
  err = capsys.readouterr().err
  assert (
      err.startswith("error: --window 5: the student's export has window 3")
      and err.count("\n") == 1
  )
