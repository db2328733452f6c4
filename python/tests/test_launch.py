"""substrax.launch: the contract it renders (against the C++ contract's names and the docs'
table), and real processes: JAX in 2 processes x 2 CPU devices, a failing process, Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from substrax._contract import NAMES, VARIABLES
from substrax._plan import Endpoints, Settings, contract_env, mesh_json, places, process_env
from substrax._progress import Progress

LAUNCH = [sys.executable, "-m", "substrax.launch"]
# Bounds, never waits: every wait below polls until its condition holds or this passes.
DEADLINE_SECONDS = 120


def cpp_contract_names(repo_root) -> list[str]:
    """The names contract/command_env.cc's CommandEnvNames() lists, in its order."""
    source = (repo_root / "contract/command_env.cc").read_text()
    body = re.search(r"CommandEnvNames\(\) \{.*?\{(.*?)\};", source, re.S)
    assert body, "contract/command_env.cc: no CommandEnvNames() list"
    return re.findall(r'"([A-Z_]+)"', body.group(1))


def test_the_variables_are_the_cpp_contracts(repo_root):
    assert list(NAMES) == cpp_contract_names(repo_root)


def test_every_variable_is_in_the_docs_table(repo_root):
    doc = (repo_root / "docs/command-jobs.md").read_text()
    table = set(re.findall(r"^\| `([A-Z_]+)` \|", doc, re.M))
    assert set(NAMES) == table


def endpoints(tmp_path) -> Endpoints:
    return Endpoints(host="127.0.0.1", torch_master_port=29500, jax_coordinator_port=29600,
                     work_dir=str(tmp_path))


def test_per_worker_processes_get_the_tables_meanings(tmp_path):
    s = Settings(workers=2, devices_per_worker=2, job_id="mnist-1", seed=42, steps=500,
                 metrics={"loss": "mean", "accuracy": "mean"}, checkpoint_dir="/ckpt/m",
                 data_roots=("/data/a", "/data/b"))
    envs = [contract_env(s, p, endpoints(tmp_path)) for p in places(s)]
    optional = {v.name for v in VARIABLES if not v.always}
    for env in envs:
        assert {v.name for v in VARIABLES if v.always} <= set(env)
        assert list(env) == [n for n in NAMES if n in env]  # the table's order
    one = envs[1]
    assert {k: one[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK", "NODE_RANK", "JAX_PROCESS_ID",
                                "JAX_NUM_PROCESSES", "SUBSTRAX_PROCESS_INDEX",
                                "SUBSTRAX_NUM_PROCESSES", "PET_NNODES", "PET_NPROC_PER_NODE",
                                "PET_NODE_RANK", "JAX_NUM_CPU_DEVICES",
                                "SUBSTRAX_LOCAL_DEVICE_IDS")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "1", "NODE_RANK": "1", "JAX_PROCESS_ID": "1", "JAX_NUM_PROCESSES": "2",
        "SUBSTRAX_PROCESS_INDEX": "1", "SUBSTRAX_NUM_PROCESSES": "2", "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1", "JAX_NUM_CPU_DEVICES": "2",
        "SUBSTRAX_LOCAL_DEVICE_IDS": "2,3"}
    assert one["SUBSTRAX_METRICS"] == "accuracy=mean,loss=mean"
    assert one["SUBSTRAX_DATA_ROOTS"] == "/data/a:/data/b"
    assert one["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:29600"
    assert one["CUDA_VISIBLE_DEVICES"] == ""
    assert one["SUBSTRAX_REPORT_FILE"] == str(tmp_path / "report-1.jsonl")
    assert one["SUBSTRAX_ERROR_FILE"] == one["TORCHELASTIC_ERROR_FILE"] == str(
        tmp_path / "error-1.json")
    # Left out: absent, not empty.
    assert not {"SUBSTRAX_EPOCHS", "SUBSTRAX_RESUME_FROM", "SUBSTRAX_TENSORBOARD_DIR",
                "SUBSTRAX_CHECKPOINT_ROOTS", "SUBSTRAX_GLOBAL_BATCH_SIZE"} & set(one)
    assert optional - set(one) == {"SUBSTRAX_EPOCHS", "SUBSTRAX_RESUME_FROM",
                                   "SUBSTRAX_TENSORBOARD_DIR", "SUBSTRAX_CHECKPOINT_ROOTS",
                                   "SUBSTRAX_GLOBAL_BATCH_SIZE",
                                   "SUBSTRAX_PER_DEVICE_BATCH_SIZE",
                                   "SUBSTRAX_REPORT_EVERY_STEPS"}


def test_per_device_processes_get_the_tables_meanings(tmp_path):
    s = Settings(workers=2, devices_per_worker=2, per_device=True, restart_count=1,
                 checkpoint_dir="/ckpt/m")
    envs = [contract_env(s, p, endpoints(tmp_path)) for p in places(s)]
    got = [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"],
            e["SUBSTRAX_LOCAL_DEVICE_IDS"], e["JAX_NUM_CPU_DEVICES"]) for e in envs]
    assert got == [("0", "4", "0", "2", "0", "0", "1"), ("1", "4", "1", "2", "0", "1", "1"),
                   ("2", "4", "0", "2", "1", "2", "1"), ("3", "4", "1", "2", "1", "3", "1")]
    # A restarted attempt resumes from the checkpoint directory, as on a cluster.
    assert envs[0]["SUBSTRAX_RESUME_FROM"] == "/ckpt/m"
    assert envs[0]["TORCHELASTIC_RESTART_COUNT"] == "1"


def test_the_mesh_file_is_what_the_agent_writes():
    text = mesh_json(Settings(workers=2, devices_per_worker=2,
                              mesh_axes=(("data", 2), ("model", 2))), "a")
    # contract/command_env_test.cc's expectations of EncodeMeshFile, field for field.
    assert '"axis_names":["data","model"]' in text and '"shape":["2","2"]' in text
    assert ('{"id":0,"host":"a","worker_id":"launch-0","local_index":0,"kind":"DEVICE_KIND_CPU",'
            '"name":"cpu","memory_bytes":"0","pci_bus_id":""}') in text
    assert text.endswith("}\n") and text.count("\n") == 1


def test_the_launchers_own_contract_values_do_not_leak_into_a_process(tmp_path):
    base = {"PATH": "/bin", "SUBSTRAX_STEPS": "99", "RANK": "7"}
    s = Settings(workers=1)
    env = process_env(base, contract_env(s, places(s)[0], endpoints(tmp_path)))
    assert env["RANK"] == "0" and "SUBSTRAX_STEPS" not in env and env["PATH"] == "/bin"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_progress_reduces_each_step_across_devices_as_declared(tmp_path):
    s = Settings(workers=2, devices_per_worker=2)
    files = [tmp_path / "report-0.jsonl", tmp_path / "report-1.jsonl"]
    lines: list[str] = []
    progress = Progress([str(f) for f in files], places(s), {"loss": "max", "n": "sum",
                                                              "acc": "none"}, lines.append)
    files[0].write_text(
        '{"type":"total_steps","total_steps":2}\n'
        '{"type":"step","step":1,"metrics":{"loss":1,"n":1,"acc":0.5},"samples_per_second":10}\n'
        '{"type":"checkpoint","step":1,"path":"/c/1"}\n'
        'not json\n{"type":"step","step":2,"metrics":{"loss":NaN}}\n{"type":"later"}\n'
        '{"type":"step","step":2,"metrics":{"loss":0.5}}\n{"type":"step","step":2')
    progress.poll()
    assert lines[:1] == [f"report file {files[0]} line 4: skipped: not JSON: Expecting value: "
                         "line 1 column 1 (char 0)"]
    assert "line 5: skipped: not JSON: NaN is not a finite number" in lines[1]
    assert len(lines) == 2  # step 1 waits for process 1's devices, its checkpoint for step 1
    with open(files[1], "a") as f:
        f.write('{"type":"step","step":1,"metrics":{"loss":3,"n":1,"acc":0.75},'
                '"samples_per_second":10}\n{"type":"step","step":1,"device":2,'
                '"metrics":{"loss":4,"n":1,"acc":1}}\n{"type":"final","metrics":{"a":1}}\n')
    assert progress.finish() == {"a": 1}
    assert lines[2:] == ["step 1/2: acc=0.5..1 loss=4 n=4 (20.0 samples/s)",
                         "checkpoint of step 1: /c/1",
                         "step 2/2: loss=0.5 (partial: 2 of 4 devices)", "final: a=1",
                         "2 report lines skipped"]


def launch(tmp_path, *args, script: str, **popen) -> subprocess.Popen:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.Popen([*LAUNCH, "--work-dir", str(tmp_path / "attempt"), *args, "--",
                             sys.executable, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=DEADLINE_SECONDS)
    return proc.returncode, out, err


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (one that ended, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_SECONDS} s"
        time.sleep(0.05)


def pids_in(directory) -> list[int]:
    return [int(p.read_text()) for p in sorted(directory.glob("*.pid"))]


PSUM = """
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from substrax import distributed, job

    me = distributed.initialize(timeout_seconds=60)
    assert jax.local_device_count() == 2, jax.local_devices()  # JAX_NUM_CPU_DEVICES, by JAX
    assert jax.process_index() == me.process_index and jax.process_count() == 2
    mesh = Mesh(np.array(jax.devices()), ("d",))
    # This process's part of the global [1, 2, 3, 4]: one number per local device.
    mine = np.arange(2 * me.process_index + 1, 2 * me.process_index + 3, dtype=np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), mine)
    psum = jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"),
                         out_specs=P())
    got = float(jax.jit(psum)(x).addressable_data(0)[0])
    job.report_total_steps(1)
    job.report(1, {"psum": got, "rank": me.process_index})
    job.report_final({"devices": jax.device_count()})
    print(f"process {me.process_index}: psum over {jax.device_count()} devices = {got}")
"""


def test_jax_in_two_processes_of_two_devices_psums_right(tmp_path, need):
    need("jax")
    rc, out, err = finish(launch(tmp_path, "-n", "2", "--devices-per-process", "2",
                                 "--metric", "psum=max", "--metric", "rank=sum",
                                 script=PSUM))
    assert rc == 0, out + err
    for rank in (0, 1):
        assert f"[p{rank}] process {rank}: psum over 4 devices = 10.0" in out, out + err
    # Ranks 0 and 1, each for its 2 devices: the sum over the 4 devices is 2.
    assert "[launch] step 1/1: psum=10 rank=2" in err, err
    assert "[launch] final: devices=4" in err and "[launch] 2 processes succeeded" in err


def test_the_cluster_tests_jax_script_runs_unchanged(tmp_path, repo_root, need):
    """tests/commands/jax_psum.py, which an agent runs as a command job in tests/commands,
    reads the contract by hand: under the launcher it finds the same variables."""
    need("jax")
    script = (repo_root / "tests/commands/jax_psum.py").read_text()
    rc, out, err = finish(launch(tmp_path, "-n", "2", "--devices-per-process", "2",
                                 "--metric", "psum=max", script=script))
    assert rc == 0, out + err
    assert "[p1] OK process 1 of 2: psum over 4 devices = 10.0" in out, out + err
    assert "[launch] step 1: psum=10" in err, err


def test_per_device_processes_see_their_ranks(tmp_path):
    script = """
        from substrax import job
        me = job.info()
        print(me.rank, me.world_size, me.local_rank, me.node_rank, me.local_device_ids)
    """
    rc, out, err = finish(launch(tmp_path, "-n", "2", "--devices-per-process", "2",
                                 "--per-device", script=script))
    assert rc == 0, out + err
    assert sorted(line for line in out.splitlines()) == [
        "[p0] 0 4 0 0 (0,)", "[p1] 1 4 1 0 (1,)", "[p2] 2 4 0 1 (2,)", "[p3] 3 4 1 1 (3,)"]


STUCK_AND_FAILING = """
    import os, subprocess, sys, time
    from substrax import job

    me = job.info()
    pids = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pids")
    # Each process and a child of its own, which must go with it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    for pid, name in ((os.getpid(), "self"), (child.pid, "child")):
        path = os.path.join(pids, f"{me.rank}-{name}.pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(pid))
        os.rename(path + ".tmp", path)  # whole when it appears

    def all_started():
        return len([n for n in os.listdir(pids) if n.endswith(".pid")]) == 4

    @job.record
    def main():
        if me.rank == 1 and os.environ.get("FAIL") == "raise":
            while not all_started():
                time.sleep(0.05)
            print("rank 1 fails now", flush=True)
            raise ValueError("the data shard is corrupt")
        if me.rank == 1 and os.environ.get("FAIL") == "exit":
            while not all_started():
                time.sleep(0.05)
            print("last words of rank 1", flush=True)
            os._exit(3)
        time.sleep(600)

    main()
"""


@pytest.mark.parametrize("fail,status,shown", [
    ("raise", 1, "its error file:\nValueError: the data shard is corrupt\nTraceback"),
    ("exit", 3, "its last lines:\nlast words of rank 1"),
])
def test_a_failing_process_stops_the_others(tmp_path, fail, status, shown):
    (tmp_path / "pids").mkdir()
    proc = launch(tmp_path, "-n", "2", "--grace", "5", script=STUCK_AND_FAILING,
                  env={**os.environ, "FAIL": fail})
    rc, out, err = finish(proc)
    assert rc == status, out + err
    assert f"[launch] process 1 exited with status {status}; {shown}" in err, err
    pids = pids_in(tmp_path / "pids")
    assert len(pids) == 4
    wait_until(lambda: not any(alive(pid) for pid in pids), "every process and child gone")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_every_process(tmp_path, signum):
    (tmp_path / "pids").mkdir()
    proc = launch(tmp_path, "-n", "2", "--grace", "5", script=STUCK_AND_FAILING)
    wait_until(lambda: len(pids_in(tmp_path / "pids")) == 4,
               "both processes and their children started")
    pids = pids_in(tmp_path / "pids")
    proc.send_signal(signum)
    rc, out, err = finish(proc)
    assert rc == 128 + signum, out + err
    assert f"[launch] {signal.Signals(signum).name}: stopping every process" in err
    wait_until(lambda: not any(alive(pid) for pid in pids), "every process and child gone")


def test_a_bad_setting_is_refused_before_anything_starts(tmp_path):
    rc, _, err = finish(launch(tmp_path, "-n", "2", "--devices-per-process", "2", "--mesh",
                               "data=3", script="raise SystemExit('never run')"))
    assert rc == 2 and "--mesh: sizes [3] multiply to 3, not the 4 devices" in err
    rc, _, err = finish(launch(tmp_path, "--metric", "loss=avg", script=""))
    assert rc == 2 and "--metric loss=avg" in err


def test_a_command_that_cannot_start_fails_the_launch(tmp_path):
    proc = subprocess.run([*LAUNCH, "-n", "2", "--", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=DEADLINE_SECONDS)
    assert proc.returncode == 127 and "cannot start" in proc.stderr, proc.stderr


TORCH = """
    import torch
    from substrax import distributed, job

    dist = distributed.init_torch_process_group(timeout_seconds=60)
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {t[0].item()}")
    dist.destroy_process_group()
"""


def test_torch_gloo_from_the_contract(tmp_path, repo_root):
    """Debian's torch (in /usr/bin/python3, not in the JAX environment) with this substrax:
    the package's directory alone on its PYTHONPATH."""
    import substrax

    python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import torch.distributed"], capture_output=True)
    if probe.returncode != 0:
        from conftest import missing

        missing("Debian's python3-torch")
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "substrax").symlink_to(os.path.dirname(substrax.__file__))
    (tmp_path / "script.py").write_text(textwrap.dedent(TORCH))
    proc = subprocess.run(
        [*LAUNCH, "-n", "2", "--", python, str(tmp_path / "script.py")],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "path")}, capture_output=True,
        text=True, timeout=DEADLINE_SECONDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[p0] rank 0 of 2: 3.0" in proc.stdout and "[p1] rank 1 of 2: 3.0" in proc.stdout
    # Outside a job: a group of one process.
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    alone = subprocess.run([python, str(tmp_path / "script.py")], capture_output=True,
                           text=True, timeout=DEADLINE_SECONDS,
                           env={**env, "PYTHONPATH": str(tmp_path / "path")})
    assert alone.returncode == 0 and "rank 0 of 1: 1.0" in alone.stdout, alone.stderr
