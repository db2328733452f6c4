"""The launcher's view of the report files: it tails each process's file, and prints a step once
every device has reported it, each metric reduced across the devices as declared, as the
coordinator does for a cluster's job (`substraxctl watch`)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from substrax._plan import Place

# As the agent's reader: lines over 64 KiB are skipped, and after 100 warnings only counted.
MAX_LINE_BYTES = 64 * 1024
MAX_WARNINGS = 100


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


class ReportTail:
    """Reads the whole lines appended to one report file since the last call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.line = 0  # lines read so far

    def read(self) -> list[tuple[int, dict[str, Any] | str]]:
        """(line number, record) for each new whole line, or (line number, why it is skipped)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out: list[tuple[int, dict[str, Any] | str]] = []
        for raw in lines:
            self.line += 1
            out.append((self.line, _parse(raw)))
        return out


def _parse(raw: bytes) -> dict[str, Any] | str:
    if len(raw) > MAX_LINE_BYTES:
        return f"a line of {len(raw)} bytes, over {MAX_LINE_BYTES}"
    try:
        record = json.loads(raw.rstrip(b"\r"), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        return f"not JSON: {e}"
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        return "not a JSON object with a string 'type'"
    if record["type"] == "step":
        if not isinstance(record.get("step"), int) or not isinstance(record.get("metrics"), dict):
            return "a step record needs an integer 'step' and an object 'metrics'"
        for name, value in record["metrics"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"a step record: metric {name!r} is not a number"
    return record


@dataclass
class _Step:
    values: dict[int, dict[str, float]] = field(default_factory=dict)  # device -> metrics
    rate: float = 0.0


def reduce_values(reduction: str, values: list[float]) -> str:
    """One metric across devices, as `--metric NAME=REDUCTION` declares (default mean)."""
    if reduction == "none":
        return f"{min(values):.6g}..{max(values):.6g}" if len(values) > 1 else f"{values[0]:.6g}"
    reduce: Callable[[list[float]], float] = {
        "mean": statistics.fmean, "sum": math.fsum, "max": max, "min": min}[reduction]
    return f"{reduce(values):.6g}"


class Progress:
    """Collects the processes' records and prints what a user follows: complete steps, the
    total steps, checkpoints and resumption (process 0's), final metrics at the end."""

    def __init__(self, report_files: list[str], places: list[Place], metrics: dict[str, str],
                 emit: Callable[[str], None]) -> None:
        self._tails = [ReportTail(path) for path in report_files]
        self._places = places
        self._metrics = metrics
        self._emit = emit
        self._devices = sum(len(p.device_ids) for p in places)
        self._steps: dict[int, _Step] = {}
        self._total_steps: int | None = None
        self._final: dict[str, float] = {}
        self._events: list[tuple[int, str]] = []  # (step, line) waiting for that step's line
        self._warnings = 0
        self.skipped = 0

    def poll(self) -> None:
        """Reads what the files gained and prints the steps it completes."""
        for tail, place in zip(self._tails, self._places):
            for line, record in tail.read():
                if isinstance(record, str):
                    self._skip(f"report file {tail.path} line {line}: skipped: {record}")
                else:
                    self._take(place, record)
        for number in sorted(self._steps):
            if len(self._steps[number].values) >= self._devices:
                self._print_step(number, self._steps.pop(number))
        self._flush_events(min(self._steps, default=None))

    def _flush_events(self, pending: int | None) -> None:
        """Prints the checkpoint and resumption lines of the steps before `pending` (the
        first step not yet printed; None: all), so they come after the steps they follow."""
        keep = []
        for step, text in self._events:
            if pending is None or step < pending:
                self._emit(text)
            else:
                keep.append((step, text))
        self._events = keep

    def finish(self) -> dict[str, float]:
        """Prints the steps some device never reported (partial) and the final metrics; returns
        the final metrics."""
        self.poll()
        for number in sorted(self._steps):
            self._print_step(number, self._steps.pop(number))
        self._flush_events(None)
        if self._final:
            self._emit("final: " + " ".join(f"{k}={v:.6g}" for k, v in self._final.items()))
        if self.skipped:
            self._emit(f"{self.skipped} report lines skipped")
        return dict(self._final)

    def _skip(self, warning: str) -> None:
        self.skipped += 1
        self._warnings += 1
        if self._warnings <= MAX_WARNINGS:
            self._emit(warning)
        if self._warnings == MAX_WARNINGS:
            self._emit(f"{MAX_WARNINGS} warnings: further skipped lines are only counted")

    def _take(self, place: Place, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "step":
            step = self._steps.setdefault(record["step"], _Step())
            device = record.get("device")
            devices = [device] if isinstance(device, int) else list(place.device_ids)
            for d in devices:
                step.values[d] = {k: float(v) for k, v in record["metrics"].items()}
            rate = record.get("samples_per_second")
            if isinstance(rate, (int, float)):
                step.rate += float(rate)
        elif kind == "total_steps" and isinstance(record.get("total_steps"), int):
            self._total_steps = record["total_steps"]
        elif kind == "final" and isinstance(record.get("metrics"), dict):
            self._final.update(record["metrics"])
        elif kind in ("checkpoint", "resumed") and place.rank == 0:
            where = f": {record['path']}" if record.get("path") else ""
            what = "checkpoint of" if kind == "checkpoint" else "resumed from"
            step = record.get("step")
            self._events.append((step if isinstance(step, int) else 0,
                                 f"{what} step {step}{where}"))

    def _print_step(self, number: int, step: _Step) -> None:
        names = sorted({name for values in step.values.values() for name in values})
        parts = []
        for name in names:
            values = [v[name] for v in step.values.values() if name in v]
            parts.append(f"{name}={reduce_values(self._metrics.get(name, 'mean'), values)}")
        total = f"/{self._total_steps}" if self._total_steps else ""
        text = f"step {number}{total}: {' '.join(parts)}"
        if step.rate:
            text += f" ({step.rate:.1f} samples/s)"
        if len(step.values) < self._devices:
            text += f" (partial: {len(step.values)} of {self._devices} devices)"
        self._emit(text)
