#!/usr/bin/python3
"""The cost of running a JAX script as a substrax command job, against running it by hand.

The same script (examples/python/fashion_mnist.py: the guide's data-parallel flax.nnx example,
2 processes x 2 CPU devices, global batch 128, --steps steps) runs
  - as a command job on a local cluster this benchmark starts (a coordinator and 2 agents x 2
    CPU devices, plaintext, -c opt binaries, the venv /opt/substrax/jax registered as `jax`):
    the launcher, the rendezvous, the report files tailed and forwarded, the agents' heartbeats;
  - by hand: two processes of the same venv's python with the same environment variables set
    directly (the JAX coordinator on a free port, the contract's SUBSTRAX_* settings, report
    files the script appends to and nobody reads), on the same machine, the cluster idle.
Throughput of a run: the median, over the reports after the first (which holds the compilation),
of the samples per second summed over the two processes (the coordinator's samples_per_second
series for the job; the report files by hand). ROUNDS rounds (--rounds, default 3), the two
alternating; prints each round, then each side's median and spread (min..max), and
overhead_fraction= 1 - substrax / by hand (the goal: under 0.03). Asserts no timing; exits 1 when
a run fails.
Usage: bench/python_overhead.sh [--rounds N] [--steps S]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

from bench_cluster import Cluster, binaries

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "examples", "python", "fashion_mnist.py")
PYTHON = "/opt/substrax/jax/bin/python"
DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128
REPORT_EVERY = 25


def median_rate(rates_by_step):
    """The median of the per-step rates after the first report."""
    steps = sorted(rates_by_step)[1:]
    if not steps:
        raise SystemExit("python_overhead: a run reported fewer than 2 steps")
    return statistics.median(rates_by_step[s] for s in steps)


def run_substrax(cluster, steps, n):
    spec = ("apiVersion: substrax/v1\nkind: TrainJob\n"
            f"metadata: {{name: overhead-{n}}}\nspec:\n  command:\n    python_env: jax\n"
            f"    argv: [python, {SCRIPT}, --data, {DATA}]\n"
            "    env: {OMP_NUM_THREADS: \"1\"}\n"
            f"  mesh: {{data_parallel_size: 4}}\n  batch: {{global_batch_size: {BATCH}}}\n"
            f"  steps: {steps}\n  report_every_steps: {REPORT_EVERY}\n  metrics: {{loss: mean}}\n")
    job, _ = cluster.submit(spec, f"overhead-{n}.yaml")
    ended = cluster.wait_end(job)
    if ended["state"] != "JOB_STATE_SUCCEEDED":
        raise SystemExit(f"python_overhead: job {job} ended {ended['state']}: "
                         f"{ended.get('error', '')}")
    r = cluster.ctl("metrics", job, "--name", "samples_per_second", "--reduce", "sum",
                    "-o", "json")
    series = json.loads(r.stdout)["series"][0]["points"]
    return median_rate({int(p["step"]): float(p["value"]) for p in series})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_by_hand(work, steps):
    address = f"127.0.0.1:{free_port()}"
    processes, reports = [], []
    for i in range(2):
        report = os.path.join(work, f"report-{i}.jsonl")
        reports.append(report)
        env = {"PATH": os.path.dirname(PYTHON) + ":/usr/local/bin:/usr/bin:/bin",
               "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": str(i), "JAX_NUM_CPU_DEVICES": "2", "RANK": str(i),
               "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "SUBSTRAX_JOB_ID": "by-hand", "SUBSTRAX_ATTEMPT": "1",
               "SUBSTRAX_PROCESS_INDEX": str(i), "SUBSTRAX_NUM_PROCESSES": "2",
               "SUBSTRAX_LOCAL_DEVICE_IDS": f"{2 * i},{2 * i + 1}",
               "SUBSTRAX_GLOBAL_BATCH_SIZE": str(BATCH), "SUBSTRAX_STEPS": str(steps),
               "SUBSTRAX_REPORT_EVERY_STEPS": str(REPORT_EVERY), "SUBSTRAX_SEED": "0",
               "SUBSTRAX_METRICS": "loss=mean",
               "SUBSTRAX_MESH_FILE": os.path.join(work, "mesh.json"),
               "SUBSTRAX_REPORT_FILE": report,
               "SUBSTRAX_ERROR_FILE": os.path.join(work, f"error-{i}.json")}
        log = open(os.path.join(work, f"process-{i}.log"), "w")
        processes.append(subprocess.Popen([PYTHON, SCRIPT, "--data", DATA], env=env, cwd=work,
                                          stdout=log, stderr=subprocess.STDOUT))
    for i, p in enumerate(processes):
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"python_overhead: process {i} by hand exited {p.returncode}; "
                             f"its log: {work}/process-{i}.log")
    rates = {}
    for report in reports:
        with open(report) as f:
            for line in f:
                record = json.loads(line)
                if record.get("type") == "step":
                    rates[record["step"]] = rates.get(record["step"], 0.0) + \
                        record["samples_per_second"]
    return median_rate(rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--bin-dir", required=True, help="bazel-bin of a -c opt build")
    args = parser.parse_args()
    print(f"python_overhead: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{args.rounds} rounds of {args.steps} steps, global batch {BATCH}, 2 processes x 2 "
          f"CPU devices; {SCRIPT}", flush=True)
    figures = {"substrax": [], "by_hand": []}
    with tempfile.TemporaryDirectory(prefix="python_overhead_") as work, \
            Cluster(binaries(args.bin_dir), work, [],
                    ["--allow-command-jobs", "--python-env", "jax=/opt/substrax/jax",
                     "--data-root", "/usr/share/datasets"]) as cluster:
        for n in range(args.rounds):
            figures["substrax"].append(run_substrax(cluster, args.steps, n))
            hand = os.path.join(work, f"by-hand-{n}")
            os.makedirs(hand)
            figures["by_hand"].append(run_by_hand(hand, args.steps))
            print(f"round {n + 1}: samples_per_second substrax={figures['substrax'][-1]:.0f} "
                  f"by_hand={figures['by_hand'][-1]:.0f}", flush=True)
    med = {k: statistics.median(v) for k, v in figures.items()}
    for k, v in figures.items():
        print(f"samples_per_second_{k}={med[k]:.0f} (spread {min(v):.0f}..{max(v):.0f})")
    print(f"overhead_fraction={1 - med['substrax'] / med['by_hand']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
