#!/usr/bin/env python3
r"""Run any linvit_jax config on a Cloud TPU VM (single host or pod slice) with gcloud.

  python launch/tpu_pod.py all --name linvit-s16 --zone us-central2-b --accelerator_type v4-32 \
      --config 'configs/imagenet_vit.py:variant=S/16,data_dir=gs://BUCKET/tensorflow_datasets' \
      --workdir gs://BUCKET/linvit/s16_hedgehog [--queued] [--spot] [--keep] [--dry_run]

Subcommands (each prints the commands it runs; --dry_run prints them and runs nothing):
  create   the TPU VM (`tpu-vm create`, or with --queued a queued resource, waiting for ACTIVE)
  setup    tar this checkout → scp to every worker → a Python venv there (uv) with
           `pip install -e . jax[tpu]`
  run      `python -m linvit_jax.main --config … --workdir …` on every worker (--worker=all):
           each worker tees into ~/linvit_jax_logs/<stamp>.worker<i>.log (latest.log links the
           newest); here the output streams prefixed "[w<i>]" and is split into
           workdirs/launch_logs/<name>/<stamp>.worker<i>.log. --detach starts it under nohup.
  logs     tail (-F with --follow) every worker's latest log
  ssh      any shell command on every worker (after --), e.g. -- 'sudo lsof -w /dev/accel0'
  delete   the TPU VM (or the queued resource and its VM)
  all      create → setup → run → delete; delete runs in a `finally` unless --keep

Multi-host: every worker runs the same command; the run script exports JAX_COORDINATOR_ADDRESS
(worker 0, port 8476), JAX_NUM_PROCESSES and JAX_PROCESS_ID from the VM metadata, which
linvit_jax.runtime.distributed.maybe_initialize_distributed turns into
`jax.distributed.initialize(...)`. A pod's workers share nothing but GCS, so --workdir must be
gs:// when the slice has more than one host. Stdlib only: runs without the project's virtualenv.
Commands are argument lists (no local shell); the remote scripts quote every value with shlex.

Hosts per accelerator type (what `HOSTS_TABLE` encodes; N is the number in the type name):
  v2-N, v3-N       N TensorCores, 2 per chip, 4 chips per host: N/8 hosts, N JAX devices
  v4-N, v5p-N      N TensorCores, 2 per chip (one megacore JAX device per chip), 4 chips per host:
                   max(1, N/8) hosts, N/2 devices            (v4-8: 1 host; v4-32: 4 hosts)
  v5litepod-N,     N chips, 1 TensorCore each; N <= 8 is one host (an 8-chip host for N = 8),
  v6e-N            larger slices have 4 chips per host: N/4 hosts   (v5litepod-16: 4 hosts)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import IO

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_LOG_DIR = "linvit_jax_logs"  # under $HOME on every worker
JAX_COORDINATOR_PORT = 8476  # what jax.distributed uses on Cloud TPU by default
QUEUED_POLL_S = 30
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
# Everything a worker does not need from the checkout (and what could be large or private).
TAR_EXCLUDES = (
    "./.git",
    "./.venv",
    "./workdirs",
    "./tmp",
    "./build",
    "__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".ipynb_checkpoints",
)
DEFAULT_ENV = ("TF_CPP_MIN_LOG_LEVEL=1",)  # TensorFlow (tf.data, gfile) C++ INFO spam off


class LaunchError(Exception):
  """A launch that cannot work as asked, found before anything runs."""


# ------------------------------------------------------------------------------------------------
# Accelerator types.


@dataclasses.dataclass(frozen=True)
class Family:
  counts: str  # what N in "<family>-N" counts: "cores" or "chips"
  cores_per_chip: int
  devices_per_chip: int  # JAX devices per chip (megacore chips show one device for 2 cores)
  chips_per_host: int  # in multi-host slices
  max_single_host_chips: int  # slices up to this many chips are one host
  multi_host_chip_multiple: int  # multi-host slices have a multiple of this many chips
  runtime: str  # default --version (TPU VM software)


HOSTS_TABLE = {
    "v2": Family("cores", 2, 2, 4, 4, 4, "tpu-ubuntu2204-base"),
    "v3": Family("cores", 2, 2, 4, 4, 4, "tpu-ubuntu2204-base"),
    "v4": Family("cores", 2, 1, 4, 4, 4, "tpu-ubuntu2204-base"),
    "v5p": Family("cores", 2, 1, 4, 4, 4, "v2-alpha-tpuv5"),
    # 2D slices 4x4 … 16x16 (16 … 256 chips) beyond the single-host 1, 4 and 8.
    "v5litepod": Family("chips", 1, 1, 4, 8, 16, "v2-alpha-tpuv5-lite"),
    "v6e": Family("chips", 1, 1, 4, 8, 16, "v2-alpha-tpuv6e"),
}


@dataclasses.dataclass(frozen=True)
class SliceInfo:
  accelerator_type: str
  chips: int
  hosts: int
  devices: int  # JAX devices in the whole slice
  default_runtime: str

  def describe(self) -> str:
    per_host = self.chips // self.hosts
    return (
        f"{self.accelerator_type} = {self.chips} chips, {self.hosts} host"
        f"{'s' if self.hosts > 1 else ''} × {per_host} chips, {self.devices} JAX devices "
        f"({self.devices // self.hosts} per process)"
    )


def slice_info(accelerator_type: str, hosts_override: int = 0) -> SliceInfo:
  """Chips, hosts and JAX devices of an accelerator type such as 'v4-32' (see HOSTS_TABLE)."""
  m = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type)
  if not m or m.group(1) not in HOSTS_TABLE:
    raise LaunchError(
        f"--accelerator_type={accelerator_type!r}: expected <family>-<N> with family one of "
        f"{sorted(HOSTS_TABLE)} (e.g. v4-32, v5litepod-16)"
    )
  fam, n = HOSTS_TABLE[m.group(1)], int(m.group(2))
  chips = n // fam.cores_per_chip if fam.counts == "cores" else n
  if chips < 1 or (fam.counts == "cores" and n % fam.cores_per_chip):
    raise LaunchError(
        f"--accelerator_type={accelerator_type!r}: {n} TensorCores is not a whole "
        f"number of {fam.cores_per_chip}-core chips"
    )
  if hosts_override:
    hosts = hosts_override
  elif chips <= fam.max_single_host_chips:
    hosts = 1
  elif chips % fam.multi_host_chip_multiple:
    raise LaunchError(
        f"--accelerator_type={accelerator_type!r}: multi-host {m.group(1)} slices "
        f"have a multiple of {fam.multi_host_chip_multiple} chips, not {chips}; "
        "pass --hosts if this type really exists"
    )
  else:
    hosts = chips // fam.chips_per_host
  return SliceInfo(accelerator_type, chips, hosts, chips * fam.devices_per_chip, fam.runtime)


# ------------------------------------------------------------------------------------------------
# Checks on the arguments.


def check_name(name: str) -> None:
  if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name or ""):
    raise LaunchError(
        f"--name={name!r}: a TPU name is 1-63 lowercase letters, digits or '-', "
        "starting with a letter and not ending with '-'"
    )


def check_workdir(workdir: str | None, info: SliceInfo) -> None:
  if not workdir:
    raise LaunchError("--workdir is required for 'run' (use gs://BUCKET/... on a pod)")
  if info.hosts > 1 and not workdir.startswith("gs://"):
    raise LaunchError(
        f"--workdir={workdir!r} is a local path, but {info.accelerator_type} has {info.hosts} "
        f"hosts: each worker would write its own disk, so checkpoints, resume and the exports "
        f"would be split across machines (and lost with the VM). Use a GCS bucket in the same "
        f"region as the TPU, e.g. --workdir gs://BUCKET/linvit/run1"
    )


def check_config(config: str | None, repo_root: str | None = None) -> None:
  repo_root = repo_root or REPO_ROOT
  if not config:
    raise LaunchError("--config is required for 'run', e.g. --config configs/demo.py:tiny=True")
  path = config.split(":", 1)[0]  # the ':arg' part may itself contain ':' (gs://...)
  stem = path[:-3] if path.endswith(".py") else path
  if "/" not in stem and os.path.isfile(os.path.join(repo_root, "configs", stem + ".py")):
    return  # a shipped config's name ('imagenet_vit'): main.py resolves it on every worker
  if os.path.isabs(path) or not os.path.isfile(os.path.join(repo_root, path)):
    raise LaunchError(
        f"--config={config!r}: {path!r} is not a file of this checkout "
        f"({repo_root}); configs travel with the repository, so give a path "
        "relative to its root such as configs/imagenet_vit.py"
    )


def normalize_overrides(items: Sequence[str]) -> list[str]:
  """'a.b=1', 'config.a.b=1' and '--config.a.b=1' all become '--config.a.b=1'; nothing else."""
  out = []
  for item in items:
    if item.startswith("--config."):
      out.append(item)
    elif item.startswith("-"):  # e.g. a launcher flag put after '--' by mistake
      raise LaunchError(
          f"{item!r} after '--' (or in --extra) is not a config override; "
          "overrides look like --config.finetune.steps=100 or finetune.steps=100, "
          "and launcher flags go before '--'"
      )
    elif "=" not in item:
      raise LaunchError(f"--extra {item!r}: expected key=value (a config override) or a --flag")
    elif item.startswith("config."):
      out.append("--" + item)
    else:
      out.append("--config." + item)
  return out


def jax_tpu_requirement(repo_root: str | None = None) -> str:
  """'jax[tpu]' with the version range setup.py pins jax to (the range the project is tested on)."""
  repo_root = repo_root or REPO_ROOT
  try:
    with open(os.path.join(repo_root, "setup.py")) as f:
      m = re.search(r"""["']jax\s*([<>=!~][^"']*)["']""", f.read())
  except OSError:
    m = None
  return "jax[tpu]" + (m.group(1).replace(" ", "") if m else "")


# ------------------------------------------------------------------------------------------------
# Commands. Each builder returns an argument list; nothing here runs anything.


@dataclasses.dataclass
class Target:
  name: str
  zone: str
  project: str = ""

  def flags(self) -> list[str]:
    return [f"--zone={self.zone}"] + ([f"--project={self.project}"] if self.project else [])


def create_cmds(
    t: Target, accelerator_type: str, runtime: str, *, queued: bool, spot: bool, preemptible: bool
) -> list[list[str]]:
  if queued:
    if preemptible:
      raise LaunchError("--preemptible does not exist for queued resources; use --spot")
    return [
        [
            "gcloud",
            "compute",
            "tpus",
            "queued-resources",
            "create",
            t.name,
            f"--node-id={t.name}",
            *t.flags(),
            f"--accelerator-type={accelerator_type}",
            f"--runtime-version={runtime}",
            *(["--spot"] if spot else []),
        ]
    ]
  if spot and preemptible:
    raise LaunchError("--spot and --preemptible exclude each other (spot is the newer kind)")
  return [
      [
          "gcloud",
          "compute",
          "tpus",
          "tpu-vm",
          "create",
          t.name,
          *t.flags(),
          f"--accelerator-type={accelerator_type}",
          f"--version={runtime}",
          *(["--spot"] if spot else []),
          *(["--preemptible"] if preemptible else []),
      ]
  ]


def queued_state_cmd(t: Target) -> list[str]:
  return [
      "gcloud",
      "compute",
      "tpus",
      "queued-resources",
      "describe",
      t.name,
      *t.flags(),
      "--format=value(state.state)",
  ]


def delete_cmds(t: Target, *, queued: bool) -> list[list[str]]:
  if queued:  # --force also deletes the TPU VM the queued resource made
    return [
        [
            "gcloud",
            "compute",
            "tpus",
            "queued-resources",
            "delete",
            t.name,
            *t.flags(),
            "--force",
            "--quiet",
        ]
    ]
  return [["gcloud", "compute", "tpus", "tpu-vm", "delete", t.name, *t.flags(), "--quiet"]]


def ssh_cmd(t: Target, remote: str | Sequence[str], worker: str = "all") -> list[str]:
  """`remote`: a command line for the worker's login shell, or script lines for bash_c."""
  command = remote if isinstance(remote, str) else bash_c(remote)
  return [
      "gcloud",
      "compute",
      "tpus",
      "tpu-vm",
      "ssh",
      t.name,
      *t.flags(),
      f"--worker={worker}",
      f"--command={command}",
  ]


def bash_c(lines: Sequence[str]) -> str:
  """A remote command line that runs `lines` with bash, whatever the login shell is.

  One line (a ';' after each statement, none after a background '&'), so printed commands stay
  one per line.
  """
  script = "".join(line + (" " if line.endswith("&") else "; ") for line in lines).rstrip("; ")
  return "bash -c " + shlex.quote(script)


def _worker_id_lines(hosts: int) -> list[str]:
  """Sets W (this worker's index) and, on a pod, the JAX multi-process contract from metadata."""
  lines = [
      f'md() {{ curl -sf -H Metadata-Flavor:Google "{METADATA_URL}/$1"; }}',
      "W=$(md agent-worker-number) || W=0",
  ]
  if hosts > 1:
    # The same rule as jax's GceTpuCluster: workers in process order, each 'host' or 'name:id:ip';
    # worker 0 is the coordinator.
    lines += [
        'EP=$(md worker-network-endpoints) || { echo "no worker-network-endpoints metadata on '
        '$(hostname); is this a Cloud TPU VM?" >&2; exit 2; }',
        'N=$(printf "%s" "$EP" | tr "," "\\n" | grep -c .)',
        f'if [ "$N" != {hosts} ]; then echo "[w$W] the metadata lists $N workers, expected '
        f'{hosts}" >&2; exit 2; fi',
        'C=${EP%%,*}; case "$C" in *:*:*) C=${C##*:};; esac',
        f'export JAX_COORDINATOR_ADDRESS="$C:{JAX_COORDINATOR_PORT}" JAX_NUM_PROCESSES="$N" '
        'JAX_PROCESS_ID="$W"',
    ]
  return lines


def main_command(python: str, config: str, workdir: str, overrides: Sequence[str]) -> list[str]:
  return [python, "-m", "linvit_jax.main", "--config", config, "--workdir", workdir, *overrides]


def run_script(
    *,
    remote_dir: str,
    python: str,
    config: str,
    workdir: str,
    overrides: Sequence[str],
    env: Sequence[str],
    hosts: int,
    stamp: str,
    detach: bool,
) -> list[str]:
  """The bash lines each worker runs for `run`."""
  for kv in env:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", kv, flags=re.S):
      raise LaunchError(f"--env {kv!r}: expected NAME=value")
  main = shlex.join(main_command(python, config, workdir, overrides))
  lines = [
      "set -uo pipefail",
      f'cd "$HOME"/{shlex.quote(remote_dir)} || exit 2',
      *_worker_id_lines(hosts),
      f'[ -x {shlex.quote(python)} ] || {{ echo "[w$W] no {python} in ~/{remote_dir}; run '
      f'tpu_pod.py setup first" >&2; exit 2; }}',
      f'mkdir -p "$HOME"/{REMOTE_LOG_DIR}',
      f'LOG="$HOME"/{REMOTE_LOG_DIR}/{shlex.quote(stamp)}.worker$W.log',
      f'ln -sfn "$LOG" "$HOME"/{REMOTE_LOG_DIR}/latest.log',
      *(f"export {shlex.quote(kv)}" for kv in env),
  ]
  if detach:  # survives the ssh session; follow with `tpu_pod.py logs --follow`
    lines += [
        f'setsid nohup {main} > "$LOG" 2>&1 < /dev/null &',
        'echo "[w$W] started pid $! on $(hostname), log $LOG"',
    ]
  else:
    lines += [f'{main} 2>&1 | tee "$LOG" | sed -u "s/^/[w$W] /"']
  return lines


def setup_script(
    *, remote_dir: str, tarball_name: str, python_version: str, requirement: str
) -> list[str]:
  """What every worker runs for `setup`: unpack, a uv venv with the package and TPU jax."""
  if not re.fullmatch(r"[A-Za-z0-9_.\[\],<>=!~]+", requirement):
    raise LaunchError(f"unexpected characters in the jax requirement {requirement!r}")
  d = shlex.quote(remote_dir)
  return [
      "set -euo pipefail",
      f'mkdir -p "$HOME"/{d}',
      f'tar -xzf "$HOME"/{shlex.quote(tarball_name)} -C "$HOME"/{d}',
      f'cd "$HOME"/{d}',
      # The TPU images' own Python can be older than the project needs; uv fetches the one asked.
      # (Newer images mark the system Python externally managed: pip then needs the extra flag.)
      "python3 -m pip install -q --user --upgrade uv 2>/dev/null || "
      "python3 -m pip install -q --user --upgrade --break-system-packages uv",
      'UV="$HOME"/.local/bin/uv',
      f'[ -x .venv/bin/python ] || "$UV" venv -q --python {shlex.quote(python_version)} .venv',
      f'"$UV" pip install -q --python .venv/bin/python -e . "{requirement}"',
      'echo "$(hostname): jax $(.venv/bin/python -c "import jax, linvit_jax; print(jax.__version__)")"',
  ]


def logs_script(lines: int, follow: bool) -> list[str]:
  tail = ["tail", "-n", str(lines)] + (["-F"] if follow else [])
  return [
      *_worker_id_lines(1),
      f'{shlex.join(tail)} "$HOME"/{REMOTE_LOG_DIR}/latest.log 2>&1 | sed -u "s/^/[w$W] /"',
  ]


def tar_cmd(tarball: str, repo_root: str | None = None) -> list[str]:
  repo_root = repo_root or REPO_ROOT
  return ["tar", "-czf", tarball, *(f"--exclude={e}" for e in TAR_EXCLUDES), "-C", repo_root, "."]


def scp_cmd(t: Target, local: str, remote: str) -> list[str]:
  return [
      "gcloud",
      "compute",
      "tpus",
      "tpu-vm",
      "scp",
      local,
      f"{t.name}:{remote}",
      *t.flags(),
      "--worker=all",
  ]


# ------------------------------------------------------------------------------------------------
# Running (or printing) the commands.


class Runner:
  """Runs argument lists, echoing each as a shell-quoted line; with dry_run only prints them."""

  def __init__(self, dry_run: bool, out: IO[str] | None = None):
    self.dry_run = dry_run
    self.out = out or sys.stdout

  def say(self, text: str) -> None:
    for line in text.splitlines():
      self.out.write(f"# {line}\n")
    self.out.flush()

  def show_script(self, lines: Sequence[str]) -> None:
    """In a dry run, what each worker will run, readable (the command line quotes it twice)."""
    if self.dry_run:
      self.say("on each worker:\n" + "\n".join("  " + line for line in lines))

  def echo(self, cmd: Sequence[str]) -> None:
    self.out.write(("" if self.dry_run else "+ ") + shlex.join(cmd) + "\n")
    self.out.flush()

  def run(self, cmd: Sequence[str], *, check: bool = True) -> int:
    self.echo(cmd)
    if self.dry_run:
      return 0
    code = subprocess.call(list(cmd))
    if check and code:
      raise CommandFailed(cmd, code)
    return code

  def capture(self, cmd: Sequence[str]) -> str:
    if self.dry_run:
      self.echo(cmd)
      return ""
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True).stdout.strip()

  def stream(self, cmd: Sequence[str], on_line: Callable[[str], None]) -> int:
    """Runs cmd, passing each output line (stdout and stderr) to on_line; returns the exit code."""
    self.echo(cmd)
    if self.dry_run:
      return 0
    p = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    assert p.stdout is not None
    for raw in iter(p.stdout.readline, b""):
      on_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    return p.wait()


class CommandFailed(Exception):

  def __init__(self, cmd: Sequence[str], code: int):
    super().__init__(f"command failed with exit code {code}: {shlex.join(cmd)}")
    self.code = code


class WorkerLogs:
  """Prints worker lines and splits them into one local file per worker (by their [w<i>] prefix)."""

  def __init__(self, log_dir: str, stamp: str, out: IO[str]):
    self.log_dir, self.stamp, self.out = log_dir, stamp, out
    self.files: dict[str, IO[str]] = {}
    os.makedirs(log_dir, exist_ok=True)

  def __call__(self, line: str) -> None:
    self.out.write(line + "\n")
    self.out.flush()
    m = re.match(r"\[w(\d+)\] ?(.*)", line, flags=re.S)
    key, text = (m.group(1), m.group(2)) if m else ("gcloud", line)
    if key not in self.files:
      suffix = f"worker{key}" if m else "gcloud"
      self.files[key] = open(os.path.join(self.log_dir, f"{self.stamp}.{suffix}.log"), "a")
    self.files[key].write(text + "\n")
    self.files[key].flush()

  def close(self) -> None:
    for f in self.files.values():
      f.close()


# ------------------------------------------------------------------------------------------------
# Subcommands.


def do_create(args, r: Runner, t: Target, info: SliceInfo) -> None:
  runtime = args.version or info.default_runtime
  for cmd in create_cmds(
      t,
      args.accelerator_type,
      runtime,
      queued=args.queued,
      spot=args.spot,
      preemptible=args.preemptible,
  ):
    r.run(cmd)
  if args.queued:
    r.say(f"waiting for the queued resource to be ACTIVE (polled every {QUEUED_POLL_S} s):")
    while True:
      state = r.capture(queued_state_cmd(t))
      if r.dry_run or state == "ACTIVE":
        break
      if state in ("FAILED", "SUSPENDED"):
        raise LaunchError(
            f"queued resource {t.name!r} is {state}; see `gcloud compute tpus "
            f"queued-resources describe {t.name} --zone={t.zone}`"
        )
      r.say(f"{datetime.datetime.now():%H:%M:%S} {t.name}: {state or 'unknown'}")
      time.sleep(QUEUED_POLL_S)


def do_setup(args, r: Runner, t: Target, info: SliceInfo) -> None:
  tarball_name = "linvit_jax.tar.gz"
  local_tar = os.path.join(tempfile.gettempdir(), f"linvit_jax-{t.name}.tar.gz")
  r.say(f"copy this checkout ({REPO_ROOT}) to ~/{args.remote_dir} on all {info.hosts} workers")
  r.run(tar_cmd(local_tar))
  r.run(scp_cmd(t, local_tar, tarball_name))
  script = setup_script(
      remote_dir=args.remote_dir,
      tarball_name=tarball_name,
      python_version=args.python_version,
      requirement=jax_tpu_requirement(),
  )
  r.show_script(script)
  r.run(ssh_cmd(t, script))
  if not r.dry_run:
    os.remove(local_tar)


def _run_script(args, info: SliceInfo, stamp: str) -> list[str]:
  check_config(args.config)
  check_workdir(args.workdir, info)
  overrides = normalize_overrides(list(args.extra) + list(args.rest))
  return run_script(
      remote_dir=args.remote_dir,
      python=".venv/bin/python",
      config=args.config,
      workdir=args.workdir,
      overrides=overrides,
      env=list(DEFAULT_ENV) + list(args.env),
      hosts=info.hosts,
      stamp=stamp,
      detach=args.detach,
  )


def do_run(args, r: Runner, t: Target, info: SliceInfo, remote: list[str], stamp: str) -> int:
  log_dir = args.log_dir or os.path.join(REPO_ROOT, "workdirs", "launch_logs", t.name)
  r.say(
      f"every worker logs to ~/{REMOTE_LOG_DIR}/{stamp}.worker<i>.log; streamed here and "
      f"split into {log_dir}/{stamp}.worker<i>.log"
  )
  if not args.workdir.startswith("gs://"):
    r.say(
        f"--workdir {args.workdir} is on the TPU VM's own disk: copy what you need before the "
        "VM is deleted"
    )
  r.show_script(remote)
  if r.dry_run:
    r.echo(ssh_cmd(t, remote))
    return 0
  logs = WorkerLogs(log_dir, stamp, r.out)
  try:
    code = r.stream(ssh_cmd(t, remote), logs)
  finally:
    logs.close()
  if code:
    r.say(f"run failed with exit code {code}")
  return code


def do_delete(args, r: Runner, t: Target, check: bool = True) -> None:
  for cmd in delete_cmds(t, queued=args.queued):
    r.run(cmd, check=check)


def dispatch(args, r: Runner) -> int:
  check_name(args.name)
  if os.path.isabs(args.remote_dir) or ".." in args.remote_dir.split("/"):
    raise LaunchError(
        f"--remote_dir={args.remote_dir!r} must be a path under $HOME, like " "linvit_jax"
    )
  t = Target(args.name, args.zone, args.project)
  info = slice_info(args.accelerator_type, args.hosts) if args.accelerator_type else None
  needs_type = args.cmd in ("create", "setup", "run", "all")
  if needs_type and info is None:
    raise LaunchError(f"'{args.cmd}' needs --accelerator_type (e.g. v4-32)")
  if info is not None:
    r.say(f"tpu_pod: {info.describe()}")
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")

  if args.cmd == "create":
    do_create(args, r, t, info)
  elif args.cmd == "setup":
    do_setup(args, r, t, info)
  elif args.cmd == "run":
    return do_run(args, r, t, info, _run_script(args, info, stamp), stamp)
  elif args.cmd == "logs":
    script = logs_script(args.lines, args.follow)
    r.show_script(script)
    return r.run(ssh_cmd(t, script, args.worker), check=False)
  elif args.cmd == "ssh":
    if not args.rest:
      raise LaunchError("'ssh' needs a command after --, e.g. -- 'sudo lsof -w /dev/accel0'")
    return r.run(ssh_cmd(t, " ".join(args.rest), args.worker), check=False)
  elif args.cmd == "delete":
    do_delete(args, r, t)
  elif args.cmd == "all":
    if args.detach and not args.keep:
      raise LaunchError("'all --detach' would delete the TPU under the running job; add --keep")
    remote = _run_script(args, info, stamp)  # all checks before anything is created
    code = 1
    try:
      do_create(args, r, t, info)
      do_setup(args, r, t, info)
      code = do_run(args, r, t, info, remote, stamp)
    finally:
      if args.keep:
        r.say(
            f"--keep: {t.name} stays up; delete it with: python launch/tpu_pod.py delete "
            f"--name={t.name} --zone={t.zone}" + (" --queued" if args.queued else "")
        )
      else:  # unchecked: after a failed create there may be nothing to delete
        do_delete(args, r, t, check=False)
    return code
  return 0


def build_parser() -> argparse.ArgumentParser:
  common = argparse.ArgumentParser(add_help=False)
  g = common.add_argument_group("TPU")
  g.add_argument("--name", default="linvit", help="TPU VM (and queued resource) name")
  g.add_argument("--zone", required=True, help="e.g. us-central2-b (v4), us-east5-a (v5p)")
  g.add_argument("--project", default="", help="GCP project (default: gcloud's configured one)")
  g.add_argument("--accelerator_type", default="", help="e.g. v4-32, v5litepod-16, v5p-64")
  g.add_argument(
      "--hosts", type=int, default=0, help="override the host count derived from --accelerator_type"
  )
  g.add_argument(
      "--version",
      default="",
      help="TPU VM runtime (default per family: v4 tpu-ubuntu2204-base, v5e "
      "v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e)",
  )
  g.add_argument(
      "--queued",
      action="store_true",
      help="create/delete through `gcloud compute tpus queued-resources`",
  )
  g.add_argument("--spot", action="store_true", help="Spot VMs (preemptible at any time)")
  g.add_argument("--preemptible", action="store_true", help="legacy preemptible TPUs")
  g.add_argument("--dry_run", action="store_true", help="print every command, run nothing")
  r = common.add_argument_group("run")
  r.add_argument("--config", help="config path relative to the repository root, with ':arg'")
  r.add_argument("--workdir", help="gs://BUCKET/... (required on multi-host slices)")
  r.add_argument(
      "--extra",
      action="append",
      default=[],
      help="config override, repeatable: 'finetune.steps=100' (or after --)",
  )
  r.add_argument("--env", action="append", default=[], help="NAME=value on every worker")
  r.add_argument(
      "--detach",
      action="store_true",
      help="start the job under nohup and return (follow with `logs --follow`)",
  )
  r.add_argument("--keep", action="store_true", help="'all': do not delete the TPU at the end")
  r.add_argument("--remote_dir", default="linvit_jax", help="checkout dir under $HOME on workers")
  r.add_argument("--python_version", default="3.11", help="Python of the workers' venv (uv)")
  r.add_argument(
      "--log_dir", default="", help="local per-worker logs (default workdirs/launch_logs/<name>)"
  )
  r.add_argument("--worker", default="all", help="'logs'/'ssh': all, 0, '1,3', '0-2'")
  r.add_argument("--lines", type=int, default=100, help="'logs': lines per worker")
  r.add_argument("--follow", action="store_true", help="'logs': keep following (tail -F)")

  p = argparse.ArgumentParser(
      description="Run linvit_jax configs on Cloud TPU VMs (pod slices included) with gcloud.",
      epilog="Arguments after '--' are config overrides for run/all, or the command for ssh.",
  )
  sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
  for name, text in (
      ("create", "create the TPU VM"),
      ("setup", "copy + install on all workers"),
      ("run", "run the config on all workers"),
      ("logs", "tail the workers' logs"),
      ("ssh", "run a shell command on workers"),
      ("delete", "delete the TPU VM"),
      ("all", "create, setup, run, delete"),
  ):
    sub.add_parser(name, parents=[common], help=text)
  return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  argv = list(argv)
  rest: list[str] = []
  if "--" in argv:
    k = argv.index("--")
    argv, rest = argv[:k], argv[k + 1 :]
  args = build_parser().parse_args(argv)
  args.rest = rest
  return args


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  runner = Runner(args.dry_run, out)
  try:
    return dispatch(args, runner)
  except LaunchError as e:
    print(f"tpu_pod: error: {e}", file=sys.stderr)
    return 2
  except CommandFailed as e:
    print(f"tpu_pod: {e}", file=sys.stderr)
    return e.code
  except KeyboardInterrupt:
    print("tpu_pod: interrupted", file=sys.stderr)
    return 130
  except subprocess.CalledProcessError as e:
    print(
        f"tpu_pod: command failed with exit code {e.returncode}: {shlex.join(e.cmd)}\n"
        f"{(e.stderr or '').strip()}",
        file=sys.stderr,
    )
    return e.returncode or 1


if __name__ == "__main__":
  sys.exit(main())
