"""SIGTERM as a request to stop (docs/command-jobs.md, "Preemption").

The agent stops an attempt's processes with SIGTERM, then SIGKILL after a grace period (the
agent's --stop-grace, or a preemption's longer one). A process that asked `stop_requested()`
once no longer dies of SIGTERM: the signal only sets a flag, and the training loop, checking it
at each step, writes a checkpoint and exits 0 before the grace ends.
"""

from __future__ import annotations

import signal
import threading

_received = threading.Event()
_installed = False
_install_lock = threading.Lock()


def _on_sigterm(signum, frame) -> None:
    # Every SIGTERM only sets the flag: a worker under torchrun gets the agent's (its process
    # group's) and torchrun's own, and the second must not kill it in the middle of its
    # checkpoint. SIGKILL after the grace ends a process that never stops.
    del signum, frame
    _received.set()


def stop_requested() -> bool:
    """True once this process got SIGTERM (the agent stops or preempts the job).

    The first call installs the SIGTERM handler, and must come from the main thread (Python runs
    signal handlers there only); call it once at the start, then anywhere. Raises RuntimeError
    when the first call comes from another thread.
    """
    global _installed
    if not _installed:
        with _install_lock:
            if not _installed:
                if threading.current_thread() is not threading.main_thread():
                    raise RuntimeError(
                        "substrax.job.stop_requested() installs a SIGTERM handler, which Python "
                        "allows from the main thread only: call it once from the main thread "
                        "first (at the start of the script)")
                signal.signal(signal.SIGTERM, _on_sigterm)
                _installed = True
    return _received.is_set()
