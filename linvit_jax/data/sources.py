"""A run's data as plain arguments: the training stream, eval batches, views of the eval split,
an image folder's split and the k-NN sets. build.py reads the config into these arguments; nothing
here knows the config's schema (big_vision hands its input pipeline `config.input`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from linvit_jax.data import image_folder
from linvit_jax.data import input_pipeline
from linvit_jax.data import pp_spec


def _first(batches: Iterable[dict], limit: int) -> Iterator[dict]:
  """The batches up to the one that reaches `limit` examples (counting padded rows: every
  process stops after the same number of batches); limit 0: all of them."""
  seen = 0
  for batch in batches:
    if limit and seen >= limit:
      return
    seen += len(batch["image"])
    yield batch


def train_iter_fn(
    *,
    dataset: str,
    split: str,
    pp: str,
    batch_size: int,
    seed: int,
    data_dir: str | None,
    shuffle_buffer: int,
    compose: str,
    mixup: float = 0.0,
) -> Callable[[int], Iterator[dict]]:
  """`make(start_step)`: the training stream of global batches, resumable at any step; `mixup`
  (a Beta concentration, 0: off) blends each image with its batch neighbour."""

  def make(start_step: int) -> Iterator[dict]:
    return input_pipeline.make_train_iterator(
        dataset=dataset,
        split=split,
        pp=pp,
        global_batch_size=batch_size,
        seed=seed,
        data_dir=data_dir,
        shuffle_buffer=shuffle_buffer,
        start_step=start_step,
        compose=compose,
        mixup=mixup,
    )

  return make


def eval_batches(
    *, dataset: str, split: str, pp: str, batch_size: int, data_dir: str | None, limit: int = 0
) -> Iterator[dict]:
  """The split's global batches (padded, `_mask`), sharded over processes, up to `limit`
  examples (0: all)."""
  it = input_pipeline.make_eval_iterator(
      dataset=dataset, split=split, pp=pp, global_batch_size=batch_size, data_dir=data_dir
  )
  return _first(it, limit)


def local_batches(
    *, dataset: str, split: str, pp: str, batch_size: int, data_dir: str | None, limit: int = 0
) -> Iterator[dict]:
  """The split's batches on this process alone (the same on every process), up to `limit`
  examples (0: all)."""
  it = input_pipeline.make_eval_iterator(
      dataset=dataset,
      split=split,
      pp=pp,
      global_batch_size=batch_size,
      data_dir=data_dir,
      process_index=0,
      process_count=1,
  )
  return _first(it, limit)


def random_views(
    *, dataset: str, split: str, pp: str, n: int, data_dir: str | None, seed: int = 12345
) -> np.ndarray:
  """`n` random views of the split (a training pass over it under a fixed seed, unshuffled), the
  same on every process."""
  it = input_pipeline.make_train_iterator(
      dataset=dataset,
      split=split,
      pp=pp,
      global_batch_size=n,
      seed=seed,
      data_dir=data_dir,
      shuffle_buffer=0,
      process_index=0,
      process_count=1,
  )
  return np.asarray(next(iter(it))["image"])


def first_images(*, dataset: str, split: str, pp: str, n: int, data_dir: str | None) -> np.ndarray:
  """The first `n` images of the split through `pp` (one view each), the same on every process."""
  it = local_batches(dataset=dataset, split=split, pp=pp, batch_size=max(n, 8), data_dir=data_dir)
  out = []
  for batch in it:
    out.append(batch["image"][np.asarray(batch["_mask"])])
    if sum(len(o) for o in out) >= n:
      break
  return np.concatenate(out)[:n]


def image_folder_of(dataset: str, data_dir: str | None) -> str | None:
  """The folder an image-folder dataset reads (`image_folder:PATH`, or data_dir); None when the
  dataset is not an image folder."""
  if dataset != image_folder.NAME and not dataset.startswith(image_folder.NAME + ":"):
    return None
  return dataset[len(image_folder.NAME) + 1 :] or data_dir


def photo_paths(folder: str, split: str) -> tuple[list[str], list[str]]:
  """(paths, names relative to the folder) of an image folder's split, in file order; an empty
  split gives two empty lists. A missing folder or a bad split raises FileNotFoundError or
  ValueError."""
  index = image_folder.scan(folder)
  positions = image_folder.split_files(index.files, split)
  return [index.path(i) for i in positions], [index.files[i] for i in positions]


def with_label(pp_eval: str, label_key: str) -> str:
  """An eval pp string's image ops, keeping the image and `label_key`."""
  image_ops = pp_spec.inference_pp(pp_eval).rsplit("|", 1)[0]  # drop keep("image")
  return f'{image_ops}|keep("image","{label_key}")'
