"""Preprocessing ops against hand-computed values, and the pp-string parser's errors."""

import numpy as np
import pytest
import tensorflow as tf

from linvit_jax.data.fashion_mnist import encode_png_gray
from linvit_jax.data.preprocess import RNG_KEY
from linvit_jax.data.preprocess import get_preprocess_fn
from linvit_jax.data.preprocess import registered_ops


def run(pp, **data):
  out = get_preprocess_fn(pp)({k: tf.convert_to_tensor(v) for k, v in data.items()})
  return {k: v.numpy() for k, v in out.items()}


def rng(i):
  return np.array([7, i], np.int64)


def ramp(h, w, c=1):
  return (np.arange(h * w * c) % 256).astype(np.uint8).reshape(h, w, c)


def test_the_issue_ops_are_registered():
  assert {
      "decode",
      "decode_jpeg_and_inception_crop",
      "resize",
      "resize_small",
      "central_crop",
      "random_crop",
      "flip_lr",
      "value_range",
      "vgg_value_range",
      "onehot",
      "multi_hot",
      "keep",
      "inception_crop",
      "grayscale_to_rgb",
      "drop",
  } <= set(registered_ops())


def test_value_range():
  out = run("value_range(-1, 1)", image=np.array([[[0], [255], [51]]], np.uint8))["image"]
  assert out.dtype == np.float32
  np.testing.assert_allclose(out.ravel(), [-1.0, 1.0, -0.6], atol=1e-6)
  out = run(
      "value_range(0, 1, in_min=10, in_max=20, clip_values=True)",
      image=np.array([[[5.0], [15.0], [30.0]]], np.float32),
  )["image"]
  np.testing.assert_allclose(out.ravel(), [0.0, 0.5, 1.0])


def test_vgg_value_range():
  image = np.array([[[10, 20, 30]]], np.uint8)
  out = run("vgg_value_range(mean=(1, 2, 3), std=(3, 6, 9))", image=image)["image"]
  np.testing.assert_allclose(out.ravel(), [3.0, 3.0, 3.0])
  with pytest.raises(ValueError, match="3 values but the image has 1 channels"):
    run("vgg_value_range", image=np.zeros((2, 2, 1), np.uint8))


def test_resize_keeps_dtype_and_area_averages():
  image = np.array([[0, 2, 10, 20], [4, 6, 30, 40], [1, 1, 0, 0], [1, 1, 0, 8]], np.uint8)
  image = image[..., None]
  out = run('resize(2, method="area")', image=image)["image"]
  assert out.dtype == np.uint8
  np.testing.assert_array_equal(out[..., 0], [[3, 25], [1, 2]])
  assert run("resize((3, 5))", image=image)["image"].shape == (3, 5, 1)


def test_resize_small_keeps_aspect_ratio():
  for shape, expected in [((30, 60, 3), (10, 20, 3)), ((45, 15, 1), (30, 10, 1))]:
    assert run("resize_small(10)", image=np.zeros(shape, np.uint8))["image"].shape == expected


def test_central_crop():
  image = ramp(4, 6)
  np.testing.assert_array_equal(run("central_crop(2)", image=image)["image"], image[1:3, 2:4])
  np.testing.assert_array_equal(run("central_crop", image=image)["image"], image[:, 1:5])
  np.testing.assert_array_equal(run("central_crop((2, 4))", image=image)["image"], image[1:3, 1:5])


def test_random_crop_is_a_window_fixed_by_the_rng():
  image = ramp(8, 9)
  crops = [run("random_crop((3, 4))", image=image, **{RNG_KEY: rng(i)})["image"] for i in range(8)]
  for crop in crops:  # The ramp's first value locates the window.
    y, x = divmod(int(crop[0, 0, 0]), 9)
    np.testing.assert_array_equal(crop, image[y : y + 3, x : x + 4])
  again = run("random_crop((3, 4))", image=image, **{RNG_KEY: rng(0)})["image"]
  np.testing.assert_array_equal(again, crops[0])
  assert len({c.tobytes() for c in crops}) > 1


def test_flip_lr_flips_about_half():
  image = ramp(2, 5, 3)
  flips = []
  for i in range(40):
    out = run("flip_lr", image=image, **{RNG_KEY: rng(i)})["image"]
    assert np.array_equal(out, image) or np.array_equal(out, image[:, ::-1])
    flips.append(not np.array_equal(out, image))
  assert 8 < sum(flips) < 32


def test_inception_crop_full_area_is_the_image():
  image = ramp(8, 8, 3)
  out = run(
      "inception_crop(area_min=100, ratio_min=1, ratio_max=1)", image=image, **{RNG_KEY: rng(0)}
  )["image"]
  np.testing.assert_array_equal(out, image)
  out = run("inception_crop(5)", image=ramp(20, 30, 3), **{RNG_KEY: rng(1)})["image"]
  assert out.shape == (5, 5, 3) and out.dtype == np.uint8


def test_decode_jpeg_and_inception_crop_matches_decode_then_crop():
  jpeg = tf.io.encode_jpeg(ramp(16, 16, 3)).numpy()
  full = run(
      "decode_jpeg_and_inception_crop(area_min=100, ratio_min=1, ratio_max=1)",
      image=jpeg,
      **{RNG_KEY: rng(0)},
  )["image"]
  np.testing.assert_array_equal(full, run("decode", image=jpeg)["image"])
  # Same seed, same window as the unfused op.
  fused = run("decode_jpeg_and_inception_crop(8)", image=jpeg, **{RNG_KEY: rng(3)})["image"]
  unfused = run("decode|inception_crop(8)", image=jpeg, **{RNG_KEY: rng(3)})["image"]
  assert fused.shape == (8, 8, 3)
  np.testing.assert_allclose(fused.astype(int), unfused.astype(int), atol=2)


def test_decode_png_exactly_and_channels():
  gray = ramp(28, 28)[..., 0]
  png = encode_png_gray(gray)
  np.testing.assert_array_equal(run("decode(channels=1)", image=png)["image"][..., 0], gray)
  rgb = run("decode", image=png)["image"]
  assert rgb.shape == (28, 28, 3) and all(np.array_equal(rgb[..., c], gray) for c in range(3))
  rgb = run("decode(channels=1)|grayscale_to_rgb", image=png)["image"]
  assert rgb.shape == (28, 28, 3)
  with pytest.raises(ValueError, match=r"'decode'.*expects encoded image bytes"):
    run("decode", image=gray[..., None])


def test_onehot_and_multi_hot():
  out = run('onehot(4, key="label", key_result="labels")', label=np.int64(2))
  np.testing.assert_array_equal(out["labels"], [0, 0, 1, 0])
  assert out["label"] == 2
  out = run("onehot(3, on=0.9, off=0.05)", labels=np.int64(0))["labels"]
  np.testing.assert_allclose(out, [0.9, 0.05, 0.05])
  out = run("onehot(5)", labels=np.array([3, 0, 3], np.int64))["labels"]
  np.testing.assert_array_equal(out, [1, 0, 0, 1, 0])
  out = run('multi_hot(6, key_result="y")', labels=np.array([5, 1, 1], np.int64))["y"]
  np.testing.assert_array_equal(out, [0, 1, 0, 0, 0, 1])
  out = run("multi_hot(3)", labels=np.zeros([0], np.int64))["labels"]
  np.testing.assert_array_equal(out, [0, 0, 0])
  with pytest.raises(tf.errors.InvalidArgumentError, match="label id >= depth=3"):
    run("multi_hot(3)", labels=np.array([3], np.int64))
  with pytest.raises(ValueError, match="expects a list of label ids"):
    run("multi_hot(3)", labels=np.int64(1))


def test_keep_and_drop():
  out = run('keep("a", "b")', a=1, b=2, c=3)
  assert sorted(out) == ["a", "b"]
  assert sorted(run('drop("a")', a=1, b=2)) == ["b"]
  with pytest.raises(ValueError, match=r"keep.*no key 'labels'.*keys: image, label"):
    run('keep("image", "labels")', image=1, label=2)


def test_the_issue_pp_string():
  pp = (
      "decode|inception_crop(24)|flip_lr|value_range(-1,1)|"
      'onehot(1000,key="label",key_result="labels")|keep("image","labels")'
  )
  data = dict(image=tf.io.encode_jpeg(ramp(40, 50, 3)).numpy(), label=np.int64(7))
  out = run(pp, **data, **{RNG_KEY: rng(0)})
  assert sorted(out) == ["_rng", "image", "labels"]  # The pipeline drops `_rng`.
  assert out["image"].shape == (24, 24, 3) and out["image"].dtype == np.float32
  assert -1 <= out["image"].min() and out["image"].max() <= 1
  assert out["labels"].argmax() == 7 and out["labels"].sum() == 1
  np.testing.assert_array_equal(run(pp, **data, **{RNG_KEY: rng(0)})["image"], out["image"])
  # Inside tf.data too (graph mode).
  ds = tf.data.Dataset.from_tensors({**data, RNG_KEY: rng(0)}).map(get_preprocess_fn(pp))
  np.testing.assert_array_equal(next(iter(ds))["image"].numpy(), out["image"])


@pytest.mark.parametrize(
    "pp, message",
    [
        (
            "decode|nope(3)",
            r"unknown preprocessing op 'nope' in 'nope\(3\)'; known ops: central_crop",
        ),
        ("resize(0)", r"'resize\(0\)': bad argument: size must be a positive int"),
        ('resize(8, method="fancy")', r"bad argument: resize method must be one of"),
        ("resize(8, 9, 10)", r"'resize\(8, 9, 10\)': bad argument"),
        ("central_crop(size=3)", r"bad argument: .*unexpected keyword argument 'size'"),
        ("onehot(0)", r"'onehot\(0\)': bad argument: depth must be a positive int"),
        ("inception_crop(area_min=50, area_max=10)", r"need 0 < area_min <= area_max"),
        ("decode(", r"'decode\(': cannot parse it"),
        ("resize(x)", r"arguments must be Python literals"),
        ("keep()", r"keep needs key names"),
    ],
)
def test_bad_pp_strings_name_the_op(pp, message):
  with pytest.raises(ValueError, match=message):
    get_preprocess_fn(pp)


def colorful(h=6, w=6):
  r = np.random.default_rng(0)
  return r.integers(30, 220, size=(h, w, 3)).astype(np.uint8)


def test_color_jitter_is_seeded_keeps_dtype_and_changes_colours():
  image = colorful()
  outs = [run("color_jitter(p=1)", image=image, **{RNG_KEY: rng(i)})["image"] for i in range(8)]
  again = run("color_jitter(p=1)", image=image, **{RNG_KEY: rng(3)})["image"]
  np.testing.assert_array_equal(outs[3], again)  # the example's seed decides the draw
  assert all(o.dtype == np.uint8 and o.shape == image.shape for o in outs)
  assert all(np.abs(o.astype(int) - image).max() > 2 for o in outs)
  assert len({o.tobytes() for o in outs}) == len(outs)
  # Zero strengths with p = 1 are the identity up to the uint8 round trip.
  same = run(
      "color_jitter(brightness=0, contrast=0, saturation=0, hue=0, p=1)",
      image=image,
      **{RNG_KEY: rng(0)},
  )["image"]
  assert np.abs(same.astype(int) - image).max() <= 1


def test_color_jitter_and_grayscale_apply_with_their_probability():
  image = colorful()
  jittered = [
      not np.array_equal(
          run("color_jitter(p=0.5)", image=image, **{RNG_KEY: rng(i)})["image"], image
      )
      for i in range(40)
  ]
  assert 8 < sum(jittered) < 32
  grays = []
  for i in range(40):
    out = run("random_grayscale(p=0.5)", image=image, **{RNG_KEY: rng(i)})["image"]
    is_gray = bool((out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all())
    assert is_gray or np.array_equal(out, image)
    grays.append(is_gray)
  assert 8 < sum(grays) < 32
  out = run("random_grayscale(p=1)", image=image, **{RNG_KEY: rng(0)})["image"]
  luma = image.astype(float) @ np.array([0.2989, 0.587, 0.114])
  assert np.abs(out[..., 0] - luma).max() <= 1.5


@pytest.mark.parametrize(
    "pp,field",
    [
        ("color_jitter(p=1.5)", "p=1.5"),
        ("color_jitter(brightness=1.2)", "brightness=1.2"),
        ("color_jitter(hue=0.7)", "hue=0.7"),
        ("random_grayscale(p=-0.1)", "p=-0.1"),
    ],
)
def test_colour_ops_refuse_bad_strengths_naming_them(pp, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    get_preprocess_fn(pp)


def test_colour_ops_refuse_a_single_channel_image():
  with pytest.raises(ValueError, match="RGB"):
    run("random_grayscale(p=1)", image=ramp(4, 4, 1), **{RNG_KEY: rng(0)})
