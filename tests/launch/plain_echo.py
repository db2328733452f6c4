#!/usr/bin/env python3
"""A plain executable for //tests/launch:launch_contract_test: no SDK, only the launch contract.
It reads the launch file SUBSTRAX_LAUNCH names (JSON with the proto's field names), writes back
what it read in the line format every job process logs, and says it joined its job by creating
the launch's started_path."""
import json
import os

with open(os.environ["SUBSTRAX_LAUNCH"]) as f:
    launch = json.load(f)
a = launch["assignment"]
print("plain: job %s attempt %d process %d of %d, devices %s, rendezvous %s, result %s" % (
    a["job_id"], a.get("attempt", 0), a.get("process_index", 0), a.get("num_processes", 0),
    ",".join(str(d) for d in a.get("local_device_ids", [])), a.get("rendezvous_prefix", ""),
    launch["result_path"]), flush=True)
open(launch["started_path"], "w").close()
