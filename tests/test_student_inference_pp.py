"""inference_pp.py (a student's eval preprocessing in PIL + numpy) against TensorFlow's pp ops
(data/ops_image.py) on the 21 real photographs sample_photos ships (17 PNG, 4 JPEG; colour and
gray), and the features a real ViT gives through either path.

Tolerances, measured (2026-12, Pillow vs TF 2.x):
  - PNG, and JPEG decoded with decode(precise=True): within one grey level everywhere (the only
    differences are float rounding next to a uint8 truncation boundary);
  - JPEG with the default decode: TF uses libjpeg's fast integer DCT, PIL the exact one: mean
    1.06 levels at 224 px (1.13 at 448), max 10.2 (13.3) at sharp edges; the bounds below are
    1.25 and 16;
  - the pooled features of DINOv2-S/14 (the real fixture) from either path: cosine 0.9996 at
    worst (a JPEG), 1.0000 on PNGs; the bound is 0.999.
"""

import os

import numpy as np
import pytest

from linvit_jax.artifacts import export_format
from linvit_jax.artifacts import student as student_lib
from linvit_jax.data import inference_pp
from linvit_jax.data import sample_photos
from tests.helpers import real_dinov2

DINOV2 = real_dinov2.NPZ
EVAL_PP = 'decode|resize_small(256)|central_crop(224)|vgg_value_range|keep("image")'
VGG_LEVEL = 1 / (0.225 * 255)  # one grey level after vgg_value_range (its largest step)
UNIT_LEVEL = 2 / 255  # one grey level after value_range(-1, 1)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
  return sample_photos.write_sample_photos(str(tmp_path_factory.mktemp("photos")))


def _tf_pp(pp):
  from linvit_jax.runtime import quiet_tf

  quiet_tf.import_quietly("tensorflow")
  import tensorflow as tf

  from linvit_jax.data import preprocess as pp_lib

  fn = pp_lib.get_preprocess_fn(pp)

  def run(path):
    with open(path, "rb") as f:
      return np.asarray(fn({"image": tf.constant(f.read())})["image"])

  return run


@pytest.mark.parametrize(
    "tf_pp, ours, size, level, jpeg_exact",
    [
        (EVAL_PP, EVAL_PP, None, VGG_LEVEL, False),
        # at twice the training size, against TF on the pp string scaled by hand
        (EVAL_PP.replace("256", "512").replace("224", "448"), EVAL_PP, 448, VGG_LEVEL, False),
        (EVAL_PP.replace("decode", "decode(precise=True)"),) * 2 + (None, VGG_LEVEL, True),
        ('decode|resize(64)|value_range(-1,1)|keep("image")',) * 2 + (None, UNIT_LEVEL, False),
        (
            'decode|resize_small(80, method="bilinear")|central_crop(64)|value_range(-1,1)',
            'decode|resize_small(80, method="bilinear")|central_crop(64)|value_range(-1,1)',
            None,
            UNIT_LEVEL,
            False,
        ),
        ("decode|resize(96, antialias=True)|value_range(-1,1)",) * 2 + (None, UNIT_LEVEL, False),
    ],
)
def test_matches_tensorflow_on_real_photos(photos, tf_pp, ours, size, level, jpeg_exact):
  reference = _tf_pp(tf_pp)
  pp = inference_pp.Preprocess(ours, (size, size) if size else None, (224, 224))
  jpeg_means = []
  for path in photos:
    want, got = reference(path), pp(path)
    assert got.shape == want.shape and got.dtype == np.float32, path
    diff = np.abs(got - want) / level
    if path.endswith(".png") or jpeg_exact:
      assert diff.max() <= 1.01, (path, diff.max())  # float32 rounding of one level
    else:
      jpeg_means.append(diff.mean())
      assert diff.max() <= 16, (path, diff.max())
  assert not jpeg_means or max(jpeg_means) <= 1.25, jpeg_means


def test_grayscale_decode_matches_on_gray_photos(tmp_path):
  paths = sample_photos.write_sample_photos(str(tmp_path), which="gray")
  pp = 'decode(1)|resize(28)|value_range(-1,1)|keep("image")'
  reference, ours = _tf_pp(pp), inference_pp.Preprocess(pp)
  for path in paths:
    assert np.abs(ours(path) - reference(path)).max() <= UNIT_LEVEL * 1.001, path


def test_sizes_scale_with_the_image_size(photos):
  pp = inference_pp.Preprocess(EVAL_PP, (448, 448), (224, 224))
  assert pp(photos[0]).shape == (448, 448, 3)
  # a pp string that fixes no size gets resize(size) before its value ops (pp_spec.with_resize)
  plain = 'decode|value_range(-1,1)|keep("image")'
  assert inference_pp.Preprocess(plain, (32, 32), (16, 16))(photos[0]).shape == (32, 32, 3)
  assert inference_pp.Preprocess(plain, (16, 16))(photos[0]).shape == (16, 16, 3)
  ref = _tf_pp('decode|resize(32)|value_range(-1,1)|keep("image")')
  got = inference_pp.Preprocess(plain, (32, 32), (16, 16))(photos[-1])  # a PNG
  assert np.abs(got - ref(photos[-1])).max() <= UNIT_LEVEL * 1.001


def test_unknown_ops_and_bad_arguments_are_one_line():
  for pp, words in (
      ('decode|inception_crop(224)|keep("image")', "'inception_crop' is not supported"),
      ("decode|resize(224, method='cubic')", "resize method must be one of"),
      ("decode|resize(224, colour=1)", "unexpected arguments"),
      ("decode|resize(224", "cannot parse"),
      ('decode|value_range(-1,1,key="label")', "only the 'image' key"),
  ):
    with pytest.raises(inference_pp.PreprocessError) as e:
      inference_pp.Preprocess(pp)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.skipif(not os.path.exists(DINOV2), reason="the real DINOv2 fixture is not here")
def test_features_through_either_path_agree(photos):
  """DINOv2-S/14 (a real pretrained ViT, as a softmax 'student') on 6 photos (4 JPEG, 2 PNG):
  pooled features from TF's preprocessing and from inference_pp, cosine > 0.999."""
  from linvit_jax.models import checkpoints
  from linvit_jax.models import vit

  fields = dict(real_dinov2.FIELDS, patch_size=[14, 14], gelu_approximate=False)
  cfg = {
      "format": export_format.FORMAT,
      "model": fields,
      "preprocessing": {"image_size": [224, 224], "pp": EVAL_PP, "patch_size": [14, 14]},
  }
  student = student_lib.Student(
      model=vit.Model(**fields),
      params=checkpoints.load_npz(DINOV2),
      config=cfg,
      folder="dinov2s14",
  )
  chosen = [p for p in photos if p.endswith(".jpg")][:4] + [
      p for p in photos if p.endswith(".png")
  ][:2]
  ours = student.encode(chosen)
  theirs = student.encode(student.preprocess_tf(chosen))
  cosine = (
      np.sum(ours * theirs, -1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
  )
  assert cosine.min() > 0.999, cosine
