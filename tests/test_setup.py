"""setup.py's metadata, read without installing: the license, the Python range and the extras.

setup.py runs with `setuptools.setup` replaced by a recorder (runpy), so the tests see exactly the
keyword arguments pip would get, and nothing is built or installed.
"""

import ast
import os
import runpy

import pytest
import setuptools
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_PY = os.path.join(ROOT, "setup.py")
LICENSE = os.path.join(ROOT, "LICENSE")


@pytest.fixture(scope="module")
def setup_kwargs():
  """The keyword arguments setup.py passes to setuptools.setup()."""
  calls = []
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(setuptools, "setup", lambda **kwargs: calls.append(kwargs))
    mp.chdir(ROOT)  # find_packages() looks in the working directory
    runpy.run_path(SETUP_PY, run_name="__main__")
  assert len(calls) == 1, "setup.py calls setup() once"
  return calls[0]


def _jax(requirements):
  """The one requirement on the `jax` distribution itself (not jaxlib, not jax-*)."""
  jax = [Requirement(r) for r in requirements if Requirement(r).name == "jax"]
  assert len(jax) == 1, requirements
  return jax[0]


def test_license_file_is_apache_2():
  assert os.path.isfile(LICENSE), "LICENSE at the repository root"
  with open(LICENSE) as f:
    text = f.read()
  assert text.lstrip().startswith("Apache License"), text[:80]
  assert "Version 2.0, January 2004" in text
  assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it
  assert "Copyright 2026 The linvit_jax Authors." in text


def test_license_metadata_is_apache_2(setup_kwargs):
  assert setup_kwargs["license"] == "Apache-2.0"  # SPDX identifier


def test_python_requires_is_set(setup_kwargs):
  python_requires = setup_kwargs.get("python_requires")
  assert python_requires, "python_requires is set"
  assert SpecifierSet(python_requires).contains("3.11")  # the Python the project is tested on


@pytest.mark.parametrize("extra", ["tpu", "cuda12"])
def test_accelerator_extra_pins_jax_like_install_requires(setup_kwargs, extra):
  """`pip install 'linvit_jax[tpu]'` brings jax[tpu] in exactly install_requires' jax range."""
  jax = _jax(setup_kwargs["install_requires"])
  requirements = setup_kwargs["extras_require"][extra]
  assert len(requirements) == 1, requirements  # jax alone: the rest is install_requires
  pinned = _jax(requirements)
  assert pinned.extras == {extra}
  assert pinned.specifier == jax.specifier and str(jax.specifier), (pinned, jax)
  assert not pinned.marker and not pinned.url


def test_test_extra_is_kept(setup_kwargs):
  names = {Requirement(r).name for r in setup_kwargs["extras_require"]["test"]}
  assert {"pytest", "nbclient", "nbformat", "ipykernel", "pyink", "ruff"} <= names


def test_install_requires_stays_a_literal_list(setup_kwargs):
  """The notebook's install cell reads INSTALL_REQUIRES with ast.literal_eval, without running
  setup.py: the list setup() gets must be that literal."""
  with open(SETUP_PY) as f:
    tree = ast.parse(f.read())
  assigned = [
      node.value
      for node in tree.body
      if isinstance(node, ast.Assign)
      and any(getattr(t, "id", None) == "INSTALL_REQUIRES" for t in node.targets)
  ]
  assert len(assigned) == 1
  assert ast.literal_eval(assigned[0]) == setup_kwargs["install_requires"]


def test_hub_extra_brings_huggingface_hub_and_the_tests_have_it(setup_kwargs):
  """`pip install 'linvit_jax[hub]'` for `init=hf:…` / `timm:…`; CI's [test] runs those tests."""
  extras = setup_kwargs["extras_require"]
  assert {Requirement(r).name for r in extras["hub"]} == {"huggingface_hub"}
  assert set(extras["hub"]) <= set(extras["test"])
  assert not [r for r in setup_kwargs["install_requires"] if "huggingface" in r]  # optional
