"""The contract's facts for one process, typed: `substrax.job.info()` (docs/command-jobs.md,
"The environment contract"). Only the standard library."""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from substrax._contract import REDUCTIONS

# The variable whose presence means "a job's process": the launcher reads this file.
_IN_JOB_VARIABLE = "SUBSTRAX_REPORT_FILE"
_CONTRACT_DOC = "docs/command-jobs.md"


@dataclass(frozen=True)
class DeviceInfo:
    """One device of the attempt's mesh (proto substrax.v1.Device)."""

    id: int
    host: str
    worker_id: str
    local_index: int
    kind: str  # "DEVICE_KIND_CPU", "DEVICE_KIND_CUDA"
    name: str
    memory_bytes: int
    pci_bus_id: str


@dataclass(frozen=True)
class MeshInfo:
    """The attempt's mesh (proto substrax.v1.Mesh): named axes, their sizes, and the devices in
    row-major order of the grid."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    devices: tuple[DeviceInfo, ...]

    def axis_size(self, name: str) -> int:
        """The size of the axis `name`; ValueError naming it when the mesh has no such axis."""
        if name not in self.axis_names:
            raise ValueError(f"the mesh has no axis {name!r}; its axes: {list(self.axis_names)}")
        return self.shape[self.axis_names.index(name)]


@dataclass(frozen=True)
class JobInfo:
    """What a job's process knows about itself, from the contract's variables.

    `process_index`/`num_processes` are substrax's processes (SUBSTRAX_PROCESS_INDEX, equal to
    JAX_PROCESS_ID: what `jax.distributed` wants). `rank`, `world_size`, `local_rank` and
    `local_world_size` are torch's view (RANK, ...): the same numbers, unless a torchrun that the
    job runs started workers of its own, which then see torchrun's.
    """

    in_job: bool
    job_id: str
    attempt: int
    restart_count: int  # TORCHELASTIC_RESTART_COUNT: restarts before this attempt
    max_restarts: int
    process_index: int
    num_processes: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int  # the worker's index among the attempt's workers
    local_device_ids: tuple[int, ...]  # mesh ids of the devices this process drives
    seed: int
    global_batch_size: int | None
    per_device_batch_size: int | None
    steps: int | None
    epochs: int | None
    report_every_steps: int | None
    metrics: Mapping[str, str]  # declared metric -> reduction ("mean", "sum", ...)
    checkpoint_dir: str | None
    resume_from: str | None
    tensorboard_dir: str | None
    data_roots: tuple[str, ...]
    checkpoint_roots: tuple[str, ...]
    master_addr: str | None
    master_port: int | None
    jax_coordinator_address: str | None
    num_cpu_devices: int | None  # JAX_NUM_CPU_DEVICES (CPU workers)
    cuda_visible_devices: tuple[str, ...]
    mesh_file: str | None
    report_file: str | None
    error_file: str | None

    @property
    def is_main(self) -> bool:
        """Whether this is process 0, the one whose checkpoint records count."""
        return self.process_index == 0

    @functools.cached_property
    def mesh(self) -> MeshInfo | None:
        """The attempt's mesh, read from SUBSTRAX_MESH_FILE on first use (None without one)."""
        return _read_mesh(self.mesh_file) if self.mesh_file else None


def in_job(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started as a job's process (by an agent or substrax.launch)."""
    return _IN_JOB_VARIABLE in (os.environ if environ is None else environ)


def info(environ: Mapping[str, str] | None = None) -> JobInfo:
    """The contract's facts for this process, from `environ` (default: os.environ).

    Raises ValueError naming the variable when one holds what the contract never sets (not a
    number, a relative path, an unknown reduction, a rank outside its count) or, in a job, when
    one the contract always sets is missing.
    """
    env = _Env(os.environ if environ is None else environ)
    if env.in_job:
        place = _job_place(env)
    else:
        place = _local_place(env)
    return JobInfo(
        in_job=env.in_job,
        **place,
        seed=env.integer("SUBSTRAX_SEED", minimum=0, default=0),
        global_batch_size=env.integer("SUBSTRAX_GLOBAL_BATCH_SIZE", minimum=1),
        per_device_batch_size=env.integer("SUBSTRAX_PER_DEVICE_BATCH_SIZE", minimum=1),
        steps=env.integer("SUBSTRAX_STEPS", minimum=1),
        epochs=env.integer("SUBSTRAX_EPOCHS", minimum=1),
        report_every_steps=env.integer("SUBSTRAX_REPORT_EVERY_STEPS", minimum=1),
        metrics=MappingProxyType(_metrics(env)),
        checkpoint_dir=env.path("SUBSTRAX_CHECKPOINT_DIR"),
        resume_from=env.path("SUBSTRAX_RESUME_FROM"),
        tensorboard_dir=env.path("SUBSTRAX_TENSORBOARD_DIR"),
        data_roots=env.roots("SUBSTRAX_DATA_ROOTS"),
        checkpoint_roots=env.roots("SUBSTRAX_CHECKPOINT_ROOTS"),
        num_cpu_devices=env.integer("JAX_NUM_CPU_DEVICES", minimum=1),
        cuda_visible_devices=tuple(d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",")
                                   if d.strip()),
    )


class _Env:
    """Typed reads of the contract's variables; each refusal names the variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.in_job = in_job(environ)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.environ.get(name, default)

    def fail(self, name: str, value: str, want: str) -> ValueError:
        """The error for a value of `name` the contract never sets."""
        return ValueError(f"{name}={value!r}: {want} ({_CONTRACT_DOC} says what it holds)")

    def required(self, name: str) -> str:
        value = self.environ.get(name)
        if value is None:
            raise ValueError(f"{name} is not set, but {_IN_JOB_VARIABLE} is: a job's process "
                             f"always has it ({_CONTRACT_DOC}); start the process with "
                             f"`substrax.launch` or as a command job")
        return value

    def integer(self, name: str, *, minimum: int, default: int | None = None,
                required: bool = False) -> int | None:
        value = self.required(name) if required else self.environ.get(name)
        if value is None or (value == "" and not required):
            return default
        try:
            number = int(value, 10)
        except ValueError:
            raise self.fail(name, value, "not an integer") from None
        if number < minimum:
            raise self.fail(name, value, f"less than {minimum}")
        return number

    def path(self, name: str, *, required: bool = False) -> str | None:
        value = self.required(name) if required else self.environ.get(name)
        if not value:
            return None
        if not os.path.isabs(value):
            raise self.fail(name, value, "not an absolute path")
        return value

    def roots(self, name: str) -> tuple[str, ...]:
        value = self.environ.get(name) or ""
        roots = tuple(r for r in value.split(":") if r)
        for root in roots:
            if not os.path.isabs(root):
                raise self.fail(name, value, f"the root {root!r} is not an absolute path")
        return roots

    def device_ids(self, name: str) -> tuple[int, ...]:
        value = self.required(name)
        try:
            ids = tuple(int(d, 10) for d in value.split(","))
        except ValueError:
            raise self.fail(name, value, "not a comma-separated list of device ids") from None
        if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise self.fail(name, value, "device ids are distinct integers >= 0")
        return ids


def _index_in(env: _Env, index_name: str, count_name: str) -> tuple[int, int]:
    count = env.integer(count_name, minimum=1, required=True)
    index = env.integer(index_name, minimum=0, required=True)
    if index >= count:
        raise ValueError(f"{index_name}={index} is not less than {count_name}={count}; the "
                         f"contract ({_CONTRACT_DOC}) gives each process an index in [0, count)")
    return index, count


def _job_place(env: _Env) -> dict[str, Any]:
    """Where a job's process stands: every variable that a job always has must be there."""
    process_index, num_processes = _index_in(env, "SUBSTRAX_PROCESS_INDEX",
                                             "SUBSTRAX_NUM_PROCESSES")
    for name, twin, want in (("JAX_PROCESS_ID", "SUBSTRAX_PROCESS_INDEX", process_index),
                             ("JAX_NUM_PROCESSES", "SUBSTRAX_NUM_PROCESSES", num_processes)):
        got = env.integer(name, minimum=0)
        if got is not None and got != want:
            raise ValueError(f"{name}={got} differs from {twin}={want}; the contract sets "
                             f"both alike: something else changed {name}")
    rank, world_size = _index_in(env, "RANK", "WORLD_SIZE")
    local_rank, local_world_size = _index_in(env, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    port = env.integer("MASTER_PORT", minimum=1)
    if port is not None and port > 65535:
        raise env.fail("MASTER_PORT", str(port), "not a port (1..65535)")
    return dict(
        job_id=env.required("SUBSTRAX_JOB_ID"),
        attempt=env.integer("SUBSTRAX_ATTEMPT", minimum=1, required=True),
        restart_count=env.integer("TORCHELASTIC_RESTART_COUNT", minimum=0, default=0),
        max_restarts=env.integer("TORCHELASTIC_MAX_RESTARTS", minimum=0, default=0),
        process_index=process_index, num_processes=num_processes,
        rank=rank, world_size=world_size, local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=env.integer("GROUP_RANK", minimum=0, default=process_index),
        local_device_ids=env.device_ids("SUBSTRAX_LOCAL_DEVICE_IDS"),
        master_addr=env.get("MASTER_ADDR") or None, master_port=port,
        jax_coordinator_address=env.get("JAX_COORDINATOR_ADDRESS") or None,
        mesh_file=env.path("SUBSTRAX_MESH_FILE", required=True),
        report_file=env.path("SUBSTRAX_REPORT_FILE", required=True),
        error_file=env.path("SUBSTRAX_ERROR_FILE", required=True),
    )


def _local_place(env: _Env) -> dict[str, Any]:
    """One process alone, outside any job: index 0 of 1, driving JAX_NUM_CPU_DEVICES devices
    (default 1), with no peers, mesh, report or error file."""
    devices = env.integer("JAX_NUM_CPU_DEVICES", minimum=1, default=1)
    return dict(
        job_id="local", attempt=1, restart_count=0, max_restarts=0,
        process_index=0, num_processes=1, rank=0, world_size=1, local_rank=0,
        local_world_size=1, node_rank=0, local_device_ids=tuple(range(devices)),
        master_addr=None, master_port=None, jax_coordinator_address=None,
        mesh_file=None, report_file=None, error_file=None,
    )


def _metrics(env: _Env) -> dict[str, str]:
    """SUBSTRAX_METRICS ("accuracy=mean,loss=mean") as {name: reduction}."""
    value = env.get("SUBSTRAX_METRICS") or ""
    declared: dict[str, str] = {}
    for part in filter(None, value.split(",")):
        name, sep, reduction = part.partition("=")
        if not sep or not name or reduction not in REDUCTIONS:
            raise env.fail("SUBSTRAX_METRICS", value,
                            f"{part!r} is not NAME=REDUCTION with a reduction of "
                            f"{', '.join(REDUCTIONS)}")
        declared[name] = reduction
    return declared


def _read_mesh(path: str) -> MeshInfo:
    """The mesh file: protobuf's JSON mapping of substrax.v1.Mesh with the proto's field names
    (int64 fields as strings, as protobuf writes them)."""
    where = f"SUBSTRAX_MESH_FILE={path}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        axis_names = tuple(str(a) for a in data["axis_names"])
        shape = tuple(int(s) for s in data["shape"])
        devices = tuple(
            DeviceInfo(id=int(d.get("id", 0)), host=str(d.get("host", "")),
                       worker_id=str(d.get("worker_id", "")),
                       local_index=int(d.get("local_index", 0)),
                       kind=str(d.get("kind", "DEVICE_KIND_UNSPECIFIED")),
                       name=str(d.get("name", "")), memory_bytes=int(d.get("memory_bytes", 0)),
                       pci_bus_id=str(d.get("pci_bus_id", "")))
            for d in data["devices"])
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror})") from e
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not a mesh (substrax.v1.Mesh as JSON): {e!r}") from e
    if len(axis_names) != len(shape) or math.prod(shape) != len(devices):
        raise ValueError(f"{where}: axes {list(axis_names)} of shape {list(shape)} do not "
                         f"match its {len(devices)} devices")
    return MeshInfo(axis_names=axis_names, shape=shape, devices=devices)
