"""launch/: the Cloud TPU pod commands (dry runs) and the local multi-process launcher (real runs).

The TPU scripts are checked by parsing what `--dry_run` prints, and by executing the script a
worker would run here, with a fake metadata server (`curl`) and a fake venv python, through the
same two levels of shell quoting as `gcloud … ssh --command=…`.
"""

import io
import os
import re
import shlex
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "launch"))

import local_multihost  # noqa: E402
import tpu_pod  # noqa: E402

CONFIG = (
    "configs/imagenet_vit.py:variant=S/16,init=gs://big_vision/vit_s16_i1k_300ep.npz,"
    "data_dir=gs://my-bucket/tensorflow_datasets"
)
WORKDIR = "gs://my-bucket/linvit/s16_hedgehog"
V4_32 = [
    "--name",
    "linvit-s16",
    "--zone",
    "us-central2-b",
    "--accelerator_type",
    "v4-32",
    "--project",
    "my-project",
]


@pytest.fixture(autouse=True)
def no_real_gcloud(tmp_path, monkeypatch):
  """A `gcloud` first on PATH that fails loudly: no test may reach a real cloud project."""
  stub = tmp_path / "gcloud_stub" / "gcloud"
  stub.parent.mkdir()
  stub.write_text("#!/bin/sh\necho 'tests must not run gcloud' >&2\nexit 99\n")
  stub.chmod(0o755)
  monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")


def dry_run(*argv):
  """(exit code, printed commands as argument lists, comment lines, stderr) of a CLI dry run."""
  argv = list(argv)
  k = argv.index("--") if "--" in argv else len(argv)  # launcher flags go before '--'
  p = subprocess.run(
      [
          sys.executable,
          os.path.join(ROOT, "launch", "tpu_pod.py"),
          *argv[:k],
          "--dry_run",
          *argv[k:],
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=60,
  )
  assert "tests must not run gcloud" not in p.stderr
  lines = p.stdout.splitlines()
  commands = [shlex.split(line) for line in lines if line and not line.startswith("#")]
  comments = [line for line in lines if line.startswith("#")]
  return p.returncode, commands, comments, p.stderr


def flag(cmd, name):
  values = [a.split("=", 1)[1] for a in cmd if a.startswith(name + "=")]
  assert len(values) == 1, (name, cmd)
  return values[0]


def remote_script(cmd):
  """The bash script inside an ssh command's --command='bash -c …' (what a worker runs)."""
  words = shlex.split(flag(cmd, "--command"))
  assert words[:2] == ["bash", "-c"] and len(words) == 3, words
  return words[2]


# ------------------------------------------------------------------------------------------------
# Accelerator table.


@pytest.mark.parametrize(
    "accel, chips, hosts, devices",
    [
        ("v2-8", 4, 1, 8),
        ("v3-32", 16, 4, 32),
        ("v4-8", 4, 1, 4),
        ("v4-16", 8, 2, 8),
        ("v4-32", 16, 4, 16),
        ("v5p-8", 4, 1, 4),
        ("v5p-128", 64, 16, 64),
        ("v5litepod-4", 4, 1, 4),
        ("v5litepod-8", 8, 1, 8),
        ("v5litepod-16", 16, 4, 16),
        ("v5litepod-256", 256, 64, 256),
        ("v6e-8", 8, 1, 8),
        ("v6e-64", 64, 16, 64),
    ],
)
def test_hosts_table(accel, chips, hosts, devices):
  info = tpu_pod.slice_info(accel)
  assert (info.chips, info.hosts, info.devices) == (chips, hosts, devices)


@pytest.mark.parametrize(
    "accel", ["v9-32", "v4", "v4-7", "tpu-v4-32", "v5litepod-12", "v5litepod-24"]
)
def test_hosts_table_rejects_unknown(accel):
  with pytest.raises(tpu_pod.LaunchError, match="accelerator_type"):
    tpu_pod.slice_info(accel)


# ------------------------------------------------------------------------------------------------
# Dry runs.


def test_dry_run_all_v4_32_is_well_formed():
  code, cmds, comments, err = dry_run(
      "all",
      *V4_32,
      "--config",
      CONFIG,
      "--workdir",
      WORKDIR,
      "--extra",
      "finetune.steps=100",
      "--",
      "--config.seed=3",
  )
  assert code == 0, err
  assert any("4 hosts" in c and "16 chips" in c for c in comments), comments

  kinds = [tuple(c[:5]) if c[0] == "gcloud" else (c[0],) for c in cmds]
  assert kinds == [
      ("gcloud", "compute", "tpus", "tpu-vm", "create"),
      ("tar",),
      ("gcloud", "compute", "tpus", "tpu-vm", "scp"),
      ("gcloud", "compute", "tpus", "tpu-vm", "ssh"),
      ("gcloud", "compute", "tpus", "tpu-vm", "ssh"),
      ("gcloud", "compute", "tpus", "tpu-vm", "delete"),
  ]
  create, tar, scp, setup, run, delete = cmds
  for c in (create, scp, setup, run, delete):
    assert flag(c, "--zone") == "us-central2-b" and flag(c, "--project") == "my-project"
  assert create[5] == "linvit-s16" and flag(create, "--accelerator-type") == "v4-32"
  assert flag(create, "--version") == "tpu-ubuntu2204-base"
  for c in (scp, setup, run):
    assert flag(c, "--worker") == "all"
  assert setup[5] == run[5] == delete[5] == "linvit-s16" and "--quiet" in delete

  # setup: the tarball made by `tar` is what scp sends; every worker unpacks and installs it.
  tarball = tar[tar.index("-czf") + 1]
  assert scp[5] == tarball and scp[6] == "linvit-s16:linvit_jax.tar.gz"
  assert tar[-3:] == ["-C", ROOT, "."] and "--exclude=./.git" in tar
  s = remote_script(setup)
  assert "tar -xzf" in s and '-e . "jax[tpu]>=0.10,<0.11"' in s and "venv" in s

  # run: the main command, parsed from inside the worker script, has the config and gs:// workdir.
  s = remote_script(run)
  main = next(stmt for stmt in s.split("; ") if "linvit_jax.main" in stmt)
  words = shlex.split(main.split(" 2>&1 ")[0])
  assert words == [
      ".venv/bin/python",
      "-m",
      "linvit_jax.main",
      "--config",
      CONFIG,
      "--workdir",
      WORKDIR,
      "--config.finetune.steps=100",
      "--config.seed=3",
  ]
  assert '| tee "$LOG"' in s and "pipefail" in s and "TF_CPP_MIN_LOG_LEVEL=1" in s
  assert 'if [ "$N" != 4 ]' in s and "JAX_PROCESS_ID=" in s


def test_dry_run_queued_spot():
  code, cmds, _, err = dry_run(
      "all", *V4_32, "--queued", "--spot", "--config", CONFIG, "--workdir", WORKDIR
  )
  assert code == 0, err
  create, describe = cmds[0], cmds[1]
  assert create[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
  assert create[5] == "linvit-s16" and flag(create, "--node-id") == "linvit-s16"
  assert flag(create, "--runtime-version") == "tpu-ubuntu2204-base" and "--spot" in create
  assert describe[:5] == ["gcloud", "compute", "tpus", "queued-resources", "describe"]
  assert cmds[-1][:5] == ["gcloud", "compute", "tpus", "queued-resources", "delete"]
  assert "--force" in cmds[-1]


def test_keep_skips_delete_and_detach_needs_keep():
  code, cmds, comments, _ = dry_run(
      "all", *V4_32, "--config", CONFIG, "--workdir", WORKDIR, "--keep", "--detach"
  )
  assert code == 0 and not any("delete" in c for c in cmds)
  assert "setsid nohup" in remote_script(cmds[-1])
  code, cmds, _, err = dry_run("all", *V4_32, "--config", CONFIG, "--workdir", WORKDIR, "--detach")
  assert code == 2 and not cmds and "--keep" in err


def test_local_workdir_on_multihost_pod_is_rejected():
  code, cmds, _, err = dry_run("all", *V4_32, "--config", CONFIG, "--workdir", "/tmp/linvit")
  assert code == 2
  assert not cmds  # rejected before anything is created
  assert "local path" in err and "4 hosts" in err and "gs://" in err
  code, cmds, _, err = dry_run(
      "run",
      "--zone",
      "z",
      "--accelerator_type",
      "v4-8",
      "--config",
      "configs/demo.py",
      "--workdir",
      "/tmp/linvit",
  )
  assert code == 0 and len(cmds) == 1, err  # one host: a local workdir is allowed


def test_bad_arguments_are_clear_errors():
  code, _, _, err = dry_run("run", *V4_32, "--config", "configs/missing.py", "--workdir", WORKDIR)
  assert code == 2 and "configs/missing.py" in err and "not a file" in err
  code, _, _, err = dry_run(
      "create", "--name", "My_TPU", "--zone", "z", "--accelerator_type", "v4-8"
  )
  assert code == 2 and "--name" in err
  code, _, _, err = dry_run("create", *V4_32, "--queued", "--preemptible")
  assert code == 2 and "--spot" in err
  code, cmds, _, err = dry_run(
      "run", *V4_32, "--config", CONFIG, "--workdir", WORKDIR, "--", "--keep"
  )
  assert code == 2 and not cmds and "not a config override" in err


def _fake_bin(tmp_path, name, text):
  path = tmp_path / "bin" / name
  path.parent.mkdir(exist_ok=True)
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_worker_run_script_executes(tmp_path):
  """The run script as a worker's login shell gets it: contract env, args intact, logs, exit."""
  _, cmds, _, _ = dry_run(
      "run", *V4_32, "--config", CONFIG, "--workdir", WORKDIR, "--extra", "finetune.note=a b;c'd"
  )
  ssh = cmds[-1]
  home = tmp_path / "home"
  venv_bin = home / "linvit_jax" / ".venv" / "bin"
  venv_bin.mkdir(parents=True)
  _fake_bin(
      tmp_path,
      "curl",
      """#!/bin/sh
case "$*" in
  *agent-worker-number*) printf 2 ;;
  *worker-network-endpoints*) printf 'w-0:0:10.0.0.5,w-1:1:10.0.0.6,w-2:2:10.0.0.7,w-3:3:10.0.0.8' ;;
  *) exit 22 ;;
esac
""",
  )
  fake_python = venv_bin / "python"
  fake_python.write_text("""#!/usr/bin/env python3
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": {k: os.environ.get(k) for k in ("JAX_COORDINATOR_ADDRESS",
                          "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TF_CPP_MIN_LOG_LEVEL")}}))
sys.exit(3)
""")
  fake_python.chmod(0o755)
  env = dict(os.environ, HOME=str(home), PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
  # ssh hands --command to the worker's login shell, which parses the outer quoting.
  p = subprocess.run(
      ["sh", "-c", flag(ssh, "--command")],
      capture_output=True,
      text=True,
      env=env,
      cwd=str(home),
      timeout=60,
  )
  assert p.returncode == 3, p.stderr  # the job's exit code survives `| tee | sed`
  line = p.stdout.strip()
  assert line.startswith("[w2] "), p.stdout
  import json

  got = json.loads(line[len("[w2] ") :])
  assert got["argv"] == [
      "-m",
      "linvit_jax.main",
      "--config",
      CONFIG,
      "--workdir",
      WORKDIR,
      "--config.finetune.note=a b;c'd",
  ]
  assert got["cwd"] == str(home / "linvit_jax")
  assert got["env"] == {
      "JAX_COORDINATOR_ADDRESS": "10.0.0.5:8476",
      "JAX_NUM_PROCESSES": "4",
      "JAX_PROCESS_ID": "2",
      "TF_CPP_MIN_LOG_LEVEL": "1",
  }
  logs = home / "linvit_jax_logs"
  assert (logs / "latest.log").read_text().strip() == line[len("[w2] ") :]
  assert re.fullmatch(r"\d{8}-\d{6}\.worker2\.log", os.readlink(logs / "latest.log").split("/")[-1])


def test_worker_scripts_are_valid_bash():
  for argv in (
      ["setup", *V4_32],
      ["logs", *V4_32, "--follow"],
      ["run", *V4_32, "--config", CONFIG, "--workdir", WORKDIR, "--detach"],
  ):
    code, cmds, _, err = dry_run(*argv)
    assert code == 0, err
    for c in cmds:
      if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]:
        p = subprocess.run(["bash", "-n", "-c", remote_script(c)], capture_output=True, text=True)
        assert p.returncode == 0, (argv[0], p.stderr)


def test_runner_dry_run_prints_every_command_and_runs_none(monkeypatch):
  def boom(*a, **k):
    raise AssertionError("a dry run started a process")

  monkeypatch.setattr(subprocess, "call", boom)
  monkeypatch.setattr(subprocess, "Popen", boom)
  monkeypatch.setattr(subprocess, "run", boom)
  out = io.StringIO()
  code = tpu_pod.main(
      ["all", *V4_32, "--queued", "--config", CONFIG, "--workdir", WORKDIR, "--dry_run"], out=out
  )
  assert code == 0
  assert sum(1 for line in out.getvalue().splitlines() if line.startswith("gcloud")) == 6


# ------------------------------------------------------------------------------------------------
# The local multi-process launcher.


def run_local(*argv, timeout=240, env_extra=None):
  p = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "local_multihost.py"), *argv],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=timeout,
      env={**os.environ, **(env_extra or {})},
  )
  return p.returncode, p.stdout + p.stderr


def per_process(output, pattern):
  """{process id: the first match of `pattern` in that process's [p<i>] lines}."""
  found = {}
  for line in output.splitlines():
    m = re.match(r"\[p(\d+)\] (.*)", line)
    if m:
      hit = re.search(pattern, m.group(2))
      if hit and int(m.group(1)) not in found:
        found[int(m.group(1))] = hit
  return found


PYTHON = (
    local_multihost.VENV_PYTHON if os.path.exists(local_multihost.VENV_PYTHON) else sys.executable
)


def test_local_two_processes_agree_on_a_global_sum():
  code, out = run_local(
      "-n", "2", "-d", "2", "--timeout", "180", "--", PYTHON, "tests/helpers/multihost_sum.py"
  )
  assert code == 0, out
  hits = per_process(
      out,
      r"MULTIHOST_SUM process=(\d) processes=(\d) devices=(\d) "
      r"local_devices=(\d) sum=(\S+) psum=(\S+)",
  )
  assert sorted(hits) == [0, 1], out
  for pid, m in hits.items():
    # rows 0..3 over 2 processes x 2 devices: each process sees the whole sum 0+1+2+3.
    assert m.groups() == (str(pid), "2", "4", "2", "6", "6"), out


def test_local_process_that_reaches_its_first_collective_35_s_late():
  """Gloo (JAX's CPU collectives) gives up on connecting after a fixed 30 s: without the
  connection made at start-up (distributed._connect_cpu_collectives), process 0 failed here with
  "Gloo context initialization failed: DEADLINE_EXCEEDED" (then hung: exit 124), as in the
  two-process demo on a busy machine."""
  code, out = run_local(
      "-n",
      "2",
      "-d",
      "1",
      "--timeout",
      "150",
      "--",
      PYTHON,
      "tests/helpers/multihost_sum.py",
      timeout=200,
      env_extra={"MULTIHOST_SUM_DELAY": "1:35"},
  )
  assert code == 0, out
  assert "Gloo context initialization failed" not in out, out
  hits = per_process(out, r"MULTIHOST_SUM process=(\d) .* sum=(\S+) psum=(\S+)")
  assert sorted(hits) == [0, 1], out
  assert all(m.group(2, 3) == ("1", "1") for m in hits.values()), out  # rows 0 and 1


def test_local_launcher_stops_all_on_first_failure():
  script = (
      "echo up $JAX_PROCESS_ID/$JAX_NUM_PROCESSES $XLA_FLAGS; "
      'if [ "$JAX_PROCESS_ID" = 1 ]; then sleep 1; exit 7; fi; sleep 60'
  )  # others up first
  code, out = run_local("-n", "3", "-d", "4", "--", "bash", "-c", script, timeout=30)
  assert code == 7, out
  assert "process 1 exited with code 7" in out
  ups = per_process(out, r"up (\d)/3 --xla_force_host_platform_device_count=4")
  assert sorted(ups) == [0, 1, 2], out


def test_local_launcher_dry_run_and_env():
  code, out = run_local(
      "-n",
      "2",
      "--dry_run",
      "--config",
      "configs/demo.py:tiny=True",
      "--workdir",
      "/tmp/w",
      "--",
      "--config.seed=1",
  )
  assert code == 0, out
  lines = [shlex.split(line) for line in out.splitlines() if line.startswith("env ")]
  assert len(lines) == 2
  for i, words in enumerate(lines):
    env = dict(w.split("=", 1) for w in words[1:] if re.match(r"[A-Z_]+=", w))
    assert env["JAX_PROCESS_ID"] == str(i) and env["JAX_NUM_PROCESSES"] == "2"
    assert re.fullmatch(r"127\.0\.0\.1:\d+", env["JAX_COORDINATOR_ADDRESS"])
    assert words[-8:] == [
        "-m",
        "linvit_jax.main",
        "--config",
        "configs/demo.py:tiny=True",
        "--workdir",
        "/tmp/w",
        "--config.seed=1",
        "&",
    ]
  env = local_multihost.process_env(
      {"XLA_FLAGS": "--xla_foo=1 " "--xla_force_host_platform_device_count=8"},
      process_id=1,
      num_processes=4,
      port=1234,
      devices_per_process=2,
      platform="cpu",
  )
  assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=2"
  assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234" and env["JAX_PLATFORMS"] == "cpu"
  assert env["JAX_INITIALIZATION_TIMEOUT"] == str(local_multihost.INIT_TIMEOUT_S)


def test_local_launcher_passes_the_init_timeout_to_every_process():
  code, out = run_local(
      "-n",
      "3",
      "--init_timeout",
      "900",
      "--",
      "bash",
      "-c",
      "echo timeout=$JAX_INITIALIZATION_TIMEOUT",
      timeout=30,
  )
  assert code == 0, out
  assert {pid: m.group(1) for pid, m in per_process(out, r"timeout=(\d+)").items()} == {
      0: "900",
      1: "900",
      2: "900",
  }, out
  code, out = run_local("-n", "2", "--init_timeout", "0", "--", "true", timeout=30)
  assert code == 2 and "--init_timeout must be >= 1" in out, out


def test_initialize_distributed_reads_the_init_timeout(monkeypatch):
  """JAX_INITIALIZATION_TIMEOUT reaches jax.distributed.initialize and the start-up barrier."""
  import jax

  from linvit_jax.runtime import distributed

  calls = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(("init", kw)))
  monkeypatch.setattr(
      distributed,
      "_connect_cpu_collectives",
      lambda timeout_s: calls.append(("connect", timeout_s)),
  )
  for k, v in {
      "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234",
      "JAX_NUM_PROCESSES": "2",
      "JAX_PROCESS_ID": "1",
      "JAX_INITIALIZATION_TIMEOUT": "900",
  }.items():
    monkeypatch.setenv(k, v)
  monkeypatch.delenv("JAX_LOCAL_DEVICE_IDS", raising=False)
  assert distributed.maybe_initialize_distributed() is True
  assert calls == [
      (
          "init",
          dict(
              coordinator_address="127.0.0.1:1234",
              num_processes=2,
              process_id=1,
              local_device_ids=None,
              initialization_timeout=900,
          ),
      ),
      ("connect", 900),
  ]
  calls.clear()
  monkeypatch.delenv("JAX_INITIALIZATION_TIMEOUT")
  distributed.maybe_initialize_distributed()
  assert (
      calls[0][1]["initialization_timeout"] == distributed.DEFAULT_INITIALIZATION_TIMEOUT_S == 300
  )


def test_local_two_process_demo(tmp_path, teacher):
  """A whole conversion (the demo's recipe on the robustness matrix's width-32 ViT: distillation,
  fine-tune, report, export) as 2 processes × 1 device: both finish and report the same top-1.
  The tiny demo itself ran here for ~90 s; this one runs the same driver in a third of that."""
  code, out = run_local(
      "-n",
      "2",
      "-d",
      "1",
      "--timeout",
      "900",
      "--config",
      f"tests/helpers/robust_config.py:teacher={teacher}",
      "--workdir",
      str(tmp_path / "demo"),
      timeout=960,
  )
  assert code == 0, out[-5000:]
  hits = per_process(out, r"student final top-1\s+(\S+)")
  assert sorted(hits) == [0, 1], out[-5000:]
  assert hits[0].group(1) == hits[1].group(1), out[-5000:]


def test_real_mode_runs_the_printed_commands_and_splits_worker_logs(tmp_path, monkeypatch):
  """Not a dry run, against a recording fake gcloud: same commands, logs split per worker."""
  record = tmp_path / "gcloud_calls.txt"
  fake = tmp_path / "fake_gcloud" / "gcloud"
  fake.parent.mkdir()
  fake.write_text(f"""#!/usr/bin/env python3
import shlex, sys
with open({str(record)!r}, "a") as f:
  f.write(shlex.join(sys.argv[1:]) + "\\n")
if "ssh" in sys.argv and "linvit_jax.main" in sys.argv[-1]:
  print("[w0] step 1 loss 2.0")
  print("[w1] step 1 loss 2.0")
  print("[w1] done", flush=True)
  sys.exit(5)
""")
  fake.chmod(0o755)
  monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
  # A small stand-in checkout: tar of the real one could race with files others are writing.
  repo = tmp_path / "repo"
  (repo / "configs").mkdir(parents=True)
  (repo / "configs" / "imagenet_vit.py").write_text("# stand-in\n")
  (repo / "setup.py").write_text(open(os.path.join(ROOT, "setup.py")).read())
  monkeypatch.setattr(tpu_pod, "REPO_ROOT", str(repo))
  out = io.StringIO()
  code = tpu_pod.main(
      [
          "all",
          *V4_32,
          "--config",
          CONFIG,
          "--workdir",
          WORKDIR,
          "--log_dir",
          str(tmp_path / "logs"),
      ],
      out=out,
  )
  assert code == 5  # the run's exit code, after the delete in `finally`
  calls = [shlex.split(line) for line in record.read_text().splitlines()]
  assert [c[3] for c in calls] == ["create", "scp", "ssh", "ssh", "delete"]
  printed = [
      shlex.split(line[2:]) for line in out.getvalue().splitlines() if line.startswith("+ gcloud")
  ]
  assert [c[1:] for c in printed] == calls
  assert not os.path.exists(printed[1][5])  # the local tarball is removed after the copy
  tar = [shlex.split(line[2:]) for line in out.getvalue().splitlines() if line.startswith("+ tar")]
  assert len(tar) == 1 and tar[0][-3:] == ["-C", str(repo), "."]
  files = sorted(os.listdir(tmp_path / "logs"))
  assert [f.split(".", 1)[1] for f in files] == ["worker0.log", "worker1.log"]
  assert (tmp_path / "logs" / files[1]).read_text() == "step 1 loss 2.0\ndone\n"
  assert "[w1] done" in out.getvalue()


def test_setup_photos_checks_its_set_first_and_downloads_what_it_names(tmp_path):
  """setup_photos.sh: valid bash; a wrong TRAIN_SET is one error line before anything is fetched;
  the packages it downloads for `all` are those debian_photos reads (cross, default and lomiri;
  people with PEOPLE_DIR; extra with `more`, scenes too with `most`)."""
  from linvit_jax.data import debian_photos

  script = os.path.join(ROOT, "launch", "setup_photos.sh")
  assert subprocess.run(["bash", "-n", script], check=False).returncode == 0
  env = {**os.environ, "LINVIT_DEB_DIR": str(tmp_path / "debs")}
  result = subprocess.run(
      ["bash", script, str(tmp_path / "t"), str(tmp_path / "c"), "everything"],
      capture_output=True, text=True, env=env, check=False,
  )  # fmt: skip
  assert result.returncode == 2 and result.stderr.startswith("error: TRAIN_SET must be")
  assert not (tmp_path / "debs").exists()
  text = open(script).read()
  for package, _ in debian_photos.CROSS_PHOTOS:
    assert package in text
  for package in ("plasma-workspace-wallpapers", "opencv-doc", "mate-backgrounds"):
    assert package in text
  assert "lomiri-wallpapers-16.04" in text and "lomiri-wallpapers-20.04" in text
  for package in {package for package, _, _ in debian_photos.PEOPLE_PHOTOS}:  # PEOPLE_DIR
    assert package in text
  extra = " ".join(dict.fromkeys(package for package, _ in debian_photos.EXTRA_PHOTOS))
  assert f'EXTRA="{extra}"' in text  # TRAIN_SET=more
  scenes = " ".join(dict.fromkeys(package for package, _ in debian_photos.SCENES_PHOTOS))
  assert f'SCENES="{scenes}"' in text  # TRAIN_SET=most
