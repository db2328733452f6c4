"""The GPU check's command job (tests/gpu/run.sh, step 8): one PyTorch process started by a
substrax agent as a command job (docs/command-jobs.md). It checks that the agent handed it the
GPU it was scheduled on (CUDA_VISIBLE_DEVICES, the torchrun variables), multiplies two matrices
there, reports one step and its final metrics through $SUBSTRAX_REPORT_FILE, and prints what it
saw. --device cpu runs the same on the CPU (run.sh's self-test of the step on a machine without
a GPU).
"""
import argparse
import json
import os
import sys

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                           "MASTER_PORT", "CUDA_VISIBLE_DEVICES")}
    if seen["RANK"] != "0" or seen["WORLD_SIZE"] != "1":
        sys.exit(f"torch_command_job: expected rank 0 of 1, got {seen}")
    if args.device == "cuda":
        if not seen["CUDA_VISIBLE_DEVICES"]:
            sys.exit("torch_command_job: the agent set no CUDA_VISIBLE_DEVICES")
        if not torch.cuda.is_available() or torch.cuda.device_count() != 1:
            sys.exit(f"torch_command_job: PyTorch sees {torch.cuda.device_count()} GPUs with "
                     f"CUDA_VISIBLE_DEVICES={seen['CUDA_VISIBLE_DEVICES']}, want exactly 1")
        name = torch.cuda.get_device_name(0)
    else:
        name = "cpu"
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, device=args.device)
    # x @ x.T is symmetric positive semi-definite: its trace is the sum of squares of x.
    trace = torch.trace(x @ x.T).item()
    want = (x * x).sum().item()
    if abs(trace - want) > 1e-3 * want:
        sys.exit(f"torch_command_job: trace {trace} != sum of squares {want}")
    with open(os.environ["SUBSTRAX_REPORT_FILE"], "a") as report:
        report.write(json.dumps({"type": "total_steps", "total_steps": 1}) + "\n")
        report.write(json.dumps({"type": "step", "step": 1, "metrics": {"loss": 0.0}}) + "\n")
        report.write(json.dumps({"type": "final", "metrics": {"trace": trace}}) + "\n")
    print(f"torch_command_job: device={name} torch={torch.__version__} "
          f"cuda_visible_devices={seen['CUDA_VISIBLE_DEVICES']} trace={trace:.1f} ok", flush=True)


if __name__ == "__main__":
    main()
