"""The guide's example (examples/python/fashion_mnist.py) through `substrax.launch`: after 20
steps, 2 processes x 2 CPU devices end with the parameters of 1 process x 4 devices (max
|difference| <= 1e-6), on the SPMD path and on the collective (`nnx.shard_map`) path alike; and
SIGTERM makes it checkpoint and exit 0.
Needs JAX and Debian's Fashion-MNIST (tools/install_deps.sh)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import missing

DATA = pathlib.Path("/usr/share/datasets/fashion-mnist")
STEPS = 20


def train(repo_root: pathlib.Path, tmp_path: pathlib.Path, processes: int, devices: int,
          step: str) -> list[np.ndarray]:
    """The example's parameters after STEPS steps, run by `substrax.launch` as given."""
    out = tmp_path / f"{step}-{processes}x{devices}.npz"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    run = subprocess.run(
        [sys.executable, "-m", "substrax.launch", "-n", str(processes),
         "--devices-per-process", str(devices), "--steps", str(STEPS),
         "--global-batch-size", "128", "--work-dir", str(tmp_path / f"{step}-{processes}"),
         "--", sys.executable, str(repo_root / "examples/python/fashion_mnist.py"),
         "--data", str(DATA), "--step", step, "--export", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (f"launch exited {run.returncode}:\n{run.stdout[-3000:]}\n"
                                 f"{run.stderr[-3000:]}")
    saved = np.load(out)
    return [saved[f"param{i}"] for i in range(len(saved.files))]


@pytest.fixture
def reference(need, repo_root: pathlib.Path, tmp_path: pathlib.Path) -> list[np.ndarray]:
    need("jax")
    need("flax")
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        missing(f"Fashion-MNIST in {DATA}")
    return train(repo_root, tmp_path, 1, 4, "spmd")


@pytest.mark.parametrize("step", ["spmd", "collective"])
def test_two_processes_of_two_devices_train_as_one_of_four(reference: list[np.ndarray],
                                                           repo_root: pathlib.Path,
                                                           tmp_path: pathlib.Path,
                                                           step: str) -> None:
    got = train(repo_root, tmp_path, 2, 2, step)
    assert len(got) == len(reference) == 6  # 3 layers: kernel and bias each
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(got, reference))
    assert worst <= 1e-6, f"{step}, 2 x 2: parameters differ from 1 x 4 by up to {worst}"


def test_sigterm_checkpoints_the_step_and_exits_zero(need, repo_root: pathlib.Path,
                                                     tmp_path: pathlib.Path) -> None:
    """Run by hand on one process: SIGTERM after the first report makes it write a checkpoint
    of the step it is at and exit 0 saying so."""
    need("jax")
    need("flax")
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        missing(f"Fashion-MNIST in {DATA}")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(JAX_NUM_CPU_DEVICES="2", SUBSTRAX_STEPS="100000", SUBSTRAX_REPORT_EVERY_STEPS="5",
               SUBSTRAX_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    proc = subprocess.Popen(
        [sys.executable, str(repo_root / "examples/python/fashion_mnist.py"), "--data",
         str(DATA)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Outside a job the reports are printed to stderr: "step 5/100000: loss=...".
        for line in proc.stderr:
            if line.startswith("step "):
                break
        else:
            pytest.fail(f"no report before the example exited {proc.wait()}")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{out}\n{err[-3000:]}"
    stopped = [line for line in out.splitlines() if line.startswith("stopped at step ")]
    assert len(stopped) == 1 and stopped[0].endswith(" (SIGTERM): checkpoint written"), out
    step = int(stopped[0].split()[3])
    assert (tmp_path / "ckpt" / f"step-{step}" / "state.npz").exists()
