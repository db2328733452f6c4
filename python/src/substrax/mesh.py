"""The guide's device meshes over ``jax.sharding.Mesh``: data-parallel, model-parallel, hybrid.

``DeviceMeshManager`` has static methods only, as in the guide, and no state. Its placement is the
coordinator's (core/device_mesh_manager.h), with JAX processes in the place of hosts: the model
axis carries the chattiest collectives (an all-reduce per layer pair in tensor parallelism), so
every model-axis group lies inside one process, whose devices share memory or fast links; only
the data axis crosses processes. A group that would span processes is refused with the reason
unless the caller asks for it (``allow_cross_process_model_axis=True``).

Devices are taken in canonical order: processes by index, each process's devices by id. Every
process of a job computes the same mesh from the same (global) device list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

DATA_AXIS = "data"
MODEL_AXIS = "model"


@dataclasses.dataclass(frozen=True)
class MeshInfo:
    """What ``DeviceMeshManager.get_mesh_info`` reports; ``str()`` shows the device grid."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    device_count: int
    # Process indices in order of first appearance in the grid.
    process_indices: tuple[int, ...]
    # Row-major, as in the mesh.
    devices: tuple[jax.Device, ...]

    def __str__(self) -> str:
        """A header line, then one row per combination of all axes but the last."""
        dims = ", ".join(f"{name}={size}" for name, size in zip(self.axis_names, self.shape))
        processes = len(self.process_indices)
        header = (
            f"mesh ({dims}): {self.device_count} device{'s' if self.device_count != 1 else ''} "
            f"in {processes} process{'es' if processes != 1 else ''} "
            f"({', '.join(str(p) for p in self.process_indices)})"
        )
        if not self.shape:
            return header
        columns = self.shape[-1]
        rows = len(self.devices) // columns
        cells = [f"d{d.id} p{d.process_index}/{d.platform}" for d in self.devices]
        headers = [f"{self.axis_names[-1]}={c}" for c in range(columns)]
        labels = []
        for r in range(rows):
            index = np.unravel_index(r, self.shape[:-1]) if len(self.shape) > 1 else ()
            labels.append(",".join(f"{n}={i}" for n, i in zip(self.axis_names[:-1], index)))
        width = max(len(s) for s in cells + headers)
        label_width = max(len(s) for s in labels)
        lines = [header, ("  " + " " * label_width + "".join(f"  {h:<{width}}" for h in headers))]
        for r in range(rows):
            row = cells[r * columns : (r + 1) * columns]
            lines.append("  " + f"{labels[r]:<{label_width}}" + "".join(f"  {c:<{width}}" for c in row))
        return "\n".join(line.rstrip() for line in lines)


class DeviceMeshManager:
    """Builds the guide's meshes; static methods only, so every method is thread-safe."""

    def __init__(self) -> None:
        raise TypeError("DeviceMeshManager has static methods only; call them on the class")

    @staticmethod
    def create_data_parallel_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
        """A 1-D mesh over all ``devices`` (default: ``jax.devices()``), axis ``"data"``.

        Raises:
            ValueError: ``devices`` is empty or names a device twice.
        """
        ordered = _canonical(devices)
        return Mesh(np.array(ordered, dtype=object), (DATA_AXIS,))

    @staticmethod
    def create_model_parallel_mesh(
        num_devices: int,
        devices: Sequence[jax.Device] | None = None,
        *,
        allow_cross_process_model_axis: bool = False,
    ) -> Mesh:
        """A 1-D mesh of ``num_devices`` devices, axis ``"model"``, inside one process.

        The devices are the first ``num_devices`` of the first process (by index) that has that
        many; with ``allow_cross_process_model_axis`` the first ``num_devices`` in canonical order
        when no process has enough.

        Raises:
            ValueError: ``num_devices`` < 1 or more than there are, or no process has
                ``num_devices`` devices (the message lists the devices per process).
        """
        ordered = _canonical(devices)
        what = f"model-parallel mesh of {num_devices} devices"
        if num_devices < 1:
            raise ValueError(f"{what}: num_devices must be >= 1")
        if num_devices > len(ordered):
            raise ValueError(
                f"{what}, but only {len(ordered)} are available ({_per_process(ordered)})"
            )
        groups = _same_process_groups(ordered, num_devices)
        if groups:
            chosen = groups[0]
        elif allow_cross_process_model_axis:
            chosen = ordered[:num_devices]
        else:
            raise ValueError(
                f"{what} must lie inside one process, but no process has {num_devices} devices "
                f"({_per_process(ordered)}); use fewer devices, or pass "
                "allow_cross_process_model_axis=True"
            )
        return Mesh(np.array(chosen, dtype=object), (MODEL_AXIS,))

    @staticmethod
    def create_hybrid_mesh(
        data_parallel_size: int,
        model_parallel_size: int,
        devices: Sequence[jax.Device] | None = None,
        *,
        allow_cross_process_model_axis: bool = False,
    ) -> Mesh:
        """A 2-D mesh ``(data=data_parallel_size, model=model_parallel_size)`` over ``devices``.

        Each row (a model-axis group) is ``model_parallel_size`` consecutive devices of one
        process, so the model axis varies fastest over a process's own devices and only the data
        axis crosses processes. The sizes must multiply to the number of devices (default: all
        of ``jax.devices()``).

        Raises:
            ValueError: a size < 1; the sizes do not multiply to the device count; a process's
                device count is not a multiple of ``model_parallel_size``, so a group would span
                processes (unless ``allow_cross_process_model_axis``).
        """
        ordered = _canonical(devices)
        what = f"hybrid mesh (data={data_parallel_size}, model={model_parallel_size})"
        if data_parallel_size < 1 or model_parallel_size < 1:
            raise ValueError(f"{what}: data_parallel_size and model_parallel_size must be >= 1")
        if data_parallel_size * model_parallel_size != len(ordered):
            raise ValueError(
                f"{what}: data_parallel_size x model_parallel_size = "
                f"{data_parallel_size * model_parallel_size}, but there are {len(ordered)} "
                f"devices ({_per_process(ordered)}); choose sizes whose product is the device "
                "count, or pass the devices to use"
            )
        groups = _same_process_groups(ordered, model_parallel_size)
        if len(groups) == data_parallel_size:
            chosen = [d for group in groups for d in group]
        elif allow_cross_process_model_axis:
            chosen = ordered
        else:
            raise ValueError(
                f"{what} needs {data_parallel_size} model-axis groups of {model_parallel_size} "
                f"devices, each inside one process, but only {len(groups)} fit (devices per "
                f"process: {_per_process(ordered)}); choose a model_parallel_size that divides "
                "the devices of each process, or pass allow_cross_process_model_axis=True"
            )
        grid = np.array(chosen, dtype=object).reshape(data_parallel_size, model_parallel_size)
        return Mesh(grid, (DATA_AXIS, MODEL_AXIS))

    @staticmethod
    def get_mesh_info(mesh: Mesh) -> MeshInfo:
        """The mesh's axes, shape, device count, processes and device grid (printable)."""
        devices = tuple(mesh.devices.flat)
        processes: list[int] = []
        for d in devices:
            if d.process_index not in processes:
                processes.append(d.process_index)
        return MeshInfo(
            axis_names=tuple(str(n) for n in mesh.axis_names),
            shape=tuple(int(s) for s in mesh.devices.shape),
            device_count=len(devices),
            process_indices=tuple(processes),
            devices=devices,
        )


def _canonical(devices: Sequence[jax.Device] | None) -> list[jax.Device]:
    """``devices`` (default: all of the job's) ordered by process index, then device id."""
    chosen = list(jax.devices() if devices is None else devices)
    if not chosen:
        raise ValueError("a mesh needs at least one device, and none were given")
    ids = [d.id for d in chosen]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"devices {twice} are given more than once; list each device once")
    return sorted(chosen, key=lambda d: (d.process_index, d.id))


def _by_process(ordered: Sequence[jax.Device]) -> dict[int, list[jax.Device]]:
    groups: dict[int, list[jax.Device]] = {}
    for d in ordered:
        groups.setdefault(d.process_index, []).append(d)
    return groups


def _per_process(ordered: Sequence[jax.Device]) -> str:
    """``"process 0: 2, process 1: 2"``: for errors that explain why a mesh does not fit."""
    return ", ".join(f"process {p}: {len(ds)}" for p, ds in _by_process(ordered).items())


def _same_process_groups(ordered: Sequence[jax.Device], size: int) -> list[list[jax.Device]]:
    """Every run of ``size`` consecutive devices of one process, processes in order."""
    groups = []
    for process_devices in _by_process(ordered).values():
        for start in range(0, len(process_devices) - size + 1, size):
            groups.append(process_devices[start : start + size])
    return groups
