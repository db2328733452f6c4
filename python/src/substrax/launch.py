"""Runs a command as a job's processes on this machine, with the same contract an agent gives
them on a cluster (docs/command-jobs.md), without the cluster:

    python -m substrax.launch -n 2 --devices-per-process 2 --steps 20 -- python train.py

starts `python train.py` twice (ranks 0 and 1, 2 CPU devices each: JAX_NUM_CPU_DEVICES), with
free local ports for torch's master and JAX's coordinator, a mesh file, and a report file and an
error file per process in a temporary attempt directory. It prints each process's output with
"[p<rank>] " before each line, and the job's progress from the report files. The first process
that fails stops the others (SIGTERM to each process group, SIGKILL after --grace seconds), its
error file (or last lines) is shown, and the launcher exits with its status; 0 when all succeed.
Ctrl-C stops every process the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Sequence

from substrax._contract import REDUCTIONS
from substrax._plan import Endpoints, Settings, check, contract_env, mesh_json, places, process_env
from substrax._ports import free_port
from substrax._progress import Progress
from substrax._supervise import Child, Supervisor, exit_status

HOST = "127.0.0.1"


class _Stopped(Exception):
    """The launcher was asked to stop (SIGINT, SIGTERM): every process is stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)


def _say(text: str) -> None:
    print(f"[launch] {text}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m substrax.launch",
        description="Run a command as a substrax job's processes on this machine.",
        epilog="Everything after -- is the command. docs/python.md#the-dev-loop")
    p.add_argument("-n", "--processes", type=int, default=1, metavar="N",
                   help="workers, one process each (default 1)")
    p.add_argument("--devices-per-process", "--devices-per-worker", type=int, default=1,
                   dest="devices", metavar="D", help="CPU devices of each worker (default 1)")
    p.add_argument("--per-device", action="store_true",
                   help="one process per device (N x D processes), as processes: per_device")
    p.add_argument("--mesh", default="", metavar="AXIS=SIZE,...",
                   help="the mesh's axes, outermost first (default: data=N*D)")
    p.add_argument("--job-id", default="local")
    p.add_argument("--seed", type=int, default=0)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int)
    length.add_argument("--epochs", type=int)
    p.add_argument("--global-batch-size", type=int)
    p.add_argument("--per-device-batch-size", type=int)
    p.add_argument("--report-every-steps", type=int)
    p.add_argument("--metric", action="append", default=[], metavar="NAME=REDUCTION",
                   help=f"a declared metric ({'/'.join(REDUCTIONS)}); repeat for more")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--resume-from")
    p.add_argument("--tensorboard-dir")
    p.add_argument("--data-root", action="append", default=[])
    p.add_argument("--checkpoint-root", action="append", default=[])
    p.add_argument("--work-dir", help="the attempt's directory (mesh, report and error files), "
                   "kept; default: a temporary one, removed at the end")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="between SIGTERM and SIGKILL when stopping the processes (default 10)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV...")
    return p


def _settings(args: argparse.Namespace) -> Settings:
    metrics: dict[str, str] = {}
    for item in args.metric:
        name, _, reduction = item.partition("=")
        if reduction not in REDUCTIONS:
            raise ValueError(f"--metric {item}: want NAME=REDUCTION, REDUCTION one of "
                             f"{', '.join(REDUCTIONS)}")
        metrics[name] = reduction
    axes: list[tuple[str, int]] = []
    for item in filter(None, args.mesh.split(",")):
        name, _, size = item.partition("=")
        if not size.isdigit():
            raise ValueError(f"--mesh {args.mesh}: {item!r} is not AXIS=SIZE")
        axes.append((name, int(size)))
    absolute = lambda path: os.path.abspath(path) if path else None  # noqa: E731
    settings = Settings(
        workers=args.processes, devices_per_worker=args.devices, per_device=args.per_device,
        job_id=args.job_id, seed=args.seed, steps=args.steps, epochs=args.epochs,
        global_batch_size=args.global_batch_size,
        per_device_batch_size=args.per_device_batch_size,
        report_every_steps=args.report_every_steps, metrics=metrics,
        checkpoint_dir=absolute(args.checkpoint_dir), resume_from=absolute(args.resume_from),
        tensorboard_dir=absolute(args.tensorboard_dir),
        data_roots=tuple(map(os.path.abspath, args.data_root)),
        checkpoint_roots=tuple(map(os.path.abspath, args.checkpoint_root)),
        mesh_axes=tuple(axes))
    check(settings)
    return settings


def _error_text(path: str) -> str | None:
    """A failed process's error file as one text (ours, or the format torch's @record writes)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"(its error file {path} is not JSON: {e})"
    message, trace = data.get("message"), data.get("traceback", "")
    if isinstance(message, dict):  # torch: {"message": {"message", "extraInfo": {...}}}
        trace = (message.get("extraInfo") or {}).get("py_callstack", "")
        message = message.get("message", "")
    retry = "" if data.get("retry", True) else " (retry: false)"
    return f"{message}{retry}\n{trace}".rstrip()


def _describe_failure(child: Child, endpoints: Endpoints) -> None:
    code = child.returncode or 0
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0
           else f"exited with status {code}")
    text = _error_text(endpoints.error_file(child.rank))
    if text is not None:
        _say(f"process {child.rank} {how}; its error file:\n{text}")
    else:
        lines = "\n".join(child.last_lines)
        _say(f"process {child.rank} {how}; its last lines:\n{lines}")


def _run(settings: Settings, argv: list[str], work_dir: str, grace: float) -> int:
    endpoints = Endpoints(host=HOST, torch_master_port=free_port(HOST),
                          jax_coordinator_port=free_port(HOST), work_dir=work_dir)
    plan = places(settings)
    # A kept --work-dir may hold an earlier run's files: this attempt starts without them.
    for place in plan:
        for path in (endpoints.report_file(place.rank), endpoints.error_file(place.rank)):
            if os.path.lexists(path):
                os.unlink(path)
    with open(endpoints.mesh_file, "w", encoding="utf-8") as f:
        f.write(mesh_json(settings, socket.gethostname()))
    progress = Progress([endpoints.report_file(p.rank) for p in plan], plan, settings.metrics,
                        _say)
    supervisor = Supervisor(sys.stdout.buffer, sys.stderr.buffer)
    started = time.monotonic()
    failed: Child | None = None
    status = 0
    try:
        for place in plan:
            env = process_env(dict(os.environ), contract_env(settings, place, endpoints))
            supervisor.start(place.rank, argv, env, cwd=None)
        done = 0
        while done < len(plan) and failed is None:
            child = supervisor.next_exit(timeout=0.2)
            progress.poll()
            if child is None:
                continue
            done += 1
            if child.returncode != 0:
                failed = child
    except _Stopped as stop:
        _say(f"{stop}: stopping every process")
        status = 128 + stop.signum
    except OSError as e:  # the command cannot be started
        _say(f"cannot start {argv[0]}: {e.strerror or e}; stopping every process")
        status = 127
    finally:
        # Every process group goes, whatever ended the loop (a failure, Ctrl-C, an error here);
        # a second Ctrl-C does not cut this short: SIGKILL follows within the grace anyway.
        _ignore_stop_signals()
        supervisor.stop_all(grace)
        supervisor.join_output(timeout_seconds=5)
    progress.finish()
    if failed is not None:
        _describe_failure(failed, endpoints)
        status = exit_status(failed.returncode or 0)
    elif status == 0:
        _say(f"{len(plan)} processes succeeded in {time.monotonic() - started:.1f} s")
    return status


def main(args: Sequence[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(args)
    argv = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not argv:
        parser.error("no command: give it after --, e.g. -- python train.py")
    try:
        settings = _settings(options)
    except ValueError as e:
        parser.error(str(e))

    def stop(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    work_dir = os.path.abspath(options.work_dir) if options.work_dir else tempfile.mkdtemp(
        prefix="substrax-launch-")
    os.makedirs(work_dir, exist_ok=True)
    try:
        return _run(settings, argv, work_dir, options.grace)
    except _Stopped as stopped:  # a signal before the processes started
        return 128 + stopped.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if not options.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
