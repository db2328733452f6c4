"""What the Python integration tests check at their end: that no process they started outlived
them. Every process a test starts names the test's temporary directory: the coordinator and the
agents on their command lines (state and work dirs), every job process (and its own children) in
its SUBSTRAX_LAUNCH (the launch file in an agent's work dir), so one look through /proc finds any
that is left.
"""
import os
import time


def launch_file_of(pid):
    """The SUBSTRAX_LAUNCH of process `pid` (a job process's handle), or ""."""
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return ""  # gone meanwhile, or not ours to read
    for entry in environ:
        if entry.startswith(b"SUBSTRAX_LAUNCH="):
            return entry[len(b"SUBSTRAX_LAUNCH="):].decode(errors="replace")
    return ""


def processes_naming(path):
    """(pid, command line) of every process but this one whose command line or launch file
    contains `path`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().decode(errors="replace").replace("\0", " ").strip()
        except OSError:
            continue  # gone meanwhile
        if path in argv or path in launch_file_of(entry):
            found.append((int(entry), argv))
    return found


def assert_none_outlived(path, timeout_s=30):
    """Waits up to `timeout_s` for every process naming `path` to exit; AssertionError naming
    those still alive then."""
    deadline = time.monotonic() + timeout_s
    left = processes_naming(path)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_naming(path)
    if left:
        raise AssertionError("processes outlived the test:\n" +
                             "\n".join("  %d: %s" % (pid, argv) for pid, argv in left))
