"""The job of bench/command_relaunch.py, run the same way by substrax (a command job, per_device)
and by torchrun: torch.distributed over Gloo from the environment, one all-reduce (the first
step), then, in the first run only, rank 1 fails with status 3 while the others run on until
they are stopped. A process's run is the number of failures before it started ($JOB_BENCH_DIR/
failed exists or not: the restart count is not the same thing on every torchrun node). Each rank
appends "<event> <run> <rank> <time.time()>" lines to $JOB_BENCH_DIR/times: `step` once its first
all-reduce is done, `fail` right before rank 1 exits. The restarted run does its step and exits
0.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def note(event, restart, rank):
    with open(os.path.join(os.environ["JOB_BENCH_DIR"], "times"), "a") as f:
        f.write(f"{event} {restart} {rank} {time.time():.6f}\n")


def main():
    restart = 1 if os.path.exists(os.path.join(os.environ["JOB_BENCH_DIR"], "failed")) else 0
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((256,), float(rank + 1))
    dist.all_reduce(t)
    if float(t[0]) != world * (world + 1) / 2:
        raise SystemExit(f"rank {rank}: all_reduce gave {float(t[0])}")
    note("step", restart, rank)
    if restart == 0 and rank == 1:
        open(os.path.join(os.environ["JOB_BENCH_DIR"], "failed"), "w").close()
        note("fail", restart, rank)
        sys.stdout.flush()
        os._exit(3)
    if restart == 0:
        # The others wait to be stopped (as a training loop would run on), at most a minute.
        time.sleep(60)
        raise SystemExit("rank %d was not stopped after rank 1 failed" % rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
