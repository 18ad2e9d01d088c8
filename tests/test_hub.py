"""Hub names as checkpoints (linvit_jax/models/hub.py): `hf:org/name` and `timm:name` read through
huggingface_hub's cache, offline here, on a cache laid out as huggingface_hub lays it out
(blobs, snapshot links, refs/main) from the tiny fixtures in tests/data/foreign."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

import numpy as np
import pytest

from linvit_jax import api
from linvit_jax import build
from linvit_jax.models import checkpoints
from linvit_jax.models import hub
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime.errors import UserError

pytest.importorskip("huggingface_hub")

FOREIGN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "foreign")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache: str, repo: str, folder: str, commit: str = COMMIT) -> str:
  """`folder`'s model files in huggingface_hub's cache format; returns the snapshot folder."""
  root = os.path.join(cache, "models--" + repo.replace("/", "--"))
  snapshot = os.path.join(root, "snapshots", commit)
  os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
  os.makedirs(os.path.join(root, "refs"), exist_ok=True)
  os.makedirs(snapshot, exist_ok=True)
  for name in sorted(os.listdir(folder)):
    if name == "reference.npz":  # the fixture's expected outputs, no file of a hub repo
      continue
    with open(os.path.join(folder, name), "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    blob = os.path.join(root, "blobs", digest)
    shutil.copy(os.path.join(folder, name), blob)
    os.symlink(os.path.relpath(blob, snapshot), os.path.join(snapshot, name))
  with open(os.path.join(root, "refs", "main"), "w") as f:
    f.write(commit)
  return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An offline huggingface_hub cache holding hf:facebook/dinov2-small and
  timm:vit_small_patch14_dinov2 (the tiny fixtures under those names)."""
  path = str(tmp_path / "hub")
  cache_model(path, "facebook/dinov2-small", os.path.join(FOREIGN, "hf_dinov2"))
  cache_model(path, "timm/vit_small_patch14_dinov2", os.path.join(FOREIGN, "timm_vit"))
  monkeypatch.setenv("HF_HUB_CACHE", path)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  hub._resolve.cache_clear()
  yield path
  hub._resolve.cache_clear()


def _same_params(a, b):
  fa, fb = checkpoints.flatten(a), checkpoints.flatten(b)
  assert sorted(fa) == sorted(fb)
  for key in fa:
    np.testing.assert_array_equal(np.asarray(fa[key]), np.asarray(fb[key]), err_msg=key)


@pytest.mark.parametrize(
    "name, folder",
    [("hf:facebook/dinov2-small", "hf_dinov2"), ("timm:vit_small_patch14_dinov2", "timm_vit")],
)
def test_hub_name_reads_the_cached_model_offline(cache, name, folder):
  local = os.path.join(FOREIGN, folder)
  repo = hub.repo_id(name)[0]
  assert hub.resolve(name) == os.path.join(
      cache, "models--" + repo.replace("/", "--"), "snapshots", COMMIT
  )
  params, method = vit_checkpoint.read_vit_checkpoint(name)
  expected, expected_method = vit_checkpoint.read_vit_checkpoint(local)
  _same_params(params, expected)
  assert method == expected_method
  assert vit_checkpoint.infer_vit_config(name) == vit_checkpoint.infer_vit_config(local)


def test_hub_name_as_init_of_a_config(cache, tmp_path):
  """`init=hf:...` through the driver's first step: the architecture read from the cache."""
  kwargs = dict(images=str(tmp_path), knn="none", tiny=True)
  by_name = api.load_config("convert_folder", init="hf:facebook/dinov2-small", **kwargs)
  by_folder = api.load_config("convert_folder", init=os.path.join(FOREIGN, "hf_dinov2"), **kwargs)
  assert by_name.teacher.init == "hf:facebook/dinov2-small"  # recorded as given
  resolved, expected = (build.resolve_from_init(c) for c in (by_name, by_folder))
  assert resolved.model.to_dict() == expected.model.to_dict()
  assert resolved.data.pp_eval == expected.data.pp_eval  # init_norm: the cached preprocessor


def test_a_revision_names_its_snapshot(cache):
  other = "fedcba9876543210fedcba9876543210fedcba98"
  snapshot = cache_model(cache, "facebook/dinov2-small", os.path.join(FOREIGN, "hf_dinov2"), other)
  os.remove(os.path.join(cache, "models--facebook--dinov2-small", "refs", "main"))
  with open(os.path.join(cache, "models--facebook--dinov2-small", "refs", "main"), "w") as f:
    f.write(COMMIT)  # main stays the first commit
  assert hub.resolve(f"hf:facebook/dinov2-small@{other}") == snapshot


def _one_line(error):
  text = str(error.value)
  assert "\n" not in text and isinstance(error.value, UserError), text
  return text


def test_model_not_cached_offline_is_one_line(cache):
  with pytest.raises(hub.HubError) as error:
    vit_checkpoint.read_vit_checkpoint("hf:facebook/dinov2-base")
  text = _one_line(error)
  assert "facebook/dinov2-base is not in the Hugging Face cache" in text
  assert "HF_HUB_OFFLINE is set" in text and "`hf download facebook/dinov2-base`" in text
  with pytest.raises(hub.HubError, match="`hf download timm/vit_base_patch14_dinov2`"):
    hub.resolve("timm:vit_base_patch14_dinov2")


def test_no_network_reads_the_cache_and_names_what_is_missing(cache, monkeypatch):
  """Not offline, but the hub is unreachable (a closed local port): the cache still answers."""
  from huggingface_hub import constants

  monkeypatch.delenv("HF_HUB_OFFLINE")
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
  monkeypatch.setattr(
      constants,
      "HUGGINGFACE_CO_URL_TEMPLATE",
      "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}",
  )
  assert hub.resolve("hf:facebook/dinov2-small").endswith(COMMIT)
  with pytest.raises(hub.HubError) as error:
    hub.resolve("hf:facebook/dinov2-base")
  assert "the hub could not be reached" in _one_line(error)


def test_without_huggingface_hub_the_error_says_what_to_install(cache, monkeypatch):
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails
  with pytest.raises(hub.HubNotInstalledError) as error:
    vit_checkpoint.read_vit_checkpoint("hf:facebook/dinov2-small")
  assert "pip install 'linvit_jax[hub]'" in _one_line(error)
  assert isinstance(error.value, ImportError)


def test_what_is_a_hub_name(tmp_path, monkeypatch):
  assert hub.is_hub_name("hf:facebook/dinov2-small")
  assert hub.is_hub_name("hf:gpt2") and hub.is_hub_name("timm:vit_small_patch14_dinov2.lvd142m")
  assert hub.is_hub_name("hf:facebook/dinov2-small@main")
  assert not hub.is_hub_name("vit.npz") and not hub.is_hub_name("gs://b/vit.npz")
  assert not hub.is_hub_name("SigLIP B/16 224") and not hub.is_hub_name("x.npz:img")
  monkeypatch.chdir(tmp_path)
  (tmp_path / "hf:local").mkdir()  # an existing path of that spelling is that path
  assert not hub.is_hub_name("hf:local")
  assert hub.repo_id("timm:vit_small_patch14_dinov2") == ("timm/vit_small_patch14_dinov2", None)
  assert hub.repo_id("hf:org/name@v1.0") == ("org/name", "v1.0")
  with pytest.raises(hub.HubError, match="without '/'"):
    hub.repo_id("timm:timm/vit_small")


def test_cli_names_a_model_not_cached_in_one_line(cache, tmp_path):
  """`--config convert_folder:init=hf:...` offline, model not cached: one `error:` line, exit 2,
  nothing written."""
  import subprocess

  (tmp_path / "photos").mkdir()
  config = f"convert_folder:init=hf:facebook/dinov2-base,images={tmp_path / 'photos'}"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "linvit_jax.main",
          "--config",
          config,
          "--workdir",
          str(tmp_path / "w"),
      ],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "`hf download facebook/dinov2-base`" in errors[0], proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "w").exists()
