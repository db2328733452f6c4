"""The job's facts, its reports and its error, as a command job's process gets them.

A process that substrax starts for a command job (docs/command-jobs.md) finds its place and its
settings in its environment, appends its progress to a report file, and may leave its error in
an error file. This module is that contract, typed:

    from substrax import job

    me = job.info()                         # JobInfo: rank, devices, seed, steps, directories
    for step in range(1, (me.steps or 100) + 1):
        loss = train_step()
        if step % (me.report_every_steps or 10) == 0:
            job.report(step, {"loss": loss}, samples_per_second=rate)
        if job.stop_requested():            # SIGTERM: preempted or cancelled
            save_checkpoint(step)           # then exit 0 within the grace
            sys.exit(0)
    job.report_final({"test_accuracy": acc})

Outside a job (no SUBSTRAX_REPORT_FILE), `info()` describes one local process (index 0 of 1,
the settings of any SUBSTRAX_* variable that is set) and the reports are printed to stderr, so
the same script runs by hand. Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

from substrax._errors import PermanentError, install_error_hook, record, write_error_file
from substrax._info import DeviceInfo, JobInfo, MeshInfo, in_job, info
from substrax._report import (heartbeat, report, report_checkpoint, report_final, report_resumed,
                              report_total_steps)
from substrax._stop import stop_requested

__all__ = [
    "DeviceInfo", "JobInfo", "MeshInfo", "PermanentError", "heartbeat", "in_job", "info",
    "install_error_hook", "record", "report", "report_checkpoint", "report_final",
    "report_resumed", "report_total_steps", "stop_requested", "write_error_file",
]
