"""Issue 52's walk, as regression tests: a workdir knows what made it (the teacher's bytes, the
photos, the config), one run at a time, every option in range, no silent wrong model.

Each refusal is one line naming what is wrong, and leaves the workdir byte for byte as it was.
The runs stop at the surgery (the first real work after the inputs are checked and recorded), so
these cases cost a second or two each. ROBUSTNESS.md lists them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from linvit_jax import run as run_lib
from linvit_jax import run_identity
from linvit_jax.artifacts import export_format
from linvit_jax.artifacts import student_loader
from linvit_jax.configuration import config_files
from linvit_jax.configuration import config_lib
from linvit_jax.data import inference_pp
from linvit_jax.models import checkpoint_record
from linvit_jax.models import import_weights
from linvit_jax.runtime import errors
from tests.helpers import robust_common as robust
from tests.helpers import robust_config as rc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_TEACHER = os.path.join(ROOT, "tests", "data", "foreign", "hf_dinov2_registers")
CONVERT_FOLDER = os.path.join(ROOT, "configs", "convert_folder.py")


class ComputeStarted(Exception):
  """The run got past its checks and recorded its inputs."""


@pytest.fixture
def stop_at_surgery(monkeypatch):
  def boom(*a, **k):
    raise ComputeStarted

  monkeypatch.setattr(run_lib.surgery, "transplant", boom)


def _snapshot(folder) -> dict[str, bytes]:
  out = {}
  for dirpath, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, folder)] = f.read()
  return out


def _photos(folder, n: int, seed: int = 0) -> str:
  os.makedirs(folder, exist_ok=True)
  rs = np.random.RandomState(seed)
  for i in range(n):
    pixels = (rs.rand(6, 7, 3) * 255).astype(np.uint8)
    Image.fromarray(pixels).resize((60, 50), Image.BICUBIC).save(os.path.join(folder, f"p{i}.png"))
  return str(folder)


def _folder_config(images: str, **options):
  arg = {"init": HF_TEACHER, "images": images, "res": 28, "tiny": True, "batch": 4, **options}
  arg.setdefault("max_images", 8)
  arg.setdefault("knn", "none")
  return config_files.load(CONVERT_FOLDER, arg)


def _refused(config, workdir, *parts):
  """run.run refuses `config` in workdir with one line holding `parts`; nothing there changes."""
  before = _snapshot(workdir) if os.path.isdir(workdir) else None
  with pytest.raises(errors.ConfigError) as info:
    run_lib.run(config, str(workdir))
  text = str(info.value)
  assert "\n" not in text and len(text) <= errors.MAX_LINE, text
  for part in parts:
    assert part in text, (part, text)
  after = _snapshot(workdir) if os.path.isdir(workdir) else None
  assert after == before
  return text


# ------------------------------------------------------------------------ a run's identity


def test_teacher_of_the_same_name_in_another_folder_is_refused(tmp_path, stop_at_surgery):
  first, second = tmp_path / "a" / "teacher.npz", tmp_path / "b" / "teacher.npz"
  os.makedirs(first.parent)
  os.makedirs(second.parent)
  rc.make_teacher(str(first), seed=0)
  rc.make_teacher(str(second), seed=1)  # the same basename, other weights
  workdir = tmp_path / "w"
  with pytest.raises(ComputeStarted):
    run_lib.run(robust.config(str(first)), str(workdir))
  recorded = run_identity.read(str(workdir))
  assert recorded["teacher"]["sha256"] == checkpoint_record.read(str(first)).digest["sha256"]
  _refused(robust.config(str(second)), workdir, "teacher checkpoint: sha256", "Nothing in it")
  # The same bytes reached by another path are the same run: it resumes.
  moved = tmp_path / "c" / "renamed.npz"
  os.makedirs(moved.parent)
  shutil.copy(first, moved)
  with pytest.raises(ComputeStarted):
    run_lib.run(robust.config(str(moved)), str(workdir))


def test_teacher_file_changed_in_place_is_refused(tmp_path, stop_at_surgery):
  path = str(tmp_path / "teacher.npz")
  rc.make_teacher(path, seed=0)
  workdir = tmp_path / "w"
  with pytest.raises(ComputeStarted):
    run_lib.run(robust.config(path), str(workdir))
  rc.make_teacher(path, seed=3)
  _refused(robust.config(path), workdir, "(the same path: the file changed)")


def test_photos_are_part_of_the_identity(tmp_path, stop_at_surgery):
  photos = _photos(tmp_path / "photos", 6)
  workdir = tmp_path / "w"
  with pytest.raises(ComputeStarted):
    run_lib.run(_folder_config(photos), str(workdir))
  assert run_identity.read(str(workdir))["photos"]["train"]["photos"] == 6
  other = _photos(tmp_path / "other", 6, seed=1)
  _refused(_folder_config(other), workdir, "train photos: another folder")
  _photos(tmp_path / "photos" / "more", 1, seed=2)  # a photo added to the same folder
  _refused(_folder_config(photos), workdir, "train photos: the same folder, changed", "(6 photos")
  os.remove(tmp_path / "photos" / "more" / "p0.png")
  with pytest.raises(ComputeStarted):  # as it was: the same run again
    run_lib.run(_folder_config(photos), str(workdir))


def test_workdir_and_photo_folder_may_not_nest(tmp_path):
  photos = _photos(tmp_path / "photos", 6)
  _refused(_folder_config(photos), tmp_path / "photos" / "run", "is inside the train photo folder")
  assert not os.path.exists(tmp_path / "photos" / "run")
  inner = _photos(tmp_path / "work" / "photos", 6)
  _refused(_folder_config(inner), tmp_path / "work", "is inside --workdir")


def test_bad_knn_leaves_no_workdir(tmp_path):
  photos = _photos(tmp_path / "photos", 6)
  config = _folder_config(photos, knn=f"image_folder:{tmp_path / 'no_such_folder'}")
  with pytest.raises(errors.ConfigError):
    run_lib.run(config, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")


# ------------------------------------------------------------------------ one run per workdir


def test_busy_workdir_is_refused_naming_the_holder(teacher, tmp_path, stop_at_surgery):
  workdir = str(tmp_path / "w")
  with run_identity.locked(workdir):
    text = _refused(robust.config(teacher), workdir, "is in use by another run", f"{os.getpid()}")
  assert "wait for it to end" in text
  with pytest.raises(ComputeStarted):  # released: the next run goes ahead
    run_lib.run(robust.config(teacher), workdir)


def test_lock_dies_with_its_process(tmp_path):
  """A process killed (-9) while holding the lock leaves none: the kernel releases flock."""
  workdir = str(tmp_path / "w")
  holder = subprocess.Popen(
      [
          sys.executable,
          "-c",
          "import sys, time; from linvit_jax import run_identity\n"
          "with run_identity.locked(sys.argv[1]):\n print('held', flush=True); time.sleep(60)",
          workdir,
      ],
      stdout=subprocess.PIPE,
      text=True,
      cwd=ROOT,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    t0 = time.time()
    with pytest.raises(errors.ConfigError, match=rf"in use by another run \(pid {holder.pid} on"):
      with run_identity.locked(workdir):
        pass
    assert time.time() - t0 < 5
  finally:
    holder.kill()
    holder.wait()
  with run_identity.locked(workdir):  # no stale lock
    pass


def test_killed_write_leftovers_are_removed_under_the_lock(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  stale = workdir / ".student.safetensors.k3x_9abc.tmp"
  stale.write_bytes(b"half")
  kept = workdir / "notes.tmp"  # not atomic_open's pattern: not ours to remove
  kept.write_text("x")
  with run_identity.locked(str(workdir)):
    assert not stale.exists() and kept.exists()


# ------------------------------------------------------------------------ options in range


def _option_error(tmp_path, **options) -> str:
  photos = _photos(tmp_path / "photos", 6)
  with pytest.raises(ValueError) as info:
    _folder_config(photos, **options)
  text = str(info.value)
  assert "\n" not in text and len(text) <= errors.MAX_LINE, text
  return text


def test_softmax_layers_out_of_range(tmp_path):
  assert "softmax_layers=-1: expected a count of layers >= 0" in _option_error(
      tmp_path, softmax_layers=-1
  )
  photos = _photos(tmp_path / "p2", 6)
  config = _folder_config(photos, softmax_layers=99)  # the depth is the teacher's: preflight
  _refused(config, tmp_path / "w", "softmax_layers=99", "at most 1 for this 2-layer model")
  assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("value", ["-2", "0x", "x", "2y", "nanx", "1.5"])
def test_softmax_key_grid_out_of_range(tmp_path, value):
  text = _option_error(tmp_path, softmax_key_grid=value)
  assert f"softmax_key_grid={value!r}: expected a grid side in patches >= 0" in text
  assert "'2x'" in text  # names the relative form too


def test_softmax_key_grid_digits_are_patches(tmp_path):
  photos = _photos(tmp_path / "p", 6)
  # digits stay an int (what runs recorded before 'Nx' existed: they resume); 'Nx' stays text
  assert _folder_config(photos, softmax_key_grid="32").student.softmax_key_grid == 32
  assert _folder_config(photos, softmax_key_grid="2x").student.softmax_key_grid == "2x"
  assert _folder_config(photos).student.softmax_key_grid == "2x"  # the default
  # the Python API's whole number is the command line's digits; 'Nx' in one spelling
  assert _folder_config(photos, softmax_key_grid=32).student.softmax_key_grid == 32
  assert _folder_config(photos, softmax_key_grid="2.0x").student.softmax_key_grid == "2x"
  with pytest.raises(ValueError, match="softmax_key_grid=True"):
    _folder_config(photos, softmax_key_grid=True)


def test_softmax_key_grid_refused_by_preflight(tmp_path):
  photos = _photos(tmp_path / "p2", 6)
  config = _folder_config(photos, softmax_layers=1)
  config.student.softmax_key_grid = "-1"  # set on the config itself: preflight names it
  _refused(config, tmp_path / "w", "softmax_key_grid='-1'", "expected a grid side in patches")


def test_softmax_pick_typo_is_one_line(tmp_path):
  text = _option_error(tmp_path, softmax_pick="sensitive")
  assert "softmax_pick='sensitive'" in text and "'sensitivity'" in text
  text = _option_error(tmp_path / "second", softmax_pick_images="whole")
  assert "softmax_pick_images='whole'" in text and "'eval_view'" in text


def test_named_softmax_layers_are_read_and_checked(tmp_path):
  """softmax_pick may name the layers ('8', '4+8', '4,8' on the config itself): as many as
  softmax_layers, different, below the depth; a rule's name is not a list of layers."""
  assert config_lib.fixed_softmax_layers("8") == (8,) and config_lib.fixed_softmax_layers(8) == (8,)
  assert config_lib.fixed_softmax_layers("4+8") == config_lib.fixed_softmax_layers("4, 8") == (4, 8)
  for rule in ("sensitivity", "", "4+x", True):
    assert config_lib.fixed_softmax_layers(rule) is None
  photos = _photos(tmp_path / "p4", 6)
  _refused(
      _folder_config(photos, softmax_layers=1, softmax_pick="0+1"),
      tmp_path / "w1",
      "softmax_pick='0+1'",
      "expected 1 different layer(s)",
  )
  _refused(
      _folder_config(photos, softmax_layers=1, softmax_pick="7"),
      tmp_path / "w2",
      "softmax_pick='7'",
      "below the depth",
  )


def test_softmax_pick_images_refused_by_preflight(tmp_path):
  photos = _photos(tmp_path / "p3", 6)
  config = _folder_config(photos, softmax_layers=1)
  config.student.softmax_pick_images = "crops"  # set on the config itself: preflight names it
  _refused(config, tmp_path / "w", "softmax_pick_images='crops'", "'sample', 'eval_view'")


def test_deploy_res_that_no_step_trains_is_refused(tmp_path):
  text = _option_error(tmp_path, deploy_res=56, max_images=16, tiny=False)
  assert "deploy_res=56" in text and "set deploy_res=0" in text


def test_align_dropped_by_the_budget_is_said(tmp_path, caplog):
  photos = _photos(tmp_path / "photos", 6)
  with caplog.at_level("WARNING"):
    config = _folder_config(photos, max_images=16, batch=8, tiny=False)
  assert tuple(config.stages) == ("distill_attention",)
  said = [r.getMessage() for r in caplog.records if "align stage no step" in r.getMessage()]
  assert len(said) == 1 and "max_images >= 20 keeps align" in said[0], said


def test_unknown_option_names_the_nearest_not_all(tmp_path):
  text = _option_error(tmp_path, **{"max_image": 8})
  assert "did you mean 'max_images'" in text and "align_w_blocks" not in text


def test_long_error_lines_are_shortened_in_the_middle():
  text = "start " + "x" * 1000 + " the fix"
  line = errors.one_line(text)
  assert len(line) <= errors.MAX_LINE and line.startswith("start ") and line.endswith("the fix")


# ------------------------------------------------------------------------ no silent wrong model


def test_num_heads_that_contradicts_the_source_is_refused(tmp_path, capsys):
  src = os.path.join(ROOT, "tests", "data", "foreign", "timm_vit")
  out = str(tmp_path / "out.npz")
  assert import_weights.main([src, out, "--num_heads", "4"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --num_heads 4 contradicts") and "declares 2 heads" in err, err
  assert not os.path.exists(out)
  assert import_weights.main([src, out, "--num_heads", "2"]) == 0  # what it declares: fine
  hf = os.path.join(ROOT, "tests", "data", "foreign", "hf_vit")
  assert import_weights.main([hf, str(tmp_path / "hf.npz"), "--num_heads", "3"]) == 2
  assert "num_attention_heads" in capsys.readouterr().err


@pytest.fixture(scope="module")
def student(tmp_path_factory):
  from tests.helpers.student_export import make_export

  return student_loader.load_student(make_export(tmp_path_factory.mktemp("student")))


def test_float_batch_of_raw_pixels_is_refused(student):
  lo, hi = student.value_bounds()
  assert lo < -1.5 and hi > 1.5  # ImageNet's mean/std: black -2.1, white 2.6
  raw = np.random.RandomState(0).uniform(0, 255, (2, 16, 16, 3)).astype(np.float32)
  with pytest.raises(export_format.ExportError, match=r"values span \[.*raw pixels as uint8"):
    student.encode(raw)
  with pytest.warns(UserWarning, match=r"raw 0..1 pixels\?"):
    student.encode(raw / 255.0)
  with pytest.warns(UserWarning, match=r"values span \[-2.9\d*, 3\]"):  # a little outside: said
    student.encode(np.clip(raw / 40 - 3, -3, 3))
  normalised = student.preprocess(raw.astype(np.uint8))
  assert student.encode(normalised).shape == (2, 32)  # the right input: no complaint
  assert student.encode(raw.astype(np.uint8)).shape == (2, 32)


def test_empty_image_is_one_line(student):
  with pytest.raises(inference_pp.PreprocessError, match=r"an empty image \(0×0 pixels\)"):
    student.encode([np.zeros((0, 0, 3), np.uint8)])


def test_empty_student_config_says_so(tmp_path):
  from tests.helpers.student_export import make_export

  folder = make_export(tmp_path / "s")
  with open(os.path.join(folder, "student_config.json"), "w") as f:
    f.write("{}")
  with pytest.raises(export_format.ExportError, match="holds no model fields"):
    student_loader.load_student(folder)


def test_options_the_run_will_not_read_are_said(tmp_path, caplog):
  photos = _photos(tmp_path / "photos", 6)
  with caplog.at_level("WARNING"):
    _folder_config(photos, distill_fraction=1.0, align_lora=4, knn_train=50)
  said = [r.getMessage() for r in caplog.records if "set but not read" in r.getMessage()]
  assert said == [
      "options align_lora, knn_train are set but not read (no align stage runs; knn is off)"
  ]
  caplog.clear()
  with caplog.at_level("WARNING"):
    _folder_config(photos, softmax_layers=0, softmax_key_grid="32")
    _folder_config(photos, softmax_layers=1, softmax_key_grid="32")  # read: nothing said
  said = [r.getMessage() for r in caplog.records if "set but not read" in r.getMessage()]
  assert said == ["options softmax_key_grid are set but not read (softmax_layers=0)"]


def test_sample_photos_says_when_it_writes_fewer_than_promised(tmp_path, monkeypatch, capsys):
  from linvit_jax.data import sample_photos

  assert len(sample_photos.promised_names()) == 21  # the README's count
  monkeypatch.setattr(sample_photos, "_matplotlib_file", lambda name: None)  # no matplotlib
  assert sample_photos.main([str(tmp_path / "p")]) == 0
  err = capsys.readouterr().err
  assert "WARNING: wrote 20 of the 21 sample photos; not installed: grace_hopper.jpg" in err


def test_workdir_inside_the_teachers_folder_is_refused(tmp_path):
  teacher = tmp_path / "hf_teacher"
  shutil.copytree(HF_TEACHER, teacher)
  before = _snapshot(teacher)
  photos = _photos(tmp_path / "photos", 6)
  config = _folder_config(photos)
  with config.unlocked():
    config.teacher.init = str(teacher)
  _refused(config, teacher, "is inside the teacher checkpoint folder", "config.json and README.md")
  _refused(config, teacher / "run", "is inside the teacher checkpoint folder")
  assert _snapshot(teacher) == before
  npz = tmp_path / "models" / "teacher.npz"
  os.makedirs(npz.parent)
  rc.make_teacher(str(npz))
  _refused(robust.config(str(npz)), npz.parent, "is the folder of the teacher checkpoint")


# ------------------------------------------------------------------------ each input read once


def _count_opens(monkeypatch, *paths) -> dict[str, int]:
  """Counts builtins.open calls on `paths` (by real path) from now on."""
  import builtins

  real_open, wanted = builtins.open, {os.path.realpath(p): 0 for p in paths}

  def counting(file, *args, **kwargs):
    if isinstance(file, (str, os.PathLike)):
      key = os.path.realpath(os.fspath(file))
      if key in wanted:
        wanted[key] += 1
    return real_open(file, *args, **kwargs)

  monkeypatch.setattr(builtins, "open", counting)
  return wanted


def test_a_whole_run_opens_its_teacher_once(teacher, tmp_path, monkeypatch):
  """Architecture, channels, the load and the workdir's digest all take one read of the file."""
  opens = _count_opens(monkeypatch, teacher)
  config = robust.config(teacher, steps=1, finetune_steps=1)
  with config.unlocked():
    config.teacher.architecture = "init"  # the model block read from the checkpoint too
  run_lib.run(config, str(tmp_path / "w"))
  assert list(opens.values()) == [1]
  recorded = run_identity.read(str(tmp_path / "w"))["teacher"]
  assert recorded["sha256"] == checkpoint_record.read(teacher).digest["sha256"]
  assert recorded["bytes"] == os.path.getsize(teacher)


def test_a_model_folder_is_opened_once_per_file(tmp_path, monkeypatch, stop_at_surgery):
  files = [os.path.join(HF_TEACHER, n) for n in ("config.json", "model.safetensors")]
  opens = _count_opens(monkeypatch, *files)
  with pytest.raises(ComputeStarted):  # after the load: nothing later reads the teacher
    run_lib.run(_folder_config(_photos(tmp_path / "photos", 6)), str(tmp_path / "w"))
  assert list(opens.values()) == [1, 1]


def test_load_student_opens_each_file_once(tmp_path, monkeypatch):
  from tests.helpers.student_export import make_export

  folder = make_export(tmp_path / "s")
  names = ("student_config.json", "student.npz")
  opens = _count_opens(monkeypatch, *(os.path.join(folder, n) for n in names))
  student_loader.load_student(folder)
  assert list(opens.values()) == [1, 1]


def test_load_student_from_safetensors_opens_it_once(tmp_path, monkeypatch):
  """Without student.npz the params come from student.safetensors, opened once by the
  safetensors package (safe_open maps it: no Python open() of it), the config once."""
  import safetensors

  from tests.helpers.student_export import make_export

  folder = make_export(tmp_path / "s")
  os.remove(os.path.join(folder, "student.npz"))
  st = os.path.join(folder, "student.safetensors")
  opens = _count_opens(monkeypatch, os.path.join(folder, "student_config.json"), st)
  real, mapped = safetensors.safe_open, []

  def counting(path, *args, **kwargs):
    mapped.append(os.path.realpath(path))
    return real(path, *args, **kwargs)

  monkeypatch.setattr(safetensors, "safe_open", counting)
  student_loader.load_student(folder)
  assert list(opens.values()) == [1, 0] and mapped == [os.path.realpath(st)]
