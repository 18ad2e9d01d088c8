"""Runs notebooks/linvit_colab.ipynb on this machine's CPU and stores it with its outputs.

From the repository root, with linvit_jax installed (`pip install -e '.[test]'`):

  .venv/bin/python notebooks/run_and_save.py          # its own setting (~9 min on 2 CPU cores)
  .venv/bin/python notebooks/run_and_save.py --small  # the tests' smoke setting (~1.5 min)

The notebook is stored with its outputs so that a reader sees the tables and plots without running
it. Paths of the machine that ran it become `<repo>`, `<workdir>` and `~` in the outputs; a hash of
the code cells goes into the notebook's metadata, so the tests tell when the stored outputs no
longer come from the code beside them.
"""

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NOTEBOOK = os.path.join(HERE, "linvit_colab.ipynb")
METADATA_KEY = "linvit_jax"  # notebook metadata: how the stored outputs were made
CELL_TIMEOUT_S = 1800
KERNEL_STARTUP_S = 180


def code_sha256(nb: nbformat.NotebookNode) -> str:
  """A hash of the code cells' sources: what the stored outputs were made from."""
  sources = [c.source for c in nb.cells if c.cell_type == "code"]
  return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def kernel_manager(kernel_dir: str):
  """A kernel manager for this interpreter.

  A private kernelspec with an absolute path: whatever 'python3' kernelspecs the machine has (a
  user-level one may name another Python), the notebook runs where linvit_jax is installed.
  """
  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import KernelManager

  spec_dir = os.path.join(kernel_dir, "linvit-test")
  os.makedirs(spec_dir, exist_ok=True)
  with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
    json.dump(
        {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "linvit_jax tests",
            "language": "python",
        },
        f,
    )
  return KernelManager(
      kernel_name="linvit-test", kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernel_dir])
  )


def execute(
    nb: nbformat.NotebookNode, cwd: str, kernel_dir: str, timeout: int = CELL_TIMEOUT_S
) -> None:
  """Runs every cell of `nb` in place, in a fresh kernel whose working directory is `cwd`.

  Raises nbclient's CellExecutionError (with the traceback) on the first failing cell. The
  notebook's own metadata (Colab's accelerator, the 'python3' kernelspec) is kept: nbclient would
  write this machine's language_info into it.
  """
  from nbclient import NotebookClient

  metadata = copy.deepcopy(nb.metadata)
  client = NotebookClient(
      nb,
      km=kernel_manager(kernel_dir),
      timeout=timeout,
      startup_timeout=KERNEL_STARTUP_S,
      record_timing=False,
      resources={"metadata": {"path": cwd}},
  )
  try:
    client.execute()
  finally:
    nb.metadata = metadata


def machine_paths(workdir: str, cwd: str) -> list[tuple[str, str]]:
  """(path on this machine, what a reader sees instead), the most specific first."""
  pairs = [
      (os.path.realpath(workdir), "<workdir>"),
      (os.path.abspath(workdir), "<workdir>"),
      (os.path.realpath(cwd), "<cwd>"),
      (os.path.abspath(cwd), "<cwd>"),
      (os.path.realpath(ROOT), "<repo>"),
      (ROOT, "<repo>"),
  ]
  home = os.path.expanduser("~")
  if home not in ("", "/"):
    pairs.append((home, "~"))
  return sorted(set(pairs), key=lambda p: -len(p[0]))


def _replace(value, pairs):
  if isinstance(value, str):
    for path, placeholder in pairs:
      value = value.replace(path, placeholder)
    return value
  if isinstance(value, list):
    return [_replace(v, pairs) for v in value]
  if isinstance(value, dict):
    # Images stay as they are: base64 never spells a path, and rewriting it would break them.
    return {k: v if k.startswith("image/") else _replace(v, pairs) for k, v in value.items()}
  return value


def _settle_carriage_returns(text: str) -> str:
  """What a terminal shows of `text`: on each line, what follows its last carriage return."""
  return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def _merge_streams(outputs: list) -> list:
  """Consecutive outputs of one stream as one, progress bars at their last state.

  A progress bar is one output per update (hundreds in a long stage); a reader wants its end.
  """
  merged = []
  for output in outputs:
    if (
        output.output_type == "stream"
        and merged
        and merged[-1].output_type == "stream"
        and merged[-1].name == output.name
    ):
      merged[-1].text += output.text
    else:
      merged.append(copy.deepcopy(output))
  for output in merged:
    if output.output_type == "stream":
      output.text = _settle_carriage_returns(output.text)
  return merged


def sanitize(nb: nbformat.NotebookNode, pairs: list[tuple[str, str]]) -> None:
  """Rewrites this machine's paths in every output (streams, text data, error tracebacks) and
  merges each stream's consecutive outputs."""
  for cell in nb.cells:
    if cell.cell_type == "code":
      outputs = [nbformat.from_dict(_replace(dict(o), pairs)) for o in cell.outputs]
      cell.outputs = _merge_streams(outputs)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--small", action="store_true", help="the tests' smoke setting")
  parser.add_argument("--out", default=NOTEBOOK, help="where to write the executed notebook")
  args = parser.parse_args(argv)
  if importlib.util.find_spec("linvit_jax") is None:
    # The notebook's install cell would clone and pip-install into this interpreter otherwise.
    sys.exit("linvit_jax is not importable here: pip install -e '.[test]' first")

  nb = nbformat.read(NOTEBOOK, as_version=4)
  # The stored run is a CPU run wherever this script runs; the notebook's parameters otherwise.
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.pop("LINVIT_NOTEBOOK_TEACHER", None)
  os.environ.pop("LINVIT_NOTEBOOK_SMALL", None)
  if args.small:
    os.environ["LINVIT_NOTEBOOK_SMALL"] = "1"
  with tempfile.TemporaryDirectory(prefix="linvit_run_and_save_") as tmp:
    cwd, workdir = os.path.join(tmp, "cwd"), os.path.join(tmp, "workdir")
    os.makedirs(cwd)
    os.environ["LINVIT_NOTEBOOK_WORKDIR"] = workdir
    start = time.time()
    execute(nb, cwd=cwd, kernel_dir=os.path.join(tmp, "kernels"))
    seconds = time.time() - start
    sanitize(nb, machine_paths(workdir, cwd))
  nb.metadata[METADATA_KEY] = {
      "outputs": f"CPU run, {'small' if args.small else 'default'} setting, {seconds:.0f} s",
      "code_sha256": code_sha256(nb),
  }
  nbformat.validate(nb)
  nbformat.write(nb, args.out)
  print(f"{args.out}: executed in {seconds:.0f} s, {os.path.getsize(args.out) / 2**10:.0f} KiB")


if __name__ == "__main__":
  main()
