"""The launcher's processes: started each in a process group of its own, their output relayed
line by line with a "[p<rank>] " prefix, their exits reported in the order they happen, and all
of them stopped together (SIGTERM to each group, SIGKILL after a grace), children included."""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO

# Lines of each process's output kept for the error of a process without an error file, as the
# agent keeps them.
LAST_LINES = 20


@dataclass
class Child:
    """One started process."""

    rank: int
    popen: subprocess.Popen[bytes]
    last_lines: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=LAST_LINES))
    relays: list[threading.Thread] = field(default_factory=list)
    returncode: int | None = None


class Supervisor:
    """Starts processes and hands their exits out in order (`next_exit`)."""

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self._out = {"stdout": stdout, "stderr": stderr}
        self._write_lock = threading.Lock()
        self._exits: queue.Queue[Child] = queue.Queue()
        self.children: list[Child] = []

    def start(self, rank: int, argv: list[str], env: dict[str, str], cwd: str | None) -> Child:
        """Starts argv in a new session (its own process group, no controlling terminal: a
        Ctrl-C reaches the launcher alone, which stops everyone)."""
        popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        child = Child(rank=rank, popen=popen)
        for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            assert pipe is not None
            thread = threading.Thread(target=self._relay, args=(child, pipe, self._out[name]),
                                      name=f"p{rank}-{name}", daemon=True)
            thread.start()
            child.relays.append(thread)
        threading.Thread(target=self._wait, args=(child,), name=f"p{rank}-wait",
                         daemon=True).start()
        self.children.append(child)
        return child

    def next_exit(self, timeout: float) -> Child | None:
        """The next process to exit (its returncode set), or None after `timeout` seconds."""
        try:
            return self._exits.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop_all(self, grace_seconds: float) -> None:
        """SIGTERM to every process group, SIGKILL to each after `grace_seconds`; returns once
        every started process has exited. Groups whose leader already exited are killed too:
        a child it left behind still belongs to it."""
        for child in self.children:
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for child in self.children:
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in self.children:
            _signal_group(child, signal.SIGKILL)
        for child in self.children:
            child.popen.wait()

    def join_output(self, timeout_seconds: float) -> None:
        """Waits for the relays to reach the end of each pipe (a stray process that escaped
        its group may hold one open: then it gives up after `timeout_seconds`)."""
        deadline = time.monotonic() + timeout_seconds
        for child in self.children:
            for thread in child.relays:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _wait(self, child: Child) -> None:
        child.returncode = child.popen.wait()
        self._exits.put(child)

    def _relay(self, child: Child, pipe: BinaryIO, out: BinaryIO) -> None:
        prefix = f"[p{child.rank}] ".encode()
        with pipe:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                child.last_lines.append(line.decode(errors="replace").rstrip("\n"))
                with self._write_lock:
                    out.write(prefix + line)
                    out.flush()


def _signal_group(child: Child, signum: int) -> None:
    try:
        os.killpg(child.popen.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone (PermissionError: on some systems, a group of zombies)


def exit_status(returncode: int) -> int:
    """A shell's exit status for a Popen returncode: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
