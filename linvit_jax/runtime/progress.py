"""Progress bars for the long work after training (the report's k-NN features, the test photos'
forwards): without them a full run sits silent for ~18 minutes after its last stage bar. A tqdm
bar with a rate and an ETA on process 0's stderr, closed (its last state left on screen) when
the work ends; other processes, and LINVIT_PROGRESS=0, get no bar.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import jax
import tqdm

T = TypeVar("T")

ENV = "LINVIT_PROGRESS"  # "0": no bars (e.g. a log file that should hold only lines)


def enabled() -> bool:
  """Whether this process draws bars: process 0, unless LINVIT_PROGRESS=0."""
  return jax.process_index() == 0 and os.environ.get(ENV, "1") != "0"


def bar(total: int | None, desc: str, unit: str) -> Any:
  """A tqdm bar of `total` units (None: a counter without ETA), disabled where `enabled` says."""
  return tqdm.tqdm(
      total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=1.0, disable=not enabled()
  )


def iterate(items: Iterable[T], total: int | None, desc: str, unit: str) -> Iterator[T]:
  """`items` unchanged, one bar step per item; the bar closes when the items end (or the
  consumer stops early)."""
  with bar(total, desc, unit) as b:
    for item in items:
      yield item
      b.update(1)
