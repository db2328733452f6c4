"""What the Python integration tests check at their end: that no process they started outlived
them. Every process a test starts (coordinator, daemons and their runners) names the test's
temporary directory on its command line (state, work or assignment paths), so one look through
/proc finds any that is left.
"""
import os
import time


def processes_naming(path):
    """(pid, command line) of every process but this one whose command line contains `path`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().decode(errors="replace").replace("\0", " ").strip()
        except OSError:
            continue  # gone meanwhile
        if path in argv:
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
