"""Writing the report file (docs/launch.md, "The report file"): one JSON object a line.

Each record is checked against the reader's limits before it is written, so that what the agent
would skip with a warning in the job's log fails here instead, at the call that made it: a
ValueError naming the metric, step or path. Each line goes out in one write(2) to the file
opened with O_APPEND, so processes that share a file (torchrun's workers) never interleave.
Outside a job the records are printed to stderr as one compact line each.
"""

from __future__ import annotations

import json
import math
import operator
import os
import sys
import threading
from typing import Any, Mapping

from substrax._info import JobInfo, info

# The reader's limits (contract/report_file.h), which are the coordinator's.
MAX_METRIC_NAME_BYTES = 256
MAX_METRICS = 64
MAX_PATH_BYTES = 4096
MAX_INTEGER = 1 << 53
MAX_LINE_BYTES = 64 * 1024
# A step's own fields, kept by the coordinator under these names: not metrics.
RESERVED_METRIC_NAMES = frozenset(
    {"samples_per_second", "data_wait_seconds", "compute_seconds", "collective_seconds"})

# Outside a job: the total steps last reported, for "step 10/100" on stderr.
_local_total_steps: int | None = None
_lock = threading.Lock()


def report(step: int, metrics: Mapping[str, Any], samples_per_second: float | None = None,
           device: int | None = None) -> None:
    """Reports one step's metrics (numbers: Python, numpy or JAX scalars).

    `device` is the mesh device the values are for; without it they are the process's, for
    every device it drives, except in a torchrun worker that shares its worker's devices
    (LOCAL_WORLD_SIZE of them): its own, SUBSTRAX_LOCAL_DEVICE_IDS[LOCAL_RANK].
    ValueError: a value that is not a finite number (naming the metric), a reserved or too long
    name, too many metrics, a step outside [0, 2^53], a device the process does not drive.
    """
    me = info()
    record: dict[str, Any] = {"type": "step", "step": _integer("step", step),
                              "metrics": _metrics(metrics, "report")}
    if samples_per_second is not None:
        rate = _number("samples_per_second", samples_per_second)
        if rate < 0:
            raise ValueError(f"samples_per_second={rate} is negative")
        record["samples_per_second"] = rate
    ids = me.local_device_ids
    if device is None and len(ids) > 1 and me.local_world_size == len(ids):
        device = ids[me.local_rank]
        record["process"] = me.rank
    if device is not None:
        device = _integer("device", device)
        if me.in_job and device not in ids:
            raise ValueError(f"device {device} is not one of this process's devices "
                             f"(SUBSTRAX_LOCAL_DEVICE_IDS={','.join(map(str, ids))})")
        record["device"] = device
    _emit(me, record)


def report_total_steps(total_steps: int) -> None:
    """Says how many steps the attempt will run (the progress bar's end)."""
    global _local_total_steps
    total = _integer("total_steps", total_steps)
    _emit(info(), {"type": "total_steps", "total_steps": total})
    _local_total_steps = total


def report_final(metrics: Mapping[str, Any]) -> None:
    """Reports final metrics (test accuracy...); a later call replaces the names it repeats."""
    _emit(info(), {"type": "final", "metrics": _metrics(metrics, "report_final")})


def report_checkpoint(step: int, path: str | os.PathLike[str],
                      size_bytes: int | None = None) -> None:
    """Reports a committed checkpoint of `step` at `path` (made absolute). Only process 0's are
    listed (`substraxctl checkpoints`); the others' are accepted and ignored."""
    record: dict[str, Any] = {"type": "checkpoint", "step": _integer("step", step),
                              "path": _path(path)}
    if size_bytes is not None:
        record["size_bytes"] = _integer("size_bytes", size_bytes)
    _emit(info(), record)


def report_resumed(step: int, path: str | os.PathLike[str] | None = None) -> None:
    """Reports where this attempt resumed from: the checkpoint of `step` (0: the beginning), for
    `substraxctl get`'s "resumed from the checkpoint of step N"."""
    record: dict[str, Any] = {"type": "resumed", "step": _integer("step", step)}
    if path is not None:
        record["path"] = _path(path)
    _emit(info(), record)


def heartbeat() -> None:
    """Says the process is alive between steps (a long evaluation, a slow first compile)."""
    _emit(info(), {"type": "heartbeat"})


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not an integer")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} is not an integer") from None
    if not 0 <= number <= MAX_INTEGER:
        raise ValueError(f"{name}={number} is outside [0, 2^53]")
    return number


def _number(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} is {number}, not a finite number: JSON has no NaN or "
                         f"Infinity, and the report file refuses them")
    return number


def _metrics(metrics: Mapping[str, Any], call: str) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise ValueError(f"{call}: metrics must be a mapping of name to number, not "
                         f"{type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise ValueError(f"{call}: {len(metrics)} metrics, more than the limit of {MAX_METRICS}")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not 1 <= len(name.encode()) <= MAX_METRIC_NAME_BYTES:
            raise ValueError(f"{call}: metric name {name!r}: a string of 1 to "
                             f"{MAX_METRIC_NAME_BYTES} bytes")
        if call == "report" and name in RESERVED_METRIC_NAMES:
            raise ValueError(f"{call}: metric {name!r} is a step's own field, not a metric"
                             + ("; pass samples_per_second=" if name == "samples_per_second"
                                else ""))
        out[name] = _number(f"metric {name!r}", value)
    return out


def _path(path: str | os.PathLike[str]) -> str:
    absolute = os.path.abspath(os.fspath(path))
    if len(absolute.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"path {absolute[:80]!r}... is over {MAX_PATH_BYTES} bytes")
    return absolute


def _emit(me: JobInfo, record: dict[str, Any]) -> None:
    """Appends the record to the report file in one write, or prints it outside a job."""
    if not me.in_job:
        _print_local(record)
        return
    assert me.report_file is not None  # in_job means the report file is set
    line = (json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n").encode()
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"a {record['type']} record of {len(line)} bytes is over the report "
                         f"file's {MAX_LINE_BYTES}-byte line limit")
    fd = os.open(me.report_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        written = os.write(fd, line)
    finally:
        os.close(fd)
    if written != len(line):
        raise OSError(f"{me.report_file}: wrote {written} of {len(line)} bytes (disk full?)")


def _format_values(values: Mapping[str, float]) -> str:
    return " ".join(f"{name}={value:.6g}" for name, value in values.items())


def _print_local(record: dict[str, Any]) -> None:
    kind = record["type"]
    if kind == "step":
        total = f"/{_local_total_steps}" if _local_total_steps else ""
        text = f"step {record['step']}{total}: {_format_values(record['metrics'])}"
        if "samples_per_second" in record:
            text += f" ({record['samples_per_second']:.1f} samples/s)"
    elif kind == "final":
        text = f"final: {_format_values(record['metrics'])}"
    elif kind == "checkpoint":
        text = f"checkpoint of step {record['step']}: {record['path']}"
    elif kind == "resumed":
        text = f"resumed from step {record['step']}" + (
            f": {record['path']}" if "path" in record else "")
    else:  # total_steps, heartbeat: nothing worth a line
        return
    with _lock:
        print(text, file=sys.stderr, flush=True)
