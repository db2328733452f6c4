"""A PyTorch program as a command job runs it, unchanged whether substrax starts one process per
device (`processes: per_device`) or torchrun does (`argv: [torchrun, this]`, `per_worker`): plain
torch.distributed over Gloo from the environment (init_method="env://"). Rank r contributes
r + 1 to an all-reduce (sum), which must give 1 + 2 + ... + world size. Each rank reports step 1
in the report file: its contribution (declared `sum` in the test's spec) and the all-reduced
value (`max`); rank 0 reports a final metric. The device a rank drives: its only local device
per_device; under torchrun, the LOCAL_RANK-th of SUBSTRAX_LOCAL_DEVICE_IDS (torchrun's workers
share their worker's report file, so each says which device it speaks for).
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist


def report(record):
    # One write per line: several ranks may append to one file (O_APPEND).
    with open(os.environ["SUBSTRAX_REPORT_FILE"], "a") as f:
        f.write(json.dumps(record) + "\n")


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    devices = [int(d) for d in os.environ["SUBSTRAX_LOCAL_DEVICE_IDS"].split(",")]
    dist.init_process_group(backend="gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    want = world * (world + 1) / 2
    if not torch.all(t == want):
        raise SystemExit(f"rank {rank}: all_reduce gave {t[:4].tolist()}..., want {want}")
    record = {"type": "step", "step": 1,
              "metrics": {"contribution": rank + 1, "allreduced": float(t[0])}}
    if len(devices) > 1:
        record["device"] = devices[local_rank]
    report({"type": "total_steps", "total_steps": 1})
    report(record)
    if rank == 0:
        report({"type": "final", "metrics": {"world_size": world}})
    dist.destroy_process_group()
    # On stderr, which the test's torchrun tees to the job's log (--tee=2).
    print(f"OK rank {rank} of {world}: all_reduce = {want}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
