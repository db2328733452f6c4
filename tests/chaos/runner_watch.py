#!/usr/bin/env python3
"""Watches substrax runners through /proc, for the shell chaos tests.

  runner_watch.py watch DIR OUT   samples /proc every 20 ms until SIGTERM, then writes to OUT
                                  (JSON) every job process seen whose launch file lies under DIR:
                                  pid, job, attempt, process, first and last time seen
  runner_watch.py check OUT       exit 1, saying which, when two attempts of one job were ever
                                  alive at the same instant, or one (job, attempt, process) ran
                                  in two processes; prints a line per attempt otherwise

A job process is found by its launch file, the launch contract's handle whatever it runs: its
environment has SUBSTRAX_LAUNCH=<work-dir>/<job>-attempt-<a>-process-<p>.launch, and it leads
its process group (its own children inherit the variable, not the lead). The network namespaces
of the tests do not separate process IDs, so one watcher sees every host's job processes.
"""
import json
import os
import re
import signal
import sys
import time

LAUNCH = re.compile(r"/(?P<job>[^/]+)-attempt-(?P<attempt>\d+)-process-(?P<process>\d+)\.launch$")


def launch_file_of(pid):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return ""  # gone meanwhile
    for entry in environ:
        if entry.startswith(b"SUBSTRAX_LAUNCH="):
            return entry[len(b"SUBSTRAX_LAUNCH="):].decode(errors="replace")
    return ""


def leads_its_group(pid):
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[2] == str(pid)  # state, ppid, pgrp


def runners_under(directory):
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        path = launch_file_of(entry)
        m = LAUNCH.search(path)
        if path.startswith(directory) and m and leads_its_group(entry):
            found[int(entry)] = (m.group("job"), int(m.group("attempt")), int(m.group("process")))
    return found


def watch(directory, out):
    seen = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        now = time.monotonic()
        for pid, (job, attempt, process) in runners_under(directory).items():
            r = seen.setdefault(pid, {"pid": pid, "job": job, "attempt": attempt,
                                      "process": process, "first": now})
            r["last"] = now
        time.sleep(0.02)
    with open(out + ".tmp", "w") as f:
        json.dump(sorted(seen.values(), key=lambda r: r["first"]), f, indent=1)
    os.rename(out + ".tmp", out)


def check(out):
    runners = json.load(open(out))
    errors = []
    by_key = {}
    for r in runners:
        by_key.setdefault((r["job"], r["attempt"], r["process"]), []).append(r["pid"])
    for key, pids in sorted(by_key.items()):
        if len(pids) > 1:
            errors.append("job %s attempt %d process %d ran in %d processes: %s" % (key + (len(pids), pids)))
    for a in runners:
        for b in runners:
            if (a["job"] == b["job"] and a["attempt"] < b["attempt"]
                    and a["first"] <= b["last"] and b["first"] <= a["last"]):
                errors.append("job %s: attempt %d (pid %d) and attempt %d (pid %d) were alive at once"
                              % (a["job"], a["attempt"], a["pid"], b["attempt"], b["pid"]))
    start = min((r["first"] for r in runners), default=0)
    for r in runners:
        print("runner_watch: job %s attempt %d process %d pid %d alive %.2f-%.2f s"
              % (r["job"], r["attempt"], r["process"], r["pid"], r["first"] - start, r["last"] - start))
    for e in errors:
        print("runner_watch: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        watch(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    else:
        sys.exit(__doc__)
