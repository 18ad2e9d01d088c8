"""Every code block of README.md and docs/usage.md works as written (the README once had a snippet
that failed when pasted); the README keeps its two commands and its links.

Everything is derived from the documents' text, so a command or snippet added later is covered:

- ```python blocks are executed as written, each in a fresh interpreter at a stand-in checkout
  (`sandbox`: the repository's entries linked, the commands' output roots not), so what they write
  (e.g. a workdir that a later run with another config would refuse to reuse) stays out of the
  repository.
- ```bash / ```sh blocks are too expensive to execute (setup, full trainings), so they are
  checked instead: bash syntax; every `python -m MODULE` names a module that exists; every
  `python -m linvit_jax.main ...` (and `linvit_jax.studies.ablation`, the same command line) has a
  --config file that exists and whose config, with its `:arg` and `--config.x=y` overrides, loads
  through main.py's own flags; every repository path a command names exists.
- ```text and unlabelled blocks are output and are skipped; any other language is an error, so a
  new kind of block is not silently left unchecked.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from linvit_jax.configuration import config_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The documents whose code blocks are checked: the README and the usage guide it links.
DOCS = (README, ROOT / "docs" / "usage.md")
# The README's two commands, verbatim: .ci/run runs the second one as written.
DEMO_COMMAND = (
    "bash launch/setup_local.sh && .venv/bin/python -m linvit_jax.main --config configs/demo.py"
    " --workdir workdirs/demo"
)
TEST_COMMAND = (
    "bash launch/setup_local.sh && .venv/bin/python -m pytest -q -n 2 --dist loadfile tests"
)
# The user guide (up to the end of "Use the student") stays short enough to read in one go.
GUIDE_END = "## Use the student"
GUIDE_MAX_LINES = 200

PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")
OUTPUT = ("", "text", "console", "output")
# A word is read as a file path when it has one of these extensions, or when its first component
# is a top-level entry of the repository (so 'variant=S/16' is not a path, 'docs/x' is).
FILE_EXTENSIONS = (".py", ".sh", ".npz", ".json", ".md", ".txt", ".ipynb", ".png", ".jpg", ".csv")
# Made by the README's own setup command (launch/setup_local.sh), not shipped.
MADE_BY_SETUP = (".venv",)
TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Block:
  lang: str
  text: str
  line: int  # 1-based line of the opening fence
  doc: str = "README.md"  # the document, relative to the repository root

  def __str__(self) -> str:
    return f"{self.doc}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Command:
  words: tuple[str, ...]
  line: int  # line of the block it is in
  doc: str = "README.md"

  def module(self) -> str | None:
    """MODULE of `[VAR=x ...] .../pythonX -m MODULE ...`, else None."""
    for i, word in enumerate(self.words[:-2]):
      if re.fullmatch(r"(.*/)?python[\d.]*", word) and self.words[i + 1] == "-m":
        return self.words[i + 2]
    return None

  def module_args(self) -> list[str]:
    i = self.words.index("-m")
    return list(self.words[i + 2 :])

  def __str__(self) -> str:
    return f"{self.doc}:{self.line}: {shlex.join(self.words)}"


def read_blocks(path: pathlib.Path = README) -> list[Block]:
  """The fenced code blocks of a markdown file (``` or ~~~ fences, info string's first word)."""
  blocks, fence, lang, start, body = [], None, "", 0, []
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    if fence is None:
      m = re.match(r" {0,3}(`{3,}|~{3,})\s*([^\s`]*)", line)
      if m:
        fence, lang, start, body = m.group(1), m.group(2).lower(), number, []
    elif re.fullmatch(r" {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*", line):
      blocks.append(Block(lang, "\n".join(body) + "\n", start, path.relative_to(ROOT).as_posix()))
      fence = None
    else:
      body.append(line)
  assert fence is None, f"{path.relative_to(ROOT)}:{start}: code block never closed"
  return blocks


def shell_commands(block: Block) -> list[Command]:
  """The simple commands of a shell block: continuations joined, split at && || ; | &."""
  commands = []
  for line in block.text.replace("\\\n", " ").splitlines():
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in [*lexer, ";"]:
      if token in ("&&", "||", ";", "|", "&"):
        while words and re.fullmatch(r"\w+=.*", words[0]):  # VAR=value prefixes
          words.pop(0)
        if words:
          commands.append(Command(tuple(words), block.line, block.doc))
        words = []
      else:
        words.append(token)
  return commands


BLOCKS = [b for doc in DOCS for b in read_blocks(doc)]
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang in PYTHON]
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL]
COMMANDS = [c for b in SHELL_BLOCKS for c in shell_commands(b)]
# Modules whose command line is main.py's (--config, --workdir, overrides).
CLI_MODULES = ("linvit_jax.main", "linvit_jax.studies.ablation")
MAIN_COMMANDS = [c for c in COMMANDS if c.module() in CLI_MODULES]


def _option(args: list[str], name: str) -> str | None:
  """The value of `--name v` / `--name=v` in args (the last one, as absl does)."""
  value = None
  for i, arg in enumerate(args):
    if arg == f"--{name}" and i + 1 < len(args):
      value = args[i + 1]
    elif arg.startswith(f"--{name}="):
      value = arg.split("=", 1)[1]
  return value


def _output_roots() -> set[str]:
  """Top directories the README's commands write into (their --workdir's first component)."""
  roots = set(MADE_BY_SETUP)
  for command in MAIN_COMMANDS:
    workdir = _option(command.module_args(), "workdir")
    if workdir and "://" not in workdir and not os.path.isabs(workdir):
      roots.add(pathlib.PurePosixPath(workdir).parts[0])
  return roots


OUTPUT_ROOTS = _output_roots()


def _candidate_values(command: Command) -> list[str]:
  """Every string in a command that might name a file: words, `--flag=v` values, and the
  `key=v` items of a config's `:arg`."""
  values = []
  for word in command.words:
    if word.startswith("-") and "=" in word:
      word = word.split("=", 1)[1]
    if ":" in word and not re.match(r"\w+://", word):  # FILE:ARG, not a URL
      path, _, arg = word.partition(":")
      values.append(path)
      values.extend(item.split("=", 1)[1] for item in arg.split(",") if "=" in item)
    else:
      values.append(word)
  return values


def _local_path(value: str) -> pathlib.PurePosixPath | None:
  """`value` as a relative local path the README means, or None if it is not one."""
  if not value or "://" in value or os.path.isabs(value) or re.search(r"[<>*?\[\]{}$ ]", value):
    return None
  path = pathlib.PurePosixPath(value)
  if path.parts[0] == "..":
    return path  # outside the checkout: see _external
  if path.suffix in FILE_EXTENSIONS or ("/" in value and (ROOT / path.parts[0]).exists()):
    return path
  return None


def _is_output(path: pathlib.PurePosixPath) -> bool:
  return path.parts[0] in OUTPUT_ROOTS


def _external(path: pathlib.PurePosixPath) -> bool:
  """A path outside the checkout (e.g. ../shared/fixtures): not shipped with the repository."""
  return path.parts[0] == ".."


# ------------------------------------------------------------------------------------------------
# The README itself.


def test_readme_has_blocks_of_known_kinds():
  assert PYTHON_BLOCKS and MAIN_COMMANDS, "README parsing found no python block or main command"
  unknown = [f"{b}: ```{b.lang}" for b in BLOCKS if b.lang not in PYTHON + SHELL + OUTPUT]
  assert not unknown, (
      "code blocks of a language this test does not check (run them, or mark "
      f"output as ```text): {unknown}"
  )


def test_readme_keeps_the_two_commands_verbatim():
  """The demo and the test command, each alone in a bash block, exactly as .ci/run runs them."""
  readme_blocks = [b.text.strip() for b in SHELL_BLOCKS if b.doc == "README.md"]
  for command in (DEMO_COMMAND, TEST_COMMAND):
    assert command in readme_blocks, f"README.md: no bash block holding exactly: {command}"
  ci = (ROOT / ".ci" / "run").read_text().splitlines()
  assert TEST_COMMAND in ci, f".ci/run no longer runs the README's test command: {TEST_COMMAND}"


def test_readme_guide_is_short():
  """What it does, the two commands, converting and using a student: a read, not a notebook."""
  lines = README.read_text(encoding="utf-8").splitlines()
  assert GUIDE_END in lines, f"README.md: no '{GUIDE_END}' section"
  start = lines.index(GUIDE_END)
  end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
  assert end <= GUIDE_MAX_LINES, (
      f"README.md: the guide runs to line {end} (to the end of '{GUIDE_END}'); keep it within "
      f"{GUIDE_MAX_LINES} lines and move the detail to docs/"
  )


# ------------------------------------------------------------------------------------------------
# Python blocks: run as written.


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=str)
def test_python_block_runs_as_written(block, sandbox):
  result = subprocess.run(
      [sys.executable, "-c", block.text],
      cwd=sandbox,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_S,
      check=False,
  )
  assert result.returncode == 0, (
      f"{block}: python block failed " f"(exit {result.returncode}):\n{result.stderr[-4000:]}"
  )


# ------------------------------------------------------------------------------------------------
# Shell blocks: syntax, modules, paths, and the main commands' configs.


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=str)
def test_shell_block_syntax(block):
  result = subprocess.run(
      ["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=60, check=False
  )
  assert result.returncode == 0, f"{block}: bash syntax error: {result.stderr}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.module()], ids=str)
def test_python_module_exists(command):
  module = command.module()
  if module.split(".")[0] == "linvit_jax":
    base = ROOT.joinpath(*module.split("."))
    assert (
        base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
    ), f"{command}: no module {module} in the repository"
  else:
    import importlib.util

    assert (
        importlib.util.find_spec(module.split(".")[0]) is not None
    ), f"{command}: module {module} is not installed"


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_repository_paths_exist(command):
  missing = []
  workdir = _option(command.module_args(), "workdir") if command.module() else None
  for value in _candidate_values(command):
    path = _local_path(value)
    if path is None or value == workdir or _is_output(path) or _external(path):
      continue
    if not (ROOT / path).exists():
      missing.append(str(path))
  assert not missing, f"{command}: names files the repository does not have: {missing}"


def _made_by_earlier_commands(command: Command) -> list[pathlib.PurePosixPath]:
  """Output paths that README commands before `command` create (e.g. a folder of photos)."""
  made = []
  for earlier in COMMANDS[: COMMANDS.index(command)]:
    if earlier.words[:2] == ("bash", "launch/setup_photos.sh"):  # TRAIN_DIR CROSS_DIR: folders
      words = list(earlier.words[2:])
    elif earlier.module() in (None, *CLI_MODULES):
      continue
    else:
      words = earlier.module_args()
    for word in words:
      path = _local_path(word) or (pathlib.PurePosixPath(word) if "/" in word else None)
      if path is not None and not word.startswith("-") and _is_output(path):
        made.append(path)
  return made


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> pathlib.Path:
  """A stand-in checkout: every top-level entry of the repository symlinked, except the
  commands' output roots, so outputs of earlier commands can be made without touching the repo.
  Its parent has the checkout's siblings that the README names (e.g. ../shared)."""
  base = tmp_path_factory.mktemp("readme")
  checkout = base / ROOT.name
  checkout.mkdir()
  for entry in os.listdir(ROOT):
    if entry not in OUTPUT_ROOTS - set(MADE_BY_SETUP):
      (checkout / entry).symlink_to(ROOT / entry)
  siblings = {
      p.parts[1]
      for c in COMMANDS
      for v in _candidate_values(c)
      if (p := _local_path(v)) is not None and _external(p) and len(p.parts) > 1
  }
  for sibling in siblings:
    if (ROOT.parent / sibling).exists():
      (base / sibling).symlink_to(ROOT.parent / sibling)
  return checkout


# Loads the config exactly as `python -m linvit_jax.main ARGS` (or .ablation) does, then stops:
# main.py's flags (so flags added to main.py later are known) and ml_collections, which reads the
# --config.x=y overrides from sys.argv.
_LOAD_CONFIG = """
import sys
from linvit_jax.configuration import config_files
from linvit_jax import main
argv = config_files.resolve_config_argv(["linvit_jax.main", *sys.argv[1:]])
sys.argv = argv
main.FLAGS(argv)
assert main.FLAGS.config is not None, "no config loaded"
assert main.FLAGS.workdir, "no --workdir"
print("loaded", sorted(main.FLAGS.config.keys()))
"""


@pytest.mark.parametrize("command", MAIN_COMMANDS, ids=str)
def test_main_command_config_loads(command, sandbox):
  args = command.module_args()
  config = _option(args, "config")
  assert config, f"{command}: no --config"
  config_file = config.split(":", 1)[0]
  assert (ROOT / config_file).is_file() or config_files.find_config(
      config_file
  ), f"{command}: --config file {config_file} does not exist and is no shipped config's name"

  for value in _candidate_values(command):
    if re.fullmatch(
        r"<[\w .-]+>", value
    ):  # a placeholder the reader fills in (`init=<checkpoint>`)
      pytest.skip(f"{value} is the reader's own")
    path = _local_path(value)
    if path is not None and _external(path) and not (ROOT / path).exists():
      pytest.skip(f"{path} is outside the repository and absent here")
  for path in _made_by_earlier_commands(command):
    (sandbox / path).mkdir(parents=True, exist_ok=True)

  # linvit_jax from this checkout, not through the sandbox's links (-P: no cwd on sys.path).
  flags = ["-P"] if sys.version_info >= (3, 11) else []
  env = {
      **os.environ,
      "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
  }
  result = subprocess.run(
      [sys.executable, *flags, "-c", _LOAD_CONFIG, *args],
      cwd=sandbox,
      env=env,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_S,
      check=False,
  )
  assert (
      result.returncode == 0 and "loaded" in result.stdout
  ), f"{command}: config does not load (exit {result.returncode}):\n{result.stderr[-4000:]}"


_MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


@functools.cache
def _tracked_files() -> frozenset[str] | None:
  """Paths git tracks (a link to a file made locally but never committed breaks on a clone)."""
  try:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
  except (OSError, subprocess.CalledProcessError):
    return None
  return frozenset(out.splitlines())


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        "bench/RESULTS.md",
        *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
    ],
)
def test_markdown_links_name_committed_files(doc):
  tracked = _tracked_files()
  missing = []
  for target in _MARKDOWN_LINK.findall((ROOT / doc).read_text()):
    target = target.split("#")[0]
    if not target or re.match(r"[a-z]+:", target):  # anchors, http(s):, mailto:
      continue
    path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
    if path.startswith(".."):  # beside the checkout (../shared)
      continue
    exists = (ROOT / path).exists()
    committed = tracked is None or path in tracked or any(t.startswith(path + "/") for t in tracked)
    if not (exists and committed):
      missing.append(target)
  assert not missing, f"{doc} links to files the repository does not have: {missing}"
