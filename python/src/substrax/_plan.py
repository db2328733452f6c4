"""What `substrax.launch` gives each local process: its place, the mesh file, and the contract's
variables with the meanings docs/command-jobs.md gives them (the agent's contract/command_env.cc
renders the same for a cluster). Pure functions: python/tests/test_launch.py checks them."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from substrax._contract import NAMES, VARIABLES


@dataclass(frozen=True)
class Settings:
    """A local attempt: its workers, each with its devices, and the spec's settings."""

    workers: int
    devices_per_worker: int = 1
    per_device: bool = False  # one process per device instead of one per worker
    job_id: str = "local"
    attempt: int = 1
    restart_count: int = 0
    max_restarts: int = 0
    seed: int = 0
    steps: int | None = None
    epochs: int | None = None
    global_batch_size: int | None = None
    per_device_batch_size: int | None = None
    report_every_steps: int | None = None
    metrics: dict[str, str] = field(default_factory=dict)  # name -> reduction
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    tensorboard_dir: str | None = None
    data_roots: tuple[str, ...] = ()
    checkpoint_roots: tuple[str, ...] = ()
    # The mesh's axes and sizes, outermost first; empty: one axis "data" over every device.
    mesh_axes: tuple[tuple[str, int], ...] = ()

    @property
    def num_devices(self) -> int:
        return self.workers * self.devices_per_worker

    @property
    def axes(self) -> tuple[tuple[str, int], ...]:
        return self.mesh_axes or (("data", self.num_devices),)


@dataclass(frozen=True)
class Place:
    """One process: its rank, its worker and rank there, and the mesh devices it drives."""

    rank: int
    worker: int
    local_rank: int
    local_world_size: int
    device_ids: tuple[int, ...]


@dataclass(frozen=True)
class Endpoints:
    """Where the processes meet, and the attempt's files."""

    host: str
    torch_master_port: int
    jax_coordinator_port: int
    work_dir: str  # absolute: holds mesh.json, report-<rank>.jsonl, error-<rank>.json

    @property
    def mesh_file(self) -> str:
        return os.path.join(self.work_dir, "mesh.json")

    def report_file(self, rank: int) -> str:
        return os.path.join(self.work_dir, f"report-{rank}.jsonl")

    def error_file(self, rank: int) -> str:
        return os.path.join(self.work_dir, f"error-{rank}.json")


def check(settings: Settings) -> None:
    """ValueError naming the setting that cannot make an attempt."""
    if settings.workers < 1 or settings.devices_per_worker < 1:
        raise ValueError("-n and --devices-per-process must be at least 1")
    names = [name for name, _ in settings.axes]
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"--mesh: axis names must be distinct and non-empty, got {names}")
    sizes = [size for _, size in settings.axes]
    if any(size < 1 for size in sizes) or math.prod(sizes) != settings.num_devices:
        raise ValueError(f"--mesh: sizes {sizes} multiply to {math.prod(sizes)}, not the "
                         f"{settings.num_devices} devices of -n {settings.workers} x "
                         f"--devices-per-process {settings.devices_per_worker}")
    for name in settings.metrics:
        if not name or "," in name or "=" in name:
            raise ValueError(f"--metric: the name {name!r} cannot be listed in SUBSTRAX_METRICS "
                             "(empty, or with ',' or '=')")
    for flag, roots in (("--data-root", settings.data_roots),
                        ("--checkpoint-root", settings.checkpoint_roots)):
        for root in roots:
            if ":" in root:
                raise ValueError(f"{flag}: {root!r} holds ':', which separates the roots")
    if settings.steps is not None and settings.epochs is not None:
        raise ValueError("--steps and --epochs: give one, as a spec does")


def places(settings: Settings) -> list[Place]:
    """The processes in rank order. Worker w drives the mesh devices w*D .. w*D+D-1 (D devices a
    worker), the mesh lists devices by id: per_device rank r drives devices[r]."""
    d = settings.devices_per_worker
    if not settings.per_device:
        return [Place(rank=w, worker=w, local_rank=0, local_world_size=1,
                      device_ids=tuple(range(w * d, (w + 1) * d)))
                for w in range(settings.workers)]
    return [Place(rank=w * d + k, worker=w, local_rank=k, local_world_size=d,
                  device_ids=(w * d + k,))
            for w in range(settings.workers) for k in range(d)]


def mesh_json(settings: Settings, host: str) -> str:
    """The mesh file: substrax.v1.Mesh as contract/command_env.cc's EncodeMeshFile writes it
    (protobuf's JSON with the proto's field names, every field, int64s as strings; one line)."""
    d = settings.devices_per_worker
    devices = [{"id": i, "host": host, "worker_id": f"launch-{i // d}", "local_index": i % d,
                "kind": "DEVICE_KIND_CPU", "name": "cpu", "memory_bytes": "0",
                "pci_bus_id": ""} for i in range(settings.num_devices)]
    mesh = {"axis_names": [name for name, _ in settings.axes],
            "shape": [str(size) for _, size in settings.axes], "devices": devices}
    return json.dumps(mesh, separators=(",", ":")) + "\n"


def contract_env(settings: Settings, place: Place, endpoints: Endpoints) -> dict[str, str]:
    """The contract's variables for one process (CPU workers: CUDA_VISIBLE_DEVICES empty)."""
    s, p, e = settings, place, endpoints
    world = s.num_devices if s.per_device else s.workers
    host = f"[{e.host}]" if ":" in e.host else e.host
    env = {
        "MASTER_ADDR": e.host, "MASTER_PORT": str(e.torch_master_port),
        "RANK": str(p.rank), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(p.local_rank), "LOCAL_WORLD_SIZE": str(p.local_world_size),
        "GROUP_RANK": str(p.worker), "NODE_RANK": str(p.worker),
        "TORCHELASTIC_RUN_ID": s.job_id,
        "TORCHELASTIC_RESTART_COUNT": str(s.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(s.max_restarts),
        "TORCHELASTIC_ERROR_FILE": e.error_file(p.rank),
        "PET_NNODES": str(s.workers), "PET_NPROC_PER_NODE": str(s.devices_per_worker),
        "PET_NODE_RANK": str(p.worker), "PET_MASTER_ADDR": e.host,
        "PET_MASTER_PORT": str(e.torch_master_port),
        "JAX_COORDINATOR_ADDRESS": f"{host}:{e.jax_coordinator_port}",
        "JAX_NUM_PROCESSES": str(world), "JAX_PROCESS_ID": str(p.rank),
        "JAX_NUM_CPU_DEVICES": str(len(p.device_ids)),
        "CUDA_VISIBLE_DEVICES": "",
        "SUBSTRAX_JOB_ID": s.job_id, "SUBSTRAX_ATTEMPT": str(s.attempt),
        "SUBSTRAX_PROCESS_INDEX": str(p.rank), "SUBSTRAX_NUM_PROCESSES": str(world),
        "SUBSTRAX_LOCAL_DEVICE_IDS": ",".join(map(str, p.device_ids)),
        "SUBSTRAX_SEED": str(s.seed),
    }
    optional = {
        "SUBSTRAX_GLOBAL_BATCH_SIZE": s.global_batch_size,
        "SUBSTRAX_PER_DEVICE_BATCH_SIZE": s.per_device_batch_size,
        "SUBSTRAX_STEPS": s.steps, "SUBSTRAX_EPOCHS": s.epochs,
        "SUBSTRAX_REPORT_EVERY_STEPS": s.report_every_steps,
        "SUBSTRAX_METRICS": ",".join(f"{n}={r}" for n, r in sorted(s.metrics.items())),
        "SUBSTRAX_CHECKPOINT_DIR": s.checkpoint_dir,
        # A restarted attempt resumes from what the earlier ones saved, as on a cluster.
        "SUBSTRAX_RESUME_FROM": s.resume_from or (s.checkpoint_dir if s.restart_count else None),
        "SUBSTRAX_TENSORBOARD_DIR": s.tensorboard_dir,
        "SUBSTRAX_DATA_ROOTS": ":".join(s.data_roots),
        "SUBSTRAX_CHECKPOINT_ROOTS": ":".join(s.checkpoint_roots),
    }
    env.update({name: str(value) for name, value in optional.items() if value})
    env.update({"SUBSTRAX_MESH_FILE": e.mesh_file, "SUBSTRAX_REPORT_FILE": e.report_file(p.rank),
                "SUBSTRAX_ERROR_FILE": e.error_file(p.rank)})
    # In the table's order, and nothing the table lacks.
    unknown = set(env) - set(NAMES)
    assert not unknown, f"not in substrax._contract.VARIABLES: {sorted(unknown)}"
    return {v.name: env[v.name] for v in VARIABLES if v.name in env}


def process_env(base: dict[str, str], contract: dict[str, str]) -> dict[str, str]:
    """A process's whole environment: the launcher's, less any contract variable it has (a
    setting the attempt leaves out is absent, not inherited), plus the contract. Python's
    output unbuffered unless the launcher's environment says otherwise, so that lines arrive
    as they are printed."""
    env = {k: v for k, v in base.items() if k not in NAMES}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(contract)
    return env
