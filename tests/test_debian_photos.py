"""debian_photos: the listed photographs of fake package folders, written shrunk, named and split-stable."""

import os

import numpy as np
import pytest
from PIL import Image

from linvit_jax.data import debian_photos


def _image(path, size, mode="RGB"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rng = np.random.default_rng(len(path))
  channels = 3 if mode == "RGB" else 1
  pixels = rng.integers(0, 255, (size[1], size[0], channels), dtype=np.uint8).squeeze()
  Image.fromarray(pixels, mode).save(path)


@pytest.fixture
def packages(tmp_path):
  plasma, opencv, mate = (str(tmp_path / n) for n in ("wallpapers", "opencv", "mate"))
  # A listed wallpaper with two renditions, an unlisted one (a render), a listed opencv photo, an
  # unlisted opencv file (a calibration board) and a grayscale mate photo.
  _image(f"{plasma}/Path/contents/images/400x300.jpg", (400, 300))
  _image(f"{plasma}/Path/contents/images/2400x1200.png", (2400, 1200))
  _image(f"{plasma}/Cluster/contents/images/800x600.jpg", (800, 600))
  _image(f"{opencv}/fruits.jpg", (480, 512))
  _image(f"{opencv}/left01.jpg", (640, 480))
  _image(f"{mate}/Storm.png", (500, 1000), mode="L")
  return dict(plasma_dir=plasma, opencv_dir=opencv, mate_dir=mate)


def test_only_listed_photographs_with_stable_names(packages):
  found = debian_photos.find_sources(**packages)
  names = [name for _, name in found]
  assert names == ["wall_Path.jpg", "cv_fruits.jpg", "mate_Storm.jpg"]
  assert found[0][0].endswith("2400x1200.png")  # the largest rendition


def test_written_rgb_jpegs_shrunk_never_enlarged(packages, tmp_path):
  out = str(tmp_path / "out")
  paths = debian_photos.write_debian_photos(
      out, max_side=1000, sources=debian_photos.find_sources(**packages)
  )
  assert [os.path.basename(p) for p in paths] == sorted(
      ["wall_Path.jpg", "cv_fruits.jpg", "mate_Storm.jpg"]
  )
  sizes = {os.path.basename(p): Image.open(p).size for p in paths}
  modes = {Image.open(p).mode for p in paths}
  assert sizes["wall_Path.jpg"] == (1000, 500)  # 2400x1200 shrunk to a 1000-px longer side
  assert sizes["cv_fruits.jpg"] == (480, 512)  # smaller than max_side: kept
  assert sizes["mate_Storm.jpg"] == (500, 1000)
  assert modes == {"RGB"}  # the grayscale PNG too


def test_nothing_installed_is_a_clear_error(tmp_path, capsys, monkeypatch):
  empty = str(tmp_path / "none")
  with pytest.raises(FileNotFoundError, match="apt-get install"):
    debian_photos.write_debian_photos(
        str(tmp_path / "o"),
        sources=debian_photos.find_sources(empty, empty, empty),
    )
  monkeypatch.setattr(debian_photos, "find_sources", lambda *_: [])
  assert debian_photos.main([str(tmp_path / "o2")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "mate-backgrounds" in err
  assert not os.path.exists(tmp_path / "o2")


def test_promised_counts_are_the_readmes():
  assert debian_photos.PROMISED == {
      "photos": 46,
      "lomiri": 15,
      "cross": 25,
      "people": 15,
      "extra": 74,
      "scenes": 316,
  }


def test_cli_writes_the_folder(packages, tmp_path, monkeypatch, capsys):
  found = debian_photos.find_sources(**packages)
  monkeypatch.setattr(debian_photos, "find_sources", lambda *_: found)
  out = str(tmp_path / "cli")
  # 3 of the 46 promised: an error naming the count, and nothing written ...
  assert debian_photos.main([out, "--max_side", "600"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: only 3 of the 46 'photos' photographs") and "--allow_partial" in err
  assert not os.path.exists(out)
  # ... unless asked for: written, with a warning that says the count.
  assert debian_photos.main([out, "--max_side", "600", "--allow_partial"]) == 0
  captured = capsys.readouterr()
  assert "wrote 3 photos" in captured.out and "WARNING: wrote 3 of the 46" in captured.err
  assert max(Image.open(os.path.join(out, "wall_Path.jpg")).size) == 600
  assert debian_photos.main([out, "--max_side", "0"]) == 2


def test_lomiri_set_is_listed_photos_only_and_disjoint(tmp_path, monkeypatch, capsys):
  root = str(tmp_path / "backgrounds")
  _image(f"{root}/sunset_by_Aitzol_Berasategi.jpg", (900, 600))
  _image(f"{root}/Fossa_by_Jasper_Roks.jpg", (900, 600))  # a render: not listed
  found = debian_photos.find_lomiri_sources(root)
  assert [name for _, name in found] == ["lomiri_sunset.jpg"]
  assert debian_photos.lomiri_name("sunset_by_Aitzol_Berasategi.jpg") == "lomiri_sunset.jpg"
  names = {debian_photos.lomiri_name(n) for n in debian_photos.LOMIRI_PHOTOS}
  assert len(names) == len(debian_photos.LOMIRI_PHOTOS)  # one output name per photo
  assert not any(n.startswith(("wall_", "cv_", "mate_")) for n in names)
  monkeypatch.setattr(debian_photos, "find_lomiri_sources", lambda *_: found)
  out = str(tmp_path / "lomiri")
  assert debian_photos.main([out, "--set", "lomiri"]) == 2
  assert "only 1 of the 15" in capsys.readouterr().err and not os.path.exists(out)
  assert debian_photos.main([out, "--set", "lomiri", "--allow_partial"]) == 0
  assert os.listdir(out) == ["lomiri_sunset.jpg"]
  monkeypatch.setattr(debian_photos, "find_lomiri_sources", lambda *_: [])
  assert debian_photos.main([str(tmp_path / "none"), "--set", "lomiri"]) == 2
  err = capsys.readouterr().err
  assert "apt-get install lomiri-wallpapers" in err and not os.path.exists(tmp_path / "none")


def test_cross_set_is_other_packages_with_unique_names(tmp_path, monkeypatch, capsys):
  """The cross-source set: packages no other set reads, every written name unique and unlike the
  other sets' (so a folder of both keeps both), found under a fake /usr/share."""
  packages = {package for package, _ in debian_photos.CROSS_PHOTOS}
  assert not packages & {"plasma-workspace-wallpapers", "opencv-doc", "mate-backgrounds"}
  assert "lomiri-wallpapers" not in packages
  names = [debian_photos.cross_name(rel) for _, rel in debian_photos.CROSS_PHOTOS]
  assert len(set(names)) == len(names) == 25 and all(n.startswith("x_") for n in names)
  assert debian_photos.cross_name("a/u76c0g_bliznaca_srgb8.png") == "x_u76c0g_bliznaca.jpg"
  _, rel = debian_photos.CROSS_PHOTOS[0]
  _image(str(tmp_path / rel), (600, 400))
  found = debian_photos.find_cross_sources(str(tmp_path))
  assert found == [(str(tmp_path / rel), debian_photos.cross_name(rel))]
  assert (
      debian_photos.main([str(tmp_path / "out"), "--set", "cross", "--share_dir", str(tmp_path)])
      == 2
  )
  err = capsys.readouterr().err
  assert "only 1 of the 25 'cross' photographs" in err and "gnome-taquin" in err
  out = str(tmp_path / "out")
  assert (
      debian_photos.main([out, "--set", "cross", "--share_dir", str(tmp_path), "--allow_partial"])
      == 0
  )
  assert os.listdir(tmp_path / "out") == [debian_photos.cross_name(rel)]


def test_people_set_written_upright_from_other_packages(tmp_path, capsys):
  """The people set: packages no other set reads, unique `p_` names, and a photo the album stores
  turned written upright (a 90° turn swaps its sides; the top-left corner goes to the top-right)."""
  packages = {package for package, _, _ in debian_photos.PEOPLE_PHOTOS}
  others = {package for package, _ in debian_photos.CROSS_PHOTOS}
  assert not packages & (others | {"plasma-workspace-wallpapers", "opencv-doc", "mate-backgrounds"})
  names = [debian_photos.people_name(rel) for _, rel, _ in debian_photos.PEOPLE_PHOTOS]
  assert len(set(names)) == len(names) == 15 and all(n.startswith("p_") for n in names)
  assert debian_photos.TURNS == {
      "p_grand_canyon_1.jpg": 180,
      "p_new_wave_1.jpg": 90,
      "p_pool_2.jpg": 270,
      "p_wayne.jpg": 90,
  }
  share = tmp_path / "share"
  wayne = share / debian_photos.KPHOTOALBUM_DEMO / "wayne.jpg"
  os.makedirs(wayne.parent)
  pixels = np.zeros((300, 400, 3), np.uint8)
  pixels[:100, :100] = 255  # a white top-left corner
  Image.fromarray(pixels).save(wayne, quality=95)
  out = str(tmp_path / "out")
  assert debian_photos.main([out, "--set", "people", "--share_dir", str(share)]) == 2
  err = capsys.readouterr().err
  assert "only 1 of the 15 'people' photographs" in err
  assert "(incomplete: kphotoalbum ruby-rmagick-doc)" in err
  assert not os.path.exists(out)
  args = [out, "--set", "people", "--share_dir", str(share), "--allow_partial"]
  assert debian_photos.main([*args, "--with_samples"]) == 2  # a training source: refused
  assert "--with_samples puts the sample photos" in capsys.readouterr().err
  assert not os.path.exists(out)
  assert debian_photos.main(args) == 0
  assert os.listdir(out) == ["p_wayne.jpg"]
  written = np.asarray(Image.open(os.path.join(out, "p_wayne.jpg")))
  assert written.shape == (400, 300, 3)
  assert written[:90, -90:].mean() > 240 and written[:90, :90].mean() < 15
  # 180° puts the corner bottom-right, 270° (a quarter turn counter-clockwise) bottom-left.
  for name in ("grand_canyon_1", "pool_2"):
    Image.fromarray(pixels).save(wayne.parent / f"{name}.jpg", quality=95)
  assert debian_photos.main(args) == 0
  canyon = np.asarray(Image.open(os.path.join(out, "p_grand_canyon_1.jpg")))
  pool = np.asarray(Image.open(os.path.join(out, "p_pool_2.jpg")))
  assert canyon.shape == (300, 400, 3) and pool.shape == (400, 300, 3)
  assert canyon[-90:, -90:].mean() > 240 and canyon[:90, :90].mean() < 15
  assert pool[-90:, :90].mean() > 240 and pool[:90, -90:].mean() < 15


def test_extra_set_is_more_training_photos_of_other_packages(tmp_path, capsys):
  """The extra set: packages none of the four other sets reads (so the cross-source and people
  tests stay unseen by a run that trains on it), unique `e_` names that keep two templates' moons
  apart, and, unlike the test-only sets, the sample photos may join it."""
  packages = {package for package, _ in debian_photos.EXTRA_PHOTOS}
  others = {package for package, _ in debian_photos.CROSS_PHOTOS}
  others |= {package for package, _, _ in debian_photos.PEOPLE_PHOTOS}
  others |= {"plasma-workspace-wallpapers", "opencv-doc", "mate-backgrounds", "lomiri-wallpapers"}
  assert packages and not packages & others
  assert debian_photos.PROMISED["extra"] == 74 and "extra" not in debian_photos.TEST_ONLY_SETS
  names = [debian_photos.extra_name(rel) for _, rel in debian_photos.EXTRA_PHOTOS]
  assert len(set(names)) == len(names) and all(n.startswith("e_") for n in names)
  assert {"e_br2_moon.jpg", "e_cal2_moon.jpg"} <= set(names)
  share = tmp_path / "share"
  _, rel = debian_photos.EXTRA_PHOTOS[0]
  _image(str(share / rel), (480, 360))
  out = str(tmp_path / "out")
  assert debian_photos.main([out, "--set", "extra", "--share_dir", str(share)]) == 2
  err = capsys.readouterr().err
  assert "only 1 of the 74 'extra' photographs" in err
  assert "(incomplete: scratch palapeli-data scribus-template" in err and not os.path.exists(out)
  args = [out, "--set", "extra", "--share_dir", str(share), "--allow_partial"]
  assert debian_photos.main(args) == 0
  assert os.listdir(out) == [debian_photos.extra_name(rel)]
  with Image.open(os.path.join(out, debian_photos.extra_name(rel))) as written:
    assert written.size == (480, 360) and written.mode == "RGB"


def test_scenes_set_is_other_packages_and_names_survive_spaces_and_case(tmp_path, capsys):
  """The scenes set: packages no other set reads; a name per photo that stays unique when the file
  system ignores case (GNOME's `cat.jpg`, Plasma's `Cat.png`) and has no space; an RGBA avatar is
  written RGB."""
  sets = (
      debian_photos.CROSS_PHOTOS,
      debian_photos.EXTRA_PHOTOS,
      tuple((p, rel) for p, rel, _ in debian_photos.PEOPLE_PHOTOS),
  )
  others = {package for listed in sets for package, _ in listed}
  packages = {package for package, _ in debian_photos.SCENES_PHOTOS}
  assert packages and not packages & others and "plasma-workspace-wallpapers" not in packages
  assert debian_photos.PROMISED["scenes"] == 316 == len(debian_photos.SCENES_PHOTOS)
  names = [debian_photos.scenes_name(rel) for _, rel in debian_photos.SCENES_PHOTOS]
  assert len({n.lower() for n in names}) == len(names) and not any(" " in n for n in names)
  assert debian_photos.scenes_name("plasma/avatars/photos/Air Balloon.png") == (
      "s_photos_Air_Balloon.jpg"
  )
  share = tmp_path / "share"
  balloon = share / "plasma/avatars/photos/Air Balloon.png"
  os.makedirs(balloon.parent)
  Image.new("RGBA", (512, 512), (200, 30, 30, 128)).save(balloon)
  out = str(tmp_path / "out")
  assert debian_photos.main([out, "--set", "scenes", "--share_dir", str(share)]) == 2
  assert "(incomplete: endless-sky-data gnome-control-center-data" in capsys.readouterr().err
  assert (
      debian_photos.main([out, "--set", "scenes", "--share_dir", str(share), "--allow_partial"])
      == 0
  )
  assert os.listdir(out) == ["s_photos_Air_Balloon.jpg"]
  with Image.open(os.path.join(out, "s_photos_Air_Balloon.jpg")) as written:
    assert written.mode == "RGB" and written.size == (512, 512)
