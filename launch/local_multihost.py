#!/usr/bin/env python3
r"""Rehearse a multi-host run on one machine: N processes, one loopback JAX coordinator.

Each process i gets the environment a pod worker would have after `jax.distributed.initialize`
(see linvit_jax/runtime/distributed.py `maybe_initialize_distributed`):

  JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>  JAX_NUM_PROCESSES=N  JAX_PROCESS_ID=i
  XLA_FLAGS=--xla_force_host_platform_device_count=<devices per process>  JAX_PLATFORMS=cpu
  JAX_INITIALIZATION_TIMEOUT=<--init_timeout, default 600 s>

so the same code paths run as on a v4-32 (4 processes × 4 devices): per-process data feeding,
global batch assembly, cross-process collectives, process-0-only writes. Every output line is
prefixed with "[p<i>] "; the launcher waits for all processes, and when one fails it stops the
others and exits with the failing process's code (the first to fail).

N processes on one machine compete for its cores, so one may start (or reach its first collective)
minutes after another; --init_timeout is how long each waits for the others at start-up, where
they also connect JAX's CPU collectives over all devices together: gloo's fixed 30 s limit on that
connection no longer fails a run whose processes drift apart later.

Usage (from the repository root):
  python launch/local_multihost.py --num_processes 2 --devices_per_process 2 \
      --config configs/demo.py:tiny=True --workdir /tmp/linvit_demo_2proc
  python launch/local_multihost.py -n 2 -- python tests/helpers/multihost_sum.py
  python launch/local_multihost.py -n 4 --dry_run --config configs/demo.py --workdir /tmp/w

With --config/--workdir it runs `python -m linvit_jax.main --config … --workdir …` (plus any
`--config.x=y` overrides after `--`); with a command after `--` and no --config it runs that command.
Stdlib only: it runs without the project's virtualenv (the children use --python).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(REPO_ROOT, ".venv", "bin", "python")
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
GRACE_S = 10.0  # how long a stopped process gets between SIGTERM and SIGKILL
# Seconds each process waits for the others at start-up (JAX's own default is 300): the processes
# share this machine's cores with each other and with whatever else runs, so generous.
INIT_TIMEOUT_S = 600


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def xla_flags_with_device_count(existing: str, devices: int) -> str:
  """`existing` XLA_FLAGS with the host device count set to `devices` (replacing any old one)."""
  kept = [f for f in shlex.split(existing) if not f.startswith(DEVICE_COUNT_FLAG)]
  return " ".join(kept + [f"{DEVICE_COUNT_FLAG}={devices}"])


def process_env(
    base: dict[str, str],
    *,
    process_id: int,
    num_processes: int,
    port: int,
    devices_per_process: int,
    platform: str,
    init_timeout: int = INIT_TIMEOUT_S,
) -> dict[str, str]:
  """The environment of process `process_id`: `base` plus the multi-process contract."""
  env = dict(base)
  env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
  env["JAX_NUM_PROCESSES"] = str(num_processes)
  env["JAX_PROCESS_ID"] = str(process_id)
  env["JAX_INITIALIZATION_TIMEOUT"] = str(init_timeout)  # read by maybe_initialize_distributed
  env["XLA_FLAGS"] = xla_flags_with_device_count(base.get("XLA_FLAGS", ""), devices_per_process)
  if platform:
    env["JAX_PLATFORMS"] = platform
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  env["PYTHONUNBUFFERED"] = "1"  # lines reach the prefixer as they are written
  return env


def main_command(python: str, config: str, workdir: str, extra: Sequence[str]) -> list[str]:
  return [python, "-m", "linvit_jax.main", "--config", config, "--workdir", workdir, *extra]


def _exit_code(returncode: int) -> int:
  """A Popen return code as a shell would report it (killed by signal s → 128 + s)."""
  return 128 - returncode if returncode < 0 else returncode


def _pump(
    prefix: str, stream: IO[bytes], out: IO[str], log: IO[str] | None, lock: threading.Lock
) -> None:
  for raw in iter(stream.readline, b""):
    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    with lock:
      out.write(f"{prefix}{line}\n")
      out.flush()
      if log is not None:
        log.write(line + "\n")
        log.flush()
  stream.close()


def _stop(procs: Sequence[subprocess.Popen]) -> None:
  """SIGTERM each still-running process group we started, then SIGKILL after a grace period."""
  alive = [p for p in procs if p.poll() is None]
  for p in alive:
    try:
      os.killpg(p.pid, signal.SIGTERM)  # its own session: the group is exactly what we started
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + GRACE_S
  for p in alive:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()


def launch(
    command: Sequence[str],
    *,
    num_processes: int,
    devices_per_process: int,
    port: int | None = None,
    platform: str = "cpu",
    cwd: str = REPO_ROOT,
    log_dir: str | None = None,
    timeout: float | None = None,
    init_timeout: int = INIT_TIMEOUT_S,
    out: IO[str] | None = None,
) -> int:
  """Runs `command` as N cooperating processes; returns 0 or the first failing process's code.

  A timeout stops every process and returns 124 (like coreutils `timeout`); `init_timeout` is
  each process's JAX_INITIALIZATION_TIMEOUT (seconds).
  """
  out = out or sys.stdout
  port = port or free_port()
  lock = threading.Lock()
  procs: list[subprocess.Popen] = []
  pumps: list[threading.Thread] = []
  logs: list[IO[str]] = []
  if log_dir:
    os.makedirs(log_dir, exist_ok=True)
  out.write(
      f"local_multihost: {num_processes} processes × {devices_per_process} devices, "
      f"coordinator 127.0.0.1:{port}: {shlex.join(command)}\n"
  )
  out.flush()
  first_failure: tuple[int, int] | None = None  # (process id, exit code)
  try:
    for i in range(num_processes):
      env = process_env(
          dict(os.environ),
          process_id=i,
          num_processes=num_processes,
          port=port,
          devices_per_process=devices_per_process,
          platform=platform,
          init_timeout=init_timeout,
      )
      p = subprocess.Popen(
          list(command),
          cwd=cwd,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          stdin=subprocess.DEVNULL,
          start_new_session=True,
      )
      procs.append(p)
      log = open(os.path.join(log_dir, f"process{i}.log"), "w") if log_dir else None
      if log is not None:
        logs.append(log)
      t = threading.Thread(target=_pump, args=(f"[p{i}] ", p.stdout, out, log, lock), daemon=True)
      t.start()
      pumps.append(t)

    deadline = time.monotonic() + timeout if timeout else None
    while [p.poll() for p in procs].count(None):  # poll every process, not just the first alive
      for i, p in enumerate(procs):
        if first_failure is None and p.returncode not in (None, 0):
          first_failure = (i, _exit_code(p.returncode))
      if first_failure is not None:
        break
      if deadline is not None and time.monotonic() > deadline:
        with lock:
          out.write(f"local_multihost: timed out after {timeout:g} s; stopping all processes\n")
        first_failure = (-1, 124)
        break
      time.sleep(0.1)
    if first_failure is None:  # all ended; the first non-zero one in process order
      first_failure = next(
          ((i, _exit_code(p.returncode)) for i, p in enumerate(procs) if p.returncode != 0), None
      )
    elif first_failure[0] >= 0:
      with lock:
        out.write(
            f"local_multihost: process {first_failure[0]} exited with code "
            f"{first_failure[1]}; stopping the others\n"
        )
  except KeyboardInterrupt:
    first_failure = (-1, 130)
  finally:
    _stop(procs)
    for t in pumps:
      t.join(timeout=5)
    for log in logs:
      log.close()
  code = 0 if first_failure is None else first_failure[1]
  out.write(
      f"local_multihost: exit code {code} (per process: "
      f"{[_exit_code(p.returncode) for p in procs]})\n"
  )
  out.flush()
  return code


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  argv = list(argv)
  rest: list[str] = []
  if "--" in argv:
    k = argv.index("--")
    argv, rest = argv[:k], argv[k + 1 :]
  p = argparse.ArgumentParser(
      description="Run N cooperating JAX processes on this machine (loopback coordinator).",
      epilog="Arguments after '--' are the command to run, or with --config extra "
      "'--config.x=y' overrides for linvit_jax.main.",
  )
  p.add_argument("-n", "--num_processes", type=int, default=2)
  p.add_argument(
      "-d",
      "--devices_per_process",
      type=int,
      default=1,
      help="simulated CPU devices per process (XLA host platform device count)",
  )
  p.add_argument("--config", help="config for linvit_jax.main, e.g. configs/demo.py:tiny=True")
  p.add_argument("--workdir", help="workdir for linvit_jax.main (shared by all processes)")
  p.add_argument(
      "--python",
      default=VENV_PYTHON if os.path.exists(VENV_PYTHON) else sys.executable,
      help="interpreter for linvit_jax.main (default: the repository's .venv if there "
      "is one, else this one)",
  )
  p.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
  p.add_argument(
      "--platform", default="cpu", help="JAX_PLATFORMS for the children ('' leaves it as it is)"
  )
  p.add_argument("--log_dir", help="also write process<i>.log files here")
  p.add_argument("--timeout", type=float, default=0, help="seconds; 0 = none (exit 124 on expiry)")
  p.add_argument(
      "--init_timeout",
      type=int,
      default=INIT_TIMEOUT_S,
      help="seconds each process waits for the others at start-up " "(JAX_INITIALIZATION_TIMEOUT)",
  )
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  args = p.parse_args(argv)
  if args.num_processes < 1:
    p.error(f"--num_processes must be >= 1, got {args.num_processes}")
  if args.devices_per_process < 1:
    p.error(f"--devices_per_process must be >= 1, got {args.devices_per_process}")
  if args.init_timeout < 1:
    p.error(f"--init_timeout must be >= 1 second, got {args.init_timeout}")
  if args.config or args.workdir:
    if not (args.config and args.workdir):
      p.error("--config and --workdir go together (linvit_jax.main needs both)")
    bad = [a for a in rest if not re.match(r"--config\.", a)]
    if bad:
      p.error(f"with --config, arguments after '--' must be --config.x=y overrides; got {bad}")
  elif not rest:
    p.error("nothing to run: give --config and --workdir, or a command after '--'")
  return args, rest


def main(argv: Sequence[str] | None = None) -> int:
  args, rest = parse_args(sys.argv[1:] if argv is None else argv)
  command = main_command(args.python, args.config, args.workdir, rest) if args.config else rest
  if args.dry_run:
    port = args.port or free_port()
    print(
        f"# local_multihost: {args.num_processes} processes × {args.devices_per_process} "
        f"devices, coordinator 127.0.0.1:{port}, cwd {REPO_ROOT}"
    )
    for i in range(args.num_processes):
      env = process_env(
          {},
          process_id=i,
          num_processes=args.num_processes,
          port=port,
          devices_per_process=args.devices_per_process,
          platform=args.platform,
          init_timeout=args.init_timeout,
      )
      assigns = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
      print("env " + " ".join(assigns) + " " + shlex.join(command) + " &")
    print("wait")
    return 0
  return launch(
      command,
      num_processes=args.num_processes,
      devices_per_process=args.devices_per_process,
      port=args.port,
      platform=args.platform,
      log_dir=args.log_dir,
      timeout=args.timeout or None,
      init_timeout=args.init_timeout,
  )


if __name__ == "__main__":
  sys.exit(main())
