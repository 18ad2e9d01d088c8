"""linvit_jax: copy the same, distill the difference — softmax ViT → linear-attention ViT in JAX."""

import re

from setuptools import find_packages
from setuptools import setup

# Ranges are the ones this project was tested with (jax 0.10.x, flax 0.12.x on CPython 3.11).
# A plain list of strings: the notebook's install cell reads it with ast.literal_eval.
INSTALL_REQUIRES = [
    "jax>=0.10,<0.11",
    "flax>=0.12,<0.13",
    "optax>=0.2.5,<0.3",
    "orbax-checkpoint>=0.11,<0.13",
    "ml-collections>=1.0,<2",
    "tensorflow-cpu>=2.18,<2.22",
    "tensorflow-datasets>=4.9,<5",
    "numpy>=2.0,<3",
    "scipy>=1.13,<2",
    "tqdm>=4.66,<5",
    "matplotlib>=3.8,<4",
    "absl-py>=2.1,<3",
    "scikit-image>=0.22",
    # student.safetensors export (numpy API: no torch); from 0.4.1 safe_open's numpy framework
    # returns bfloat16 tensors (as ml_dtypes.bfloat16)
    "safetensors>=0.4.1,<1",
    # tensorflow-datasets 4.9.x imports it but declares it only for Python < 3.9.
    "importlib_resources>=6",
]

# jax's version range, as INSTALL_REQUIRES gives it: the accelerator extras pin the same jax.
JAX_VERSIONS = next(r for r in INSTALL_REQUIRES if re.match(r"jax(?![\w.-])", r))[len("jax") :]
# `pip install 'linvit_jax[tpu]'` / `'linvit_jax[cuda12]'`: plain `jax` runs on CPU only.
ACCELERATOR_EXTRAS = {extra: [f"jax[{extra}]{JAX_VERSIONS}"] for extra in ("tpu", "cuda12")}

HUB_REQUIRES = ["huggingface_hub>=0.23,<3"]

setup(
    name="linvit_jax",
    version="0.1.0",
    description="Convert pretrained softmax ViTs (big_vision layout) to linear-attention ViTs by "
    "copying the operator-agnostic weights and distilling attention outputs.",
    # configs/ stays at the top of the repository (`--config configs/demo.py`) and ships inside
    # the wheel as `linvit_jax.configs`, where linvit_jax.configuration.config_files finds it by name
    # (`--config demo`). It has no __init__.py: the files are loaded by path, never imported.
    packages=find_packages(include=["linvit_jax", "linvit_jax.*"]) + ["linvit_jax.configs"],
    package_dir={"linvit_jax.configs": "configs"},
    # The notebook's headless example reads assets/tiny_dinov2_registers (a 108 KB HF folder).
    # The model card's template (linvit_jax.artifacts.model_card) ships as data too.
    package_data={
        "linvit_jax": ["assets/*.npz", "assets/*.json", "assets/*.md", "assets/tiny_*/*"],
        "linvit_jax.artifacts": ["model_card.md"],
    },
    license="Apache-2.0",
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={
        **ACCELERATOR_EXTRAS,
        # `init=hf:facebook/dinov2-small` / `timm:<name>` (linvit_jax.models.hub): snapshot_download
        # with allow_patterns and local_files_only, stable across these releases; tested on 2.4.
        "hub": HUB_REQUIRES,
        "test": [
            *HUB_REQUIRES,  # the hub tests read a cache laid out by huggingface_hub, offline
            "pytest>=8,<10",
            "pytest-xdist>=3.5,<4",
            "nbclient>=0.10,<1",
            "nbformat>=5.10,<6",
            "ipykernel>=6.29,<8",
            # The code style, enforced by .ci/run (settings in pyproject.toml).
            "pyink>=24,<27",
            "ruff>=0.5,<1",
        ],
    },
)
