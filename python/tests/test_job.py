"""substrax.job: the contract's variables parsed and refused, the report file's lines, the
error file, and the behaviour outside a job."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from substrax import job
from substrax._plan import Endpoints, Settings, contract_env, mesh_json, places
from substrax._progress import _parse

# docs/command-jobs.md's example: process 1 of attempt 2 of job mnist-1, per_worker on CPU
# workers, driving the devices 11 and 10 of a 2x2 mesh of two workers.
DOC_EXAMPLE = {
    "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2",
    "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "NODE_RANK": "1",
    "TORCHELASTIC_RUN_ID": "mnist-1", "TORCHELASTIC_RESTART_COUNT": "1",
    "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_ERROR_FILE": "/work/j/error.json",
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "10.0.0.9", "PET_MASTER_PORT": "29500",
    "JAX_COORDINATOR_ADDRESS": "10.0.0.9:29600", "JAX_NUM_PROCESSES": "2",
    "JAX_PROCESS_ID": "1", "JAX_NUM_CPU_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "",
    "SUBSTRAX_JOB_ID": "mnist-1", "SUBSTRAX_ATTEMPT": "2", "SUBSTRAX_PROCESS_INDEX": "1",
    "SUBSTRAX_NUM_PROCESSES": "2", "SUBSTRAX_LOCAL_DEVICE_IDS": "11,10", "SUBSTRAX_SEED": "42",
    "SUBSTRAX_GLOBAL_BATCH_SIZE": "64", "SUBSTRAX_PER_DEVICE_BATCH_SIZE": "16",
    "SUBSTRAX_STEPS": "500", "SUBSTRAX_REPORT_EVERY_STEPS": "10",
    "SUBSTRAX_METRICS": "accuracy=mean,loss=mean,step=max",
    "SUBSTRAX_CHECKPOINT_DIR": "/ckpt/mnist-1", "SUBSTRAX_RESUME_FROM": "/ckpt/old",
    "SUBSTRAX_TENSORBOARD_DIR": "/ckpt/tb", "SUBSTRAX_DATA_ROOTS": "/data/a:/data/b",
    "SUBSTRAX_CHECKPOINT_ROOTS": "/ckpt", "SUBSTRAX_MESH_FILE": "/work/j/mesh.json",
    "SUBSTRAX_REPORT_FILE": "/work/j/report.jsonl", "SUBSTRAX_ERROR_FILE": "/work/j/error.json",
}


def launch_env(tmp_path, rank=0, **settings) -> dict[str, str]:
    """The contract of process `rank` of a local attempt in tmp_path, as substrax.launch sets
    it, with the mesh file written."""
    s = Settings(**{"workers": 2, "devices_per_worker": 2, **settings})
    endpoints = Endpoints(host="127.0.0.1", torch_master_port=29500, jax_coordinator_port=29600,
                          work_dir=str(tmp_path))
    (tmp_path / "mesh.json").write_text(mesh_json(s, "h"))
    return contract_env(s, places(s)[rank], endpoints)


def test_the_docs_example_parses_to_its_meaning():
    me = job.info(DOC_EXAMPLE)
    assert me.in_job and job.in_job(DOC_EXAMPLE)
    assert (me.job_id, me.attempt, me.restart_count, me.max_restarts) == ("mnist-1", 2, 1, 3)
    assert (me.process_index, me.num_processes, me.rank, me.world_size) == (1, 2, 1, 2)
    assert (me.local_rank, me.local_world_size, me.node_rank) == (0, 1, 1)
    assert me.local_device_ids == (11, 10) and not me.is_main
    assert (me.seed, me.global_batch_size, me.per_device_batch_size) == (42, 64, 16)
    assert (me.steps, me.epochs, me.report_every_steps) == (500, None, 10)
    assert dict(me.metrics) == {"accuracy": "mean", "loss": "mean", "step": "max"}
    assert (me.checkpoint_dir, me.resume_from, me.tensorboard_dir) == (
        "/ckpt/mnist-1", "/ckpt/old", "/ckpt/tb")
    assert me.data_roots == ("/data/a", "/data/b") and me.checkpoint_roots == ("/ckpt",)
    assert (me.master_addr, me.master_port) == ("10.0.0.9", 29500)
    assert me.jax_coordinator_address == "10.0.0.9:29600"
    assert me.num_cpu_devices == 2 and me.cuda_visible_devices == ()
    assert (me.mesh_file, me.report_file, me.error_file) == (
        "/work/j/mesh.json", "/work/j/report.jsonl", "/work/j/error.json")
    with pytest.raises(ValueError, match="SUBSTRAX_MESH_FILE=/work/j/mesh.json"):
        me.mesh  # noqa: B018: read lazily, and the file is not there


def test_settings_the_spec_leaves_out_are_absent():
    env = {k: v for k, v in DOC_EXAMPLE.items()
           if k not in ("SUBSTRAX_GLOBAL_BATCH_SIZE", "SUBSTRAX_STEPS", "SUBSTRAX_METRICS",
                        "SUBSTRAX_CHECKPOINT_DIR", "SUBSTRAX_RESUME_FROM",
                        "SUBSTRAX_DATA_ROOTS", "JAX_NUM_CPU_DEVICES")}
    env["SUBSTRAX_EPOCHS"] = "3"
    me = job.info(env)
    assert (me.global_batch_size, me.steps, me.epochs) == (None, None, 3)
    assert (dict(me.metrics), me.checkpoint_dir, me.resume_from) == ({}, None, None)
    assert me.data_roots == () and me.num_cpu_devices is None


def test_the_mesh_file_is_read_lazily(tmp_path):
    me = job.info(launch_env(tmp_path, rank=1, mesh_axes=(("data", 2), ("model", 2))))
    assert me.local_device_ids == (2, 3)
    mesh = me.mesh
    assert mesh.axis_names == ("data", "model") and mesh.shape == (2, 2)
    assert [d.id for d in mesh.devices] == [0, 1, 2, 3]
    assert [(d.worker_id, d.local_index) for d in mesh.devices[2:]] == [
        ("launch-1", 0), ("launch-1", 1)]
    assert mesh.devices[0].kind == "DEVICE_KIND_CPU" and mesh.devices[0].memory_bytes == 0
    assert mesh.axis_size("model") == 2
    with pytest.raises(ValueError, match="'pipe'"):
        mesh.axis_size("pipe")
    env = launch_env(tmp_path)
    (tmp_path / "mesh.json").write_text('{"axis_names":["data"],"shape":["3"],"devices":[]}')
    with pytest.raises(ValueError, match="SUBSTRAX_MESH_FILE=.*do not match its 0 devices"):
        job.info(env).mesh  # noqa: B018
    (tmp_path / "mesh.json").write_text('{"axis_names":["data"]}')
    with pytest.raises(ValueError, match="SUBSTRAX_MESH_FILE=.*not a mesh"):
        job.info(env).mesh  # noqa: B018


@pytest.mark.parametrize("name,value,message", [
    ("SUBSTRAX_PROCESS_INDEX", "one", "SUBSTRAX_PROCESS_INDEX='one': not an integer"),
    ("SUBSTRAX_PROCESS_INDEX", "2", "SUBSTRAX_PROCESS_INDEX=2 is not less than "
                                    "SUBSTRAX_NUM_PROCESSES=2"),
    ("SUBSTRAX_NUM_PROCESSES", "0", "SUBSTRAX_NUM_PROCESSES='0': less than 1"),
    ("RANK", "-1", "RANK='-1': less than 0"),
    ("SUBSTRAX_ATTEMPT", "0", "SUBSTRAX_ATTEMPT='0': less than 1"),
    ("SUBSTRAX_LOCAL_DEVICE_IDS", "11,x", "SUBSTRAX_LOCAL_DEVICE_IDS='11,x'"),
    ("SUBSTRAX_LOCAL_DEVICE_IDS", "11,11", "SUBSTRAX_LOCAL_DEVICE_IDS='11,11'"),
    ("SUBSTRAX_SEED", "4.2", "SUBSTRAX_SEED='4.2'"),
    ("SUBSTRAX_STEPS", "0", "SUBSTRAX_STEPS='0': less than 1"),
    ("SUBSTRAX_METRICS", "loss=avg", "SUBSTRAX_METRICS='loss=avg': 'loss=avg' is not "
                                     "NAME=REDUCTION"),
    ("SUBSTRAX_METRICS", "loss", "SUBSTRAX_METRICS"),
    ("SUBSTRAX_CHECKPOINT_DIR", "ckpt/x", "SUBSTRAX_CHECKPOINT_DIR='ckpt/x': not an absolute"),
    ("SUBSTRAX_DATA_ROOTS", "/data:rel", "SUBSTRAX_DATA_ROOTS='/data:rel': the root 'rel'"),
    ("SUBSTRAX_REPORT_FILE", "report.jsonl", "SUBSTRAX_REPORT_FILE='report.jsonl'"),
    ("JAX_PROCESS_ID", "0", "JAX_PROCESS_ID=0 differs from SUBSTRAX_PROCESS_INDEX=1"),
    ("MASTER_PORT", "70000", "MASTER_PORT='70000': not a port"),
    ("JAX_NUM_CPU_DEVICES", "0", "JAX_NUM_CPU_DEVICES='0': less than 1"),
])
def test_bad_values_are_refused_naming_the_variable(name, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        job.info({**DOC_EXAMPLE, name: value})


@pytest.mark.parametrize("name", ["SUBSTRAX_JOB_ID", "SUBSTRAX_ATTEMPT", "RANK", "WORLD_SIZE",
                                  "SUBSTRAX_LOCAL_DEVICE_IDS", "SUBSTRAX_ERROR_FILE",
                                  "SUBSTRAX_MESH_FILE"])
def test_a_job_without_a_variable_the_contract_always_sets_is_refused(name):
    env = {k: v for k, v in DOC_EXAMPLE.items() if k != name}
    with pytest.raises(ValueError, match=f"{name} is not set, but SUBSTRAX_REPORT_FILE is"):
        job.info(env)


def test_outside_a_job_info_is_one_local_process():
    me = job.info({"SUBSTRAX_STEPS": "10", "SUBSTRAX_SEED": "7", "JAX_NUM_CPU_DEVICES": "4",
                   "RANK": "3"})
    assert not me.in_job and not job.in_job({})
    assert (me.job_id, me.attempt, me.process_index, me.num_processes) == ("local", 1, 0, 1)
    assert (me.rank, me.world_size, me.is_main) == (0, 1, True)
    assert me.local_device_ids == (0, 1, 2, 3)
    assert (me.steps, me.seed) == (10, 7)
    assert (me.report_file, me.error_file, me.mesh) == (None, None, None)
    assert job.info({}).local_device_ids == (0,)
    with pytest.raises(ValueError, match="SUBSTRAX_STEPS"):
        job.info({"SUBSTRAX_STEPS": "many"})


@pytest.fixture
def in_job(tmp_path, outside_job):
    """os.environ as process 0 of a local attempt in tmp_path; returns the report file."""
    for name, value in launch_env(tmp_path).items():
        outside_job.setenv(name, value)
    return tmp_path / "report-0.jsonl"


def read_lines(path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]
    for line in text.splitlines():  # and the launcher's reader takes each
        assert isinstance(_parse(line.encode()), dict), line
    return records


def test_reports_are_the_documented_json_lines(in_job, tmp_path):
    job.report_total_steps(20)
    job.report_resumed(0)
    job.report(10, {"loss": 0.25, "accuracy": 1}, samples_per_second=812.5)
    job.report(10, {"loss": 0.5}, device=1)
    job.report_checkpoint(10, str(tmp_path / "step-10"), size_bytes=1024)
    job.report_resumed(10, tmp_path / "step-10")
    job.heartbeat()
    job.report_final({"test_accuracy": 0.97})
    assert read_lines(in_job) == [
        {"type": "total_steps", "total_steps": 20},
        {"type": "resumed", "step": 0},
        {"type": "step", "step": 10, "metrics": {"loss": 0.25, "accuracy": 1.0},
         "samples_per_second": 812.5},
        {"type": "step", "step": 10, "metrics": {"loss": 0.5}, "device": 1},
        {"type": "checkpoint", "step": 10, "path": str(tmp_path / "step-10"),
         "size_bytes": 1024},
        {"type": "resumed", "step": 10, "path": str(tmp_path / "step-10")},
        {"type": "heartbeat"},
        {"type": "final", "metrics": {"test_accuracy": 0.97}},
    ]


def test_numpy_and_jax_scalars_are_numbers(in_job, need):
    np = need("numpy")
    job.report(np.int64(3), {"loss": np.float32(0.5), "n": np.int32(2)})
    jnp = need("jax.numpy")
    job.report(4, {"loss": jnp.float32(0.25)})
    assert [r["metrics"] for r in read_lines(in_job)] == [{"loss": 0.5, "n": 2.0},
                                                         {"loss": 0.25}]


@pytest.mark.parametrize("call,message", [
    (lambda: job.report(1, {"loss": math.nan}), "metric 'loss' is nan, not a finite number"),
    (lambda: job.report(1, {"loss": 1.0, "grad": -math.inf}), "metric 'grad' is -inf"),
    (lambda: job.report(1, {"loss": 1.0}, samples_per_second=math.inf), "samples_per_second"),
    (lambda: job.report_final({"acc": math.nan}), "metric 'acc' is nan"),
    (lambda: job.report(1, {"loss": "low"}), "metric 'loss'='low' is not a number"),
    (lambda: job.report(1, {"samples_per_second": 1.0}), "pass samples_per_second="),
    (lambda: job.report(1, {"": 1.0}), "metric name ''"),
    (lambda: job.report(1, {"x" * 257: 1.0}), "1 to 256 bytes"),
    (lambda: job.report(1, {f"m{i}": 1.0 for i in range(65)}), "65 metrics"),
    (lambda: job.report(-1, {"loss": 1.0}), "step=-1 is outside [0, 2^53]"),
    (lambda: job.report(1.5, {"loss": 1.0}), "step=1.5 is not an integer"),
    (lambda: job.report(True, {"loss": 1.0}), "step=True is not an integer"),
    (lambda: job.report(1, [("loss", 1.0)]), "metrics must be a mapping"),
    (lambda: job.report(1, {"loss": 1.0}, device=7), "device 7 is not one of this process's"),
    (lambda: job.report_total_steps(2 ** 53 + 1), "total_steps"),
])
def test_bad_reports_are_refused_and_nothing_is_written(in_job, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
    assert not in_job.exists()


def test_a_torchrun_worker_reports_for_its_own_device(tmp_path, outside_job):
    env = launch_env(tmp_path, rank=1)  # worker 1: devices 2 and 3
    env.update({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    for name, value in env.items():
        outside_job.setenv(name, value)
    job.report(5, {"loss": 1.0})
    assert read_lines(tmp_path / "report-1.jsonl") == [
        {"type": "step", "step": 5, "metrics": {"loss": 1.0}, "device": 3, "process": 3}]


def test_processes_appending_together_keep_their_lines_whole(in_job):
    writer = textwrap.dedent("""
        import sys
        from substrax import job
        for step in range(300):
            job.report(step, {f"metric_{sys.argv[1]}_{i}": 0.5 for i in range(40)})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(i)]) for i in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    records = read_lines(in_job)
    assert len(records) == 600 and all(len(r["metrics"]) == 40 for r in records)


def test_outside_a_job_reports_are_printed(outside_job, capsys, tmp_path):
    job.report_total_steps(10)
    job.report(5, {"loss": 0.5}, samples_per_second=100)
    job.report_checkpoint(5, "/ckpt/step-5")
    job.heartbeat()
    job.report_final({"accuracy": 0.875})
    with pytest.raises(ValueError, match="metric 'loss' is nan"):
        job.report(6, {"loss": math.nan})
    assert capsys.readouterr().err.splitlines() == [
        "step 5/10: loss=0.5 (100.0 samples/s)", "checkpoint of step 5: /ckpt/step-5",
        "final: accuracy=0.875"]
    assert job.write_error_file(ValueError("x")) is None
    assert list(tmp_path.iterdir()) == []  # nor an error file anywhere


FAILING = """
import sys
from substrax import job

{setup}

def main():
    {body}

{call}
"""


def run_failing(tmp_path, body, *, setup="", call="main()", in_a_job=True):
    """Runs a script that fails as `body` says; returns (its exit status, stderr, the error
    file's JSON or None)."""
    env = dict(os.environ)
    if in_a_job:
        env.update(launch_env(tmp_path))
    script = tmp_path / "script.py"
    script.write_text(FAILING.format(setup=setup, body=body, call=call))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=60)
    error_file = tmp_path / "error-0.json"
    return proc.returncode, proc.stderr, (json.loads(error_file.read_text())
                                          if error_file.exists() else None)


def test_record_writes_the_error_file_and_raises_on(tmp_path):
    status, err, error = run_failing(
        tmp_path, 'raise ValueError("the data shard is corrupt")', call="job.record(main)()")
    assert status == 1 and "ValueError: the data shard is corrupt" in err
    assert error["message"] == "ValueError: the data shard is corrupt"
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert 'raise ValueError("the data shard is corrupt")' in error["traceback"]
    assert error["retry"] is True


@pytest.mark.parametrize("setup,call,body,retry", [
    ("", "job.record(main)()", 'raise job.PermanentError("bad settings")', False),
    ("", "job.record(retry=False)(main)()", 'raise KeyError("x")', False),
    ("job.install_error_hook()", "main()", 'raise RuntimeError("boom")', True),
    ("job.install_error_hook(retry=False)", "main()", 'raise RuntimeError("boom")', False),
    ("", "job.record(main)()", 'raise SystemExit("the data is missing")', True),
])
def test_the_error_hooks_and_retry(tmp_path, setup, call, body, retry):
    status, err, error = run_failing(tmp_path, body, setup=setup, call=call)
    assert status == 1 and error is not None, err
    assert error["retry"] is retry
    assert "Traceback" in error["traceback"]


@pytest.mark.parametrize("body", ["raise SystemExit(3)", "raise KeyboardInterrupt",
                                  "sys.exit(0)"])
def test_an_exit_status_alone_writes_no_error_file(tmp_path, body):
    status, _, error = run_failing(tmp_path, body, call="job.record(main)()")
    assert error is None and status in (0, 3, 1, -2, 130)


def test_the_first_error_of_an_attempt_stays(tmp_path):
    status, _, error = run_failing(
        tmp_path, 'raise ValueError("second")',
        setup='job.write_error_file(ValueError("first"))', call="job.record(main)()")
    assert status == 1 and error["message"] == "ValueError: first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error-0.json", "mesh.json",
                                                          "script.py"]


def test_outside_a_job_the_error_is_raised_as_usual(tmp_path):
    status, err, error = run_failing(tmp_path, 'raise ValueError("local")',
                                     setup="job.install_error_hook()", in_a_job=False)
    assert status == 1 and "ValueError: local" in err and error is None


def test_importing_the_job_part_imports_no_framework():
    code = ("import sys, substrax, substrax.job, substrax.launch, substrax.distributed; "
            "print(sorted(m for m in ('jax', 'torch', 'numpy', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


STOPPING = """
import sys, threading, time
from substrax import job

assert not job.stop_requested()
print("ready", flush=True)
deadline = time.monotonic() + 30
while not job.stop_requested():
    assert time.monotonic() < deadline, "no SIGTERM within 30 s"
    time.sleep(0.01)
print("stopped", flush=True)
# A second SIGTERM (torchrun forwards the agent's) must not kill it either.
print("again", flush=True)
sys.stdin.readline()
errors = []
def other_thread():
    try:
        job.stop_requested()
    except RuntimeError as e:
        errors.append(str(e))
t = threading.Thread(target=other_thread)
t.start(); t.join()
print("from a thread:", errors, flush=True)
"""


def test_sigterm_sets_stop_requested_instead_of_killing(tmp_path):
    script = tmp_path / "stopping.py"
    script.write_text(STOPPING)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline() == "stopped\n"
        assert proc.stdout.readline() == "again\n"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate("go on\n", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    # Installed already: another thread may ask too.
    assert out == "from a thread: []\n"


def test_the_first_call_must_come_from_the_main_thread(tmp_path):
    code = ("import threading\nfrom substrax import job\nerrors = []\n"
            "def f():\n    try:\n        job.stop_requested()\n"
            "    except RuntimeError as e:\n        errors.append(str(e))\n"
            "t = threading.Thread(target=f); t.start(); t.join(); print(errors[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "call it once from the main thread first" in out
