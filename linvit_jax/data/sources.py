"""A run's data, read from its config: the training stream, eval batches, the fidelity sample and
the k-NN sets. The driver and the reporting ask here; nothing else reads `config.data`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import ml_collections as mlc
import numpy as np

from linvit_jax.data import image_folder
from linvit_jax.data import input_pipeline
from linvit_jax.data import pp_spec
from linvit_jax.errors import ConfigError


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
    config: mlc.ConfigDict, batch_size: int, seed: int, pp: str = "", mixup: float = 0.0
) -> Callable[[int], Iterator[dict]]:
  """`make(start_step)`: the training stream of global batches, resumable at any step; `pp`
  (a stage's own pp string) replaces config.data.pp_train when given; `mixup` (a stage's Beta
  concentration, 0: off) blends each image with its batch neighbour."""

  def make(start_step: int) -> Iterator[dict]:
    return input_pipeline.make_train_iterator(
        dataset=config.data.dataset,
        split=config.data.train_split,
        pp=pp or config.data.pp_train,
        global_batch_size=batch_size,
        seed=seed,
        data_dir=config.data.data_dir or None,
        shuffle_buffer=config.data.shuffle_buffer,
        start_step=start_step,
        compose=config.data.compose,
        mixup=mixup,
    )

  return make


def eval_batches(
    config: mlc.ConfigDict, pp: str | None = None, max_examples: int = 0
) -> Iterator[dict]:
  """The eval split (padded, `_mask`), at most min(max_examples, data.eval_max_examples)."""
  it = input_pipeline.make_eval_iterator(
      dataset=config.data.eval_dataset or config.data.dataset,
      split=config.data.eval_split,
      pp=pp or config.data.pp_eval,
      global_batch_size=config.data.eval_batch_size,
      data_dir=config.data.data_dir or None,
  )
  return _first(it, min(filter(None, (max_examples, config.data.eval_max_examples)), default=0))


def labelled(config: mlc.ConfigDict) -> bool:
  """Whether top-1 can be measured: the model has a head and the eval data carries labels."""
  if not config.model.num_classes:
    return False
  batch = next(iter(eval_batches(config, max_examples=1)), None)
  return batch is not None and config.data.label_key in batch


def _sample_images(config: mlc.ConfigDict, n: int) -> np.ndarray:
  dataset = config.data.eval_dataset or config.data.dataset
  if config.eval.sample_pp:
    it = input_pipeline.make_train_iterator(
        dataset=dataset,
        split=config.data.eval_split,
        pp=config.eval.sample_pp,
        global_batch_size=n,
        seed=12345,
        data_dir=config.data.data_dir or None,
        shuffle_buffer=0,
        process_index=0,
        process_count=1,
    )
    return np.asarray(next(iter(it))["image"])
  return eval_view_images(config, n)


def eval_view_images(config: mlc.ConfigDict, n: int) -> np.ndarray:
  """The first `n` eval images through `data.pp_eval` (what the exported student's `encode`
  sees: one whole-image view per image), the same on every process."""
  it = input_pipeline.make_eval_iterator(
      dataset=config.data.eval_dataset or config.data.dataset,
      split=config.data.eval_split,
      pp=config.data.pp_eval,
      global_batch_size=max(n, 8),
      data_dir=config.data.data_dir or None,
      process_index=0,
      process_count=1,
  )
  out = []
  for batch in it:
    out.append(batch["image"][np.asarray(batch["_mask"])])
    if sum(len(o) for o in out) >= n:
      break
  return np.concatenate(out)[:n]


def sample_images(config: mlc.ConfigDict) -> np.ndarray:
  """The fidelity / calibration sample (max(8, eval.fidelity_images) images), the same on every
  process: the first eval images, or with `eval.sample_pp` random views of the eval split under
  a fixed seed. A dataset that cannot be read (a missing folder, an unprepared TFDS dataset, a
  wrong data_dir) is the user's to fix: a ConfigError, one line."""
  try:
    return _sample_images(config, max(8, config.eval.fidelity_images))
  except (FileNotFoundError, ValueError, AssertionError, OSError) as e:
    reason = " ".join(str(e).split())
    raise ConfigError(
        f"config.data: cannot read {config.data.eval_dataset or config.data.dataset}"
        f" split {config.data.eval_split!r} (data_dir "
        f"{config.data.data_dir or 'default'!r}): {reason[:600]}"
    ) from e


def photo_paths(
    config: mlc.ConfigDict, split: str, field: str = "eval.test.split"
) -> tuple[list[str], list[str]]:
  """(paths, names relative to the folder) of an image-folder split of the eval dataset (the data
  block's folder), in file order; an empty split gives two empty lists. Not an image folder, or a
  bad split: a ConfigError naming `field`."""
  dataset = config.data.eval_dataset or config.data.dataset
  if dataset != image_folder.NAME and not dataset.startswith(image_folder.NAME + ":"):
    raise ConfigError(
        f"config.{field}={split!r}: the test photos come from an image folder, the eval "
        f"dataset is {dataset!r} (set eval.test.split='' for no test evaluation)"
    )
  folder = dataset[len(image_folder.NAME) + 1 :] or config.data.data_dir
  try:
    index = image_folder.scan(folder)
    positions = image_folder.split_files(index.files, split)
  except (FileNotFoundError, ValueError) as e:
    raise ConfigError(f"config.{field}={split!r} of {folder}: {e}") from e
  return [index.path(i) for i in positions], [index.files[i] for i in positions]


def knn_pp(config: mlc.ConfigDict) -> str:
  """eval.knn.pp, or the run's eval image ops plus the label."""
  knn = config.eval.knn
  if knn.pp:
    return knn.pp
  image_ops = pp_spec.inference_pp(config.data.pp_eval).rsplit("|", 1)[0]  # drop keep("image")
  return f'{image_ops}|keep("image","{knn.label_key}")'


def knn_batches(config: mlc.ConfigDict, split: str, limit: int) -> Iterator[dict]:
  """The first `limit` examples (0: all) of eval.knn's dataset split, on this process alone."""
  knn = config.eval.knn
  it = input_pipeline.make_eval_iterator(
      dataset=knn.dataset,
      split=split,
      pp=knn_pp(config),
      global_batch_size=knn.batch_size,
      data_dir=knn.data_dir or None,
      process_index=0,
      process_count=1,
  )
  return _first(it, limit)
