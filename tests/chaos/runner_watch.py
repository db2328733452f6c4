#!/usr/bin/env python3
"""Watches substrax runners through /proc, for the shell chaos tests.

  runner_watch.py watch DIR OUT   samples /proc every 20 ms until SIGTERM, then writes to OUT
                                  (JSON) every runner seen whose assignment file lies under DIR:
                                  pid, job, attempt, process, first and last time seen
  runner_watch.py check OUT       exit 1, saying which, when two attempts of one job were ever
                                  alive at the same instant, or one (job, attempt, process) ran
                                  in two processes; prints a line per attempt otherwise

A runner's command line is `substrax-worker run --assignment
<work-dir>/<job>-attempt-<a>-process-<p>.assignment ...`. The network namespaces of the tests
do not separate process IDs, so one watcher sees every host's runners.
"""
import json
import os
import re
import signal
import sys
import time

ASSIGNMENT = re.compile(r"/(?P<job>[^/]+)-attempt-(?P<attempt>\d+)-process-(?P<process>\d+)\.assignment$")


def runners_under(directory):
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        args = [a.decode(errors="replace") for a in argv if a]
        if "run" not in args or "--assignment" not in args:
            continue
        i = args.index("--assignment")
        path = args[i + 1] if i + 1 < len(args) else ""
        m = ASSIGNMENT.search(path)
        if path.startswith(directory) and m:
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
