"""The image-folder dataset: scan, labels, splits, shares, skip-ahead, bad files, image modes."""

import io
import itertools
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from linvit_jax.data import image_folder
from linvit_jax.data import input_pipeline

PP_FILES = 'keep("file")'
PP_32 = 'decode|resize(32)|value_range(-1,1)|keep("image", "file")'


def write(path, image, fmt=None, **kw):
  """Saves a PIL image (or a uint8 array) under path, making its folders."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if isinstance(image, np.ndarray):
    image = Image.fromarray(image)
  image.save(path, fmt, **kw)
  return path


def rgb(value, size=(8, 8)):
  return np.full((size[1], size[0], 3), value, np.uint8)


def make_labelled(root, per_class=(5, 4, 6)):
  """Class folders "a", "b", "c" of small PNG/JPEG images; returns the relative paths, sorted."""
  rels = []
  for c, n in zip("abc", per_class):
    for i in range(n):
      ext = ".png" if i % 2 else ".jpg"
      rels.append(f"{c}/img{i}{ext}")
      write(os.path.join(root, *rels[-1].split("/")), rgb(10 * i + 50 * (ord(c) - 97)))
  return sorted(rels)


def make_flat(root, n):
  rels = [f"f{i:03d}.png" for i in range(n)]
  for i, rel in enumerate(rels):
    write(os.path.join(root, rel), rgb(i % 256))
  return rels


def split_after_40_new_photos(root, split):
  """The files of `split` once 40 new photos are written into the folder `root`, rescanned."""
  for i in range(40):
    write(str(root / f"new{i}.png"), rgb(7))
  again = image_folder.scan(str(root))
  return {again.files[i] for i in image_folder.split_positions(again, split)}


def files_of(ds):
  return [ex["file"].decode() for ex in ds.as_numpy_iterator()]


def eval_examples(data_dir, split="all", pp=PP_FILES, batch=4, **kw):
  """{file: example} over one eval pass (mask True only), checking nothing is seen twice."""
  out = {}
  for b in input_pipeline.make_eval_iterator(
      dataset="image_folder",
      split=split,
      pp=pp,
      global_batch_size=batch,
      data_dir=str(data_dir),
      **kw,
  ):
    for i in np.flatnonzero(b["_mask"]):
      name = b["file"][i].decode()
      assert name not in out
      out[name] = {k: v[i] for k, v in b.items()}
  return out


def test_scan_order_labels_and_ignored_files(tmp_path):
  rels = make_labelled(tmp_path)
  write(str(tmp_path / "b" / "deeper" / "x.JPG"), rgb(1))  # Upper case, deeper: class "b".
  rels = sorted(rels + ["b/deeper/x.JPG"])
  write(str(tmp_path / ".hidden" / "h.png"), rgb(1))
  write(str(tmp_path / "a" / ".h.png"), rgb(1), "PNG")
  (tmp_path / "a" / "notes.txt").write_text("not an image")
  index = image_folder.scan(str(tmp_path))
  assert index.files == tuple(rels)
  assert index.class_names == ("a", "b", "c")
  assert index.labels == tuple("abc".index(r[0]) for r in rels)
  assert not index.skipped and index.converted == 0 and index.small == len(rels)
  examples = files_of(image_folder.read_examples(index, list(range(len(rels))), None))
  assert examples == rels  # File order without a key.
  ex = next(image_folder.read_examples(index, [0], None).as_numpy_iterator())
  assert sorted(ex) == ["file", "image", "label"] and ex["label"].dtype == np.int32
  assert image_folder.scan(str(tmp_path)) is index  # Memoized while nothing changes.


def test_unlabelled_when_images_in_root(tmp_path):
  make_labelled(tmp_path)
  write(str(tmp_path / "root.png"), rgb(3))
  index = image_folder.scan(str(tmp_path))
  assert index.labels is None and index.class_names == ()
  ex = next(image_folder.read_examples(index, [0], None).as_numpy_iterator())
  assert sorted(ex) == ["file", "image"]
  got = eval_examples(tmp_path, pp='keep("file", "image")')
  assert sorted(got) == list(index.files)


def test_keyed_order_depends_only_on_key(tmp_path):
  rels = make_flat(tmp_path, 30)
  index = image_folder.scan(str(tmp_path))
  positions = list(range(30))
  read = lambda key: files_of(image_folder.read_examples(index, positions, key))
  a, b, c = (read(tf.constant(k, tf.int64)) for k in ([1, 2], [1, 2], [1, 3]))
  assert a == b and a != c and sorted(a) == rels and a != rels


def test_holdout_split_disjoint_covering_and_stable(tmp_path):
  rels = make_flat(tmp_path, 60)
  index = image_folder.scan(str(tmp_path))
  train = {index.files[i] for i in image_folder.split_positions(index, "train")}
  holdout = {index.files[i] for i in image_folder.split_positions(index, "holdout")}
  assert not train & holdout and train | holdout == set(rels)
  assert holdout == {r for r in rels if image_folder.path_hash(r) < 0.2}
  assert 0 < len(holdout) < 30
  more = {index.files[i] for i in image_folder.split_positions(index, "holdout@0.5")}
  assert holdout < more
  for n, split in [
      (len(rels), "all"),
      (len(train), "train"),
      (len(holdout), "holdout"),
      (len(rels) - len(more), "train@0.5"),
  ]:
    assert input_pipeline.num_examples("image_folder", split, str(tmp_path)) == n
  # Unrelated files (new ones, another class) move no existing file between the splits.
  held_again = split_after_40_new_photos(tmp_path, "holdout")
  assert held_again & set(rels) == holdout
  assert set(eval_examples(tmp_path, split="holdout")) == held_again


def test_val_and_test_halve_the_holdout_stably(tmp_path):
  """val and test: disjoint, their union the holdout, each file placed by its own path alone
  (a second hash), so more photos or a larger holdout never moves a file from one to the other."""
  rels = make_flat(tmp_path, 80)
  index = image_folder.scan(str(tmp_path))

  def files(split):
    return {index.files[i] for i in image_folder.split_positions(index, split)}

  holdout, val, test = files("holdout@0.3"), files("val@0.3"), files("test@0.3")
  assert not val & test and val | test == holdout
  assert val == {r for r in holdout if image_folder.val_hash(r) < 0.5}
  assert len(val) >= 3 and len(test) >= 3
  assert val <= files("val@0.6") and test <= files("test@0.6")  # a larger holdout only adds
  assert files("val") | files("test") == files("holdout")  # the default fraction too
  for split, n in (("val@0.3", len(val)), ("test@0.3", len(test))):
    assert input_pipeline.num_examples("image_folder", split, str(tmp_path)) == n
  val_again = split_after_40_new_photos(tmp_path, "val@0.3")
  assert val_again & set(rels) == val


def test_val_test_tiny_holdout_fallbacks():
  assert image_folder.val_mask(["only.png"]) == [True]  # one held-out file: val's, test empty
  # one file per side at least when there are two or more
  for n in range(2, 12):
    mask = image_folder.val_mask([f"p{i}.png" for i in range(n)])
    assert any(mask) and not all(mask), n
  files = ["a.png", "b.png"]
  assert image_folder.split_files(files, "val@0.999") != image_folder.split_files(
      files, "test@0.999"
  )
  one = ["a.png", "b.png", "c.png"]
  held_one = image_folder.split_files(one, "holdout@0.000001")
  assert len(held_one) == 1 and image_folder.split_files(one, "val@0.000001") == held_one
  assert image_folder.split_files(one, "test@0.000001") == []


def test_at_one_every_file_is_held_out_and_halved():
  """ "val@1" / "test@1": a folder that only validates and tests (eval_folder=) has every file in
  one half or the other, by the same second hash as any holdout, and no train file."""
  files = [f"x{i}.png" for i in range(40)]
  val, test = (set(image_folder.split_files(files, f"{name}@1")) for name in ("val", "test"))
  assert not val & test and val | test == set(range(40))
  assert val == {i for i, f in enumerate(files) if image_folder.val_hash(f) < 0.5}
  assert image_folder.split_files(files, "holdout@1") == list(range(40))
  assert image_folder.split_files(files, "train@0.999999") != []  # only F = 1 takes every file
  two = ["a.png", "b.png"]  # the tiny-holdout fallbacks still give each half one
  assert len(image_folder.split_files(two, "val@1")) == len(image_folder.split_files(two, "test@1"))


def test_tiny_folder_fallbacks(tmp_path):
  (tmp_path / "one").mkdir()
  write(str(tmp_path / "one" / "only.png"), rgb(1))
  one = image_folder.scan(str(tmp_path / "one"))
  assert image_folder.split_positions(one, "holdout@0.000001") == [0]
  with pytest.raises(ValueError, match="'train' is empty"):
    image_folder.split_positions(one, "train")
  assert image_folder.split_positions(one, "all") == [0]

  files = [f"x{i}.png" for i in range(3)]
  hashes = [image_folder.path_hash(f) for f in files]
  assert image_folder.holdout_mask(files, 1e-9) == [h == min(hashes) for h in hashes]
  assert image_folder.holdout_mask(files, 1 - 1e-9) == [h != max(hashes) for h in hashes]


@pytest.mark.parametrize(
    "split",
    ["validation", "all@0.3", "train@1", "holdout@0", "train@x", "holdout@nan", "val@1.5", "tests"],
)
def test_bad_split_names(split):
  with pytest.raises(ValueError, match="split must be"):
    image_folder.parse_split(split)


def test_process_shares_disjoint_and_covering(tmp_path):
  rels = make_labelled(tmp_path, (7, 6, 4))
  sizes = input_pipeline._source("image_folder", "all", str(tmp_path)).sizes(3)
  assert sizes == [6, 6, 5]
  seen = []
  for p in range(3):
    got = eval_examples(
        tmp_path, pp='keep("file", "label")', batch=6, process_index=p, process_count=3
    )
    assert sorted(got) == rels[p::3]  # Files p, p + 3, ... of the sorted split.
    assert all(ex["label"] == "abc".index(f[0]) for f, ex in got.items())
    seen += got
  assert sorted(seen) == rels
  # Train: one epoch of each process's share is its own files, whatever the order.
  for p in range(3):
    it = input_pipeline.make_train_iterator(
        dataset=f"image_folder:{tmp_path}",
        split="all",
        pp=PP_FILES,
        global_batch_size=3,
        seed=0,
        shuffle_buffer=4,
        process_index=p,
        process_count=3,
    )
    first = [f.decode() for b in itertools.islice(it, 5) for f in b["file"]]
    assert set(first) <= set(rels[p::3]) and len(set(first)) == 5


@pytest.mark.parametrize("cache", [False, True])
def test_skip_ahead_gives_the_same_batches(tmp_path, cache):
  make_labelled(tmp_path)
  kw = dict(
      dataset="image_folder",
      split="train",
      data_dir=str(tmp_path),
      global_batch_size=4,
      seed=3,
      shuffle_buffer=5,
      cache=cache,
      pp='decode|resize(8)|flip_lr|value_range(-1,1)|keep("image", "file", "label")',
  )
  ref = list(itertools.islice(input_pipeline.make_train_iterator(**kw), 9))
  epoch = input_pipeline.num_examples("image_folder", "train", str(tmp_path))
  files = [f for b in ref for f in b["file"]]
  assert sorted(files[:epoch]) == sorted(files[epoch : 2 * epoch])  # Whole epochs.
  for k in (1, 4, 8):
    got = next(input_pipeline.make_train_iterator(**kw, start_step=k))
    for key in ref[k]:
      np.testing.assert_array_equal(got[key], ref[k][key], err_msg=f"step {k} {key}")


def jpeg_bytes(value=100, size=(64, 64)):
  buf = io.BytesIO()
  noise = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), np.uint8)
  Image.fromarray(noise // 2 + value // 2).save(buf, "JPEG")
  return buf.getvalue()


def test_bad_files_are_skipped_and_named(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  make_flat(tmp_path, 4)
  (tmp_path / "corrupt.jpg").write_bytes(b"this is not a jpeg at all")
  data = jpeg_bytes()
  (tmp_path / "truncated.jpg").write_bytes(data[: len(data) // 2])
  (tmp_path / "empty.png").write_bytes(b"")
  index = image_folder.scan(str(tmp_path))
  assert sorted(rel for rel, _ in index.skipped) == ["corrupt.jpg", "empty.png", "truncated.jpg"]
  assert len(index.files) == 4
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "skipped 3 unreadable" in warnings[0]
  assert all(name in warnings[0] for name in ("corrupt.jpg", "truncated.jpg", "empty.png"))
  assert sorted(eval_examples(tmp_path, pp=PP_32)) == sorted(index.files)  # Decodes fine.
  summary = [r.getMessage() for r in caplog.records if "split 'all'" in r.getMessage()]
  assert summary and "4 images (unlabelled), 3 skipped, 0 converted, 4 small" in summary[0]


def test_all_bad_folder_names_the_files(tmp_path):
  (tmp_path / "x.jpg").write_bytes(b"junk")
  (tmp_path / "y.png").write_bytes(b"\x89PNG\r\n\x1a\n junk")
  with pytest.raises(ValueError, match=r"none of the 2 image files.*x\.jpg.*y\.png"):
    image_folder.scan(str(tmp_path))


def test_missing_empty_and_nameless_folders(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope"):
    input_pipeline.num_examples("image_folder", "all", str(tmp_path / "nope"))
  (tmp_path / "notes.txt").write_text("no images here")
  (tmp_path / "sub").mkdir()
  with pytest.raises(ValueError, match=rf"no image files in {tmp_path}.*\.jpg, \.jpeg, \.png"):
    input_pipeline.num_examples(f"image_folder:{tmp_path}", "all")
  with pytest.raises(ValueError, match="needs the folder"):
    input_pipeline.num_examples("image_folder", "all")


def test_image_modes_decode_to_rgb(tmp_path):
  """Each mode through 'decode|resize(32)|value_range(-1,1)', against the expected colour."""
  h, w = 10, 12

  def const(mode, value):
    return Image.new(mode, (w, h), value)

  palette = const("RGB", (200, 40, 90)).quantize(4)
  sixteen = Image.fromarray(np.full((h, w), 65535, np.uint16))
  half16 = Image.fromarray(np.full((h, w), 32896, np.uint16))  # 32896 >> 8 == 128.
  cases = {  # name: (image, format, expected RGB 0..255, converted?)
      "gray.png": (const("L", 77), "PNG", (77, 77, 77), False),
      "gray.jpg": (const("L", 77), "JPEG", (77, 77, 77), False),
      "rgba.png": (const("RGBA", (10, 200, 30, 0)), "PNG", (10, 200, 30), False),
      "la.png": (const("LA", (60, 128)), "PNG", (60, 60, 60), False),
      "palette.png": (palette, "PNG", (200, 40, 90), False),
      "sixteen.png": (sixteen, "PNG", (255, 255, 255), False),
      "cmyk.jpg": (const("RGB", (30, 120, 220)).convert("CMYK"), "JPEG", (30, 120, 220), False),
      "sixteen.tif": (half16, "TIFF", (128, 128, 128), True),
      "palette.bmp": (palette, "BMP", (200, 40, 90), True),
      "rgba.webp": (const("RGBA", (10, 200, 30, 5)), "WEBP", (10, 200, 30), True),
      "palette.gif": (palette, "GIF", (200, 40, 90), True),
      "bilevel.tiff": (const("1", 1), "TIFF", (255, 255, 255), True),
  }
  for name, (image, fmt, _, _) in cases.items():
    write(str(tmp_path / name), image, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
  index = image_folder.scan(str(tmp_path))
  assert not index.skipped
  assert {f: c for f, c in zip(index.files, index.needs_conversion)} == {
      name: case[3] for name, case in cases.items()
  }
  got = eval_examples(tmp_path, pp=PP_32)
  for name, (_, _, expected, _) in cases.items():
    image = got[name]["image"]
    assert image.shape == (32, 32, 3) and image.dtype == np.float32, name
    tol = 4 / 127.5 if name.endswith(".jpg") else 1e-6  # JPEG is lossy.
    np.testing.assert_allclose(
        image, np.broadcast_to(np.array(expected) / 127.5 - 1, image.shape), atol=tol, err_msg=name
    )


def test_small_image_goes_through_resize_small_and_crop(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  write(str(tmp_path / "tiny.png"), rgb(9, size=(20, 12)))
  write(str(tmp_path / "big.jpg"), np.zeros((300, 260, 3), np.uint8))
  index = image_folder.scan(str(tmp_path), min_size=100)
  assert index.small == 1 and len(index.files) == 2
  assert any("tiny.png (20x12)" in r.getMessage() for r in caplog.records)
  got = eval_examples(
      tmp_path, pp='decode|resize_small(40)|central_crop(32)|keep("image", "file")', batch=2
  )
  assert {k: v["image"].shape for k, v in got.items()} == {
      "tiny.png": (32, 32, 3),
      "big.jpg": (32, 32, 3),
  }


def test_sample_photos_feed_the_folder_source(tmp_path):
  pytest.importorskip("skimage")
  from linvit_jax.data import sample_photos

  paths = sample_photos.write_sample_photos(str(tmp_path))
  assert len(paths) >= 10 and all(os.path.isfile(p) for p in paths)
  gray = sample_photos.write_sample_photos(str(tmp_path / "gray"), which="gray")
  assert all(Image.open(p).mode == "L" for p in gray)
  got = eval_examples(
      tmp_path,
      pp="decode|resize_small(40)|central_crop(32)|value_range(-1,1)|" 'keep("image", "file")',
      batch=8,
  )
  assert len(got) == len(paths) + len(gray)
  stds = [ex["image"].std() for ex in got.values()]
  assert min(stds) > 0.01  # Real pictures, not blanks.


def test_dangling_symlink_is_skipped(tmp_path):
  make_flat(tmp_path, 2)
  os.symlink(tmp_path / "gone.png", tmp_path / "link.png")
  index = image_folder.scan(str(tmp_path))
  assert [rel for rel, _ in index.skipped] == ["link.png"] and len(index.files) == 2
