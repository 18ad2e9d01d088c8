"""big_vision's short checkpoint names (checkpoints.SHORT_NAMES) resolve to their gs:// paths.

No network: the remote read is replaced by a recorder.
"""

import numpy as np
import pytest

from linvit_jax.models import checkpoints


@pytest.mark.parametrize(
    "name,path",
    [
        ("i1k-s16-300ep", "gs://big_vision/vit_s16_i1k_300ep.npz"),
        ("i1k-s16-90ep", "gs://big_vision/vit_s16_i1k_90ep.npz"),
        (
            "howto-i21k-B/16",
            "gs://vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz",
        ),
        ("deit3_S_224_1k", "gs://big_vision/zoo/deit3/bv_deit_3_small_224_1k.npz"),
        ("SigLIP B/16 224", "gs://big_vision/siglip/webli_en_b16_224_63724782.npz:img"),
    ],
)
def test_short_name_resolves(name, path):
  assert checkpoints.resolve_name(name) == path


def test_every_short_name_is_a_gs_npz():
  for name, path in checkpoints.SHORT_NAMES.items():
    file, selector = checkpoints._split_selector(path)
    assert file.startswith("gs://") and file.endswith(".npz"), name
    assert selector in (None, "img"), name


@pytest.mark.parametrize(
    "path", ["vit.npz", "gs://big_vision/vit_s16_i1k_300ep.npz", "i1k-s16-301ep", "x.npz:img"]
)
def test_other_paths_untouched(path):
  assert checkpoints.resolve_name(path) == path


def test_existing_local_file_wins(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "i1k-s16-300ep").write_bytes(b"")
  assert checkpoints.resolve_name("i1k-s16-300ep") == "i1k-s16-300ep"


def test_load_npz_reads_the_named_gs_file(monkeypatch):
  read = []

  def fake_read(path):
    read.append(path)
    return {
        "img/embedding/kernel": np.zeros((2, 2, 3, 4), np.float32),
        "txt/Embed_0/embedding": np.zeros((5, 4), np.float32),
    }

  monkeypatch.setattr(checkpoints, "_read_npz", fake_read)
  tree = checkpoints.load_npz("SigLIP B/16 224")
  assert read == ["gs://big_vision/siglip/webli_en_b16_224_63724782.npz"]
  assert list(tree) == ["embedding"]  # the ':img' tower only
  checkpoints.load_npz("i1k-s16-300ep")
  assert read[-1] == "gs://big_vision/vit_s16_i1k_300ep.npz"
