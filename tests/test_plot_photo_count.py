"""tools/plot_photo_count.py: the runs' own whole-view figures, in photo order, one panel a size."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tool():
  spec = importlib.util.spec_from_file_location("count", ROOT / "tools" / "plot_photo_count.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(cls: float) -> dict:
  rows = []
  for size in (32, 64):
    for view in ("whole", "crop"):
      c = cls + (0.5 if view == "crop" else 0.0)  # crops must not be plotted
      stat = {"mean": c, "lo": c - 0.01, "hi": c + 0.01}
      rows.append({"size": size, "view": view, "cls_cosine": stat, "patch_cosine": stat})
  return {"test": {"n_test": 3, "rows": rows}}


def test_points_in_photo_order_whole_views_only_and_a_plot(tmp_path):
  tool = _tool()
  study = {"many": _run(0.2), "few": _run(0.1)}
  by_size = tool.points(study, [("many", 40), ("few", 8)])
  assert sorted(by_size) == [32, 64]
  assert by_size[64]["cls_cosine"] == [
      pytest.approx((8, 0.1, 0.09, 0.11)),
      pytest.approx((40, 0.2, 0.19, 0.21)),
  ]
  out = tmp_path / "count.png"
  assert tool.main([str(_write(tmp_path, study)), "few=8", "many=40", "--out", str(out)]) == 0
  assert out.read_bytes()[:4] == b"\x89PNG"
  with pytest.raises(SystemExit, match="'lost' is not a run of the study"):
    tool.points(study, [("lost", 3)])
  with pytest.raises(SystemExit, match="expected NAME=PHOTOS"):
    tool.main([str(_write(tmp_path, study)), "few=eight", "--out", str(out)])


def _write(tmp_path, study):
  import json

  path = tmp_path / "study.json"
  path.write_text(json.dumps(study))
  return path
