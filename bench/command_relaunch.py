#!/usr/bin/python3
"""Launch and relaunch of a command job, substrax against torchrun, in one run (bench/README.md).

The same script (bench/relaunch_job.py: torch.distributed over Gloo, 2 nodes x 2 processes, one
all-reduce, then rank 1 fails once with status 3 and the job must restart and succeed) runs
  - as a substrax command job (`processes: per_device`, `max_restarts: 1`) on a local cluster
    this script starts: a coordinator and 2 agents x 2 CPU devices, plaintext, the coordinator's
    --restart-backoff as given (default here 100ms; the coordinator's own default is 1s, a
    crash-loop guard torchrun does not have);
  - under two torchrun processes, one per node, with the flags printed (Debian's torch 1.13:
    --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d --max_restarts=1 --monitor_interval=0.1,
    plus --tee/--redirects, which Debian 12's torchrun cannot start without).
Measured from the script's own timestamps (all on this machine's clock):
  launch_to_first_step_s_*  from the submit (substrax) or the start of the torchrun processes
                            to the last rank's first all-reduce;
  relaunch_s_*              from rank 1's failure to the last rank's first all-reduce after the
                            restart.
ROUNDS rounds (--rounds, default 3), each running both in turn; the figures are medians. Each run
must have failed once and then succeeded on all 4 ranks, or this exits 1. Asserts no timing.
Usage: bench/command_relaunch.sh [--rounds N] [--restart-backoff D]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_cluster import Cluster, binaries, stop

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "relaunch_job.py")
TORCHRUN_FLAGS = ["--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                  "--max_restarts=1", "--monitor_interval=0.1", "--tee=2", "--redirects=1"]
RANKS = 4


def timings(bench_dir, launched):
    """(launch_to_first_step, relaunch) from the job's times file; exits when the run is not one
    failure followed by a whole successful run."""
    steps = {0: [], 1: []}
    fails = []
    with open(os.path.join(bench_dir, "times")) as f:
        for line in f:
            event, run, _, t = line.split()
            if event == "step":
                steps[int(run)].append(float(t))
            elif event == "fail":
                fails.append(float(t))
    if len(fails) != 1 or len(steps[0]) < 2 or len(steps[1]) != RANKS:
        raise SystemExit(f"command_relaunch: the run in {bench_dir} is not one failure and a "
                         f"whole restart: {len(fails)} failures, first-run steps {len(steps[0])}, "
                         f"restarted steps {len(steps[1])} (want {RANKS})")
    return max(steps[0]) - launched, max(steps[1]) - fails[0]


def run_substrax(bins, work, backoff):
    bench_dir = os.path.join(work, "bench")
    programs = os.path.join(work, "programs")
    os.makedirs(bench_dir)
    os.makedirs(programs)
    shutil.copy(JOB, programs)
    with Cluster(bins, work, ["--restart-backoff", backoff],
                 ["--programs-dir", programs, "--allow-command-jobs", "--python-env",
                  "system=/usr"]) as cluster:
        job, launched = cluster.submit(
            "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: relaunch}\n"
            "spec:\n  command:\n    python_env: system\n    processes: per_device\n"
            f"    argv: [python3, {programs}/relaunch_job.py]\n"
            f"    env: {{JOB_BENCH_DIR: {bench_dir}}}\n"
            "  mesh: {data_parallel_size: 4}\n  max_restarts: 1\n")
        state = cluster.wait_end(job, 180)["state"]
        if state != "JOB_STATE_SUCCEEDED":
            raise SystemExit(f"command_relaunch: the substrax job ended {state}; logs in {work}")
        return timings(bench_dir, launched)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(work):
    bench_dir = os.path.join(work, "bench")
    os.makedirs(bench_dir)
    endpoint = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JOB_BENCH_DIR=bench_dir)
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(name, None)
    logs = open(os.path.join(work, "torchrun.log"), "w")
    launched = time.time()
    nodes = [subprocess.Popen(
        ["/usr/bin/torchrun"] + TORCHRUN_FLAGS +
        ["--rdzv_endpoint", endpoint, "--rdzv_id", "relaunch", "--log_dir",
         os.path.join(work, f"logs-{n}"), JOB], env=env, stdout=logs, stderr=subprocess.STDOUT)
        for n in range(2)]
    try:
        for node in nodes:
            if node.wait(timeout=180) != 0:
                raise SystemExit(f"command_relaunch: torchrun exited {node.returncode}; log in "
                                 f"{work}/torchrun.log")
    finally:
        stop(nodes)
        logs.close()
    return timings(bench_dir, launched)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--restart-backoff", default="100ms")
    parser.add_argument("--bin-dir", required=True, help="bazel-bin of a -c opt build")
    args = parser.parse_args()
    bins = binaries(args.bin_dir)
    print(f"command_relaunch: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{args.rounds} rounds; substrax: 2 agents x 2 CPU devices, per_device, "
          f"--restart-backoff {args.restart_backoff}; torchrun {' '.join(TORCHRUN_FLAGS)} "
          "--rdzv_endpoint 127.0.0.1:PORT (2 processes)", flush=True)
    figures = {"substrax": [], "torchrun": []}
    for n in range(args.rounds):
        for peer in ("substrax", "torchrun"):
            work = tempfile.mkdtemp(prefix=f"command_relaunch_{peer}_")
            got = (run_substrax(bins, work, args.restart_backoff) if peer == "substrax"
                   else run_torchrun(work))
            figures[peer].append(got)
            print(f"round {n + 1} {peer}: launch_to_first_step_s={got[0]:.3f} "
                  f"relaunch_s={got[1]:.3f}", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    med = {peer: (statistics.median(f[0] for f in v), statistics.median(f[1] for f in v))
           for peer, v in figures.items()}
    for peer in ("substrax", "torchrun"):
        print(f"launch_to_first_step_s_{peer}={med[peer][0]:.3f}")
    for peer in ("substrax", "torchrun"):
        print(f"relaunch_s_{peer}={med[peer][1]:.3f}")
    print(f"relaunch_ratio_torchrun_over_substrax={med['torchrun'][1] / med['substrax'][1]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
