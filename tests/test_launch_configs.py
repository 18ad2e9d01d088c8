"""launch/tpu_pod.py accepts a config by checkout path or by a shipped config's name."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "launch"))
import tpu_pod  # noqa: E402


@pytest.mark.parametrize(
    "config",
    [
        "configs/imagenet_vit.py:variant=B/16",
        "imagenet_vit",
        "imagenet_vit.py:init=gs://b/x.npz",
        "demo:tiny=True",
    ],
)
def test_paths_and_names_are_accepted(config):
  tpu_pod.check_config(config, ROOT)


@pytest.mark.parametrize("config", ["imagenet", "configs/nope.py", "/abs/configs/demo.py", ""])
def test_unknown_configs_are_refused(config):
  with pytest.raises(tpu_pod.LaunchError):
    tpu_pod.check_config(config, ROOT)
