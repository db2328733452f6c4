"""A command job that can be preempted (tests/chaos/preemption_test.cc): it counts steps, reports
every JOB_REPORT_EVERY of them through `substrax.job`, and, asked to stop (SIGTERM, which
`job.stop_requested()` turns into a flag), writes a checkpoint of the step it reached (process
0, taking JOB_STOP_SECONDS, as a large model's would) and exits. It resumes from the newest
checkpoint in its checkpoint directory."""

import json
import os
import sys
import time

from substrax import job

me = job.info()
ckpt_dir = me.checkpoint_dir
report_every = int(os.environ.get("JOB_REPORT_EVERY", "10"))
stop_seconds = float(os.environ.get("JOB_STOP_SECONDS", "0"))


def newest_checkpoint():
    os.makedirs(ckpt_dir, exist_ok=True)
    steps = [int(name[len("step-"):]) for name in os.listdir(ckpt_dir)
             if name.startswith("step-") and name[len("step-"):].isdigit()]
    return max(steps, default=0)


step = newest_checkpoint()
if step > 0:
    job.report_resumed(step, os.path.join(ckpt_dir, f"step-{step}"))
    print(f"process {me.process_index}: resumed from the checkpoint of step {step}", flush=True)
while step < me.steps:
    if job.stop_requested():
        if me.is_main:
            time.sleep(stop_seconds)
            path = os.path.join(ckpt_dir, f"step-{step}")
            staging = path + ".staging"
            os.makedirs(staging, exist_ok=True)
            with open(os.path.join(staging, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            os.rename(staging, path)
            job.report_checkpoint(step, path)
        print(f"process {me.process_index}: stopped at step {step} (SIGTERM): checkpoint written",
              flush=True)
        sys.exit(143)
    time.sleep(0.02)
    step += 1
    if step % report_every == 0 or step == me.steps:
        job.report(step, {"loss": 1.0 / step})
job.report_final({"steps": step})
