"""One of two processes (2 CPU devices each) that test_spmd.py starts: substrax.mesh and
substrax.spmd where the mesh spans processes.

Arguments: coordinator address, process id, output directory. Checks the meshes' placement and
refusals across processes, place_batch_on_shards with each process passing its half of the
global batch, collect_from_devices and place_nnx_state_on_shards on arrays other processes hold
parts of (spmd_model.placed_model_and_optimizer); then trains spmd_model's MLP with spmd_train_step and writes its losses and parameters
to <output>/process-<id>.npz for the test to compare with one device. Exits non-zero with the
reason on the first wrong result.
"""

from __future__ import annotations

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "2"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import spmd_model  # noqa: E402
from substrax.mesh import DeviceMeshManager  # noqa: E402
from substrax.spmd import (  # noqa: E402
    collect_from_devices,
    create_data_parallel_sharding,
    place_batch_on_shards,
    reduce_sum,
    spmd_train_step,
)

PROCESSES = 2


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"process {jax.process_index()}: {what}")


def refused(call, message: str) -> None:
    try:
        call()
    except ValueError as error:
        expect(message in str(error), f"refusal {str(error)!r} does not say {message!r}")
        return
    expect(False, f"no ValueError ({message})")


def check_meshes() -> None:
    grid = lambda mesh: [[(d.process_index, d.id) for d in row]  # noqa: E731
                         for row in mesh.devices.reshape(-1, mesh.devices.shape[-1])]
    hybrid = DeviceMeshManager.create_hybrid_mesh(data_parallel_size=2, model_parallel_size=2)
    expect([[p for p, _ in row] for row in grid(hybrid)] == [[0, 0], [1, 1]],
           f"hybrid (2, 2) model groups span processes: {grid(hybrid)}")
    refused(lambda: DeviceMeshManager.create_hybrid_mesh(1, 4),
            "needs 1 model-axis groups of 4 devices, each inside one process, but only 0 fit "
            "(devices per process: process 0: 2, process 1: 2)")
    crossing = DeviceMeshManager.create_hybrid_mesh(1, 4, allow_cross_process_model_axis=True)
    expect(dict(crossing.shape) == {"data": 1, "model": 4}, "cross-process hybrid mesh")
    refused(lambda: DeviceMeshManager.create_model_parallel_mesh(num_devices=4),
            "must lie inside one process, but no process has 4 devices")
    model = DeviceMeshManager.create_model_parallel_mesh(num_devices=2)
    expect([p for p, _ in grid(model)[0]] == [0, 0], "model mesh not on process 0")
    info = str(DeviceMeshManager.get_mesh_info(hybrid))
    expect(info.startswith("mesh (data=2, model=2): 4 devices in 2 processes (0, 1)"), info)


def check_placement(sharding: jax.sharding.NamedSharding) -> None:
    me = jax.process_index()
    local = np.arange(4.0) + 4 * me  # this process's half of arange(8)
    batch = place_batch_on_shards({"x": local}, sharding)["x"]
    expect(batch.shape == (8,), f"global shape {batch.shape}")
    total = jax.jit(lambda x: reduce_sum({"x": x})["x"])(batch)
    expect(float(total.addressable_data(0)) == 28.0, f"sum {total}")
    collected = collect_from_devices({"x": batch})["x"]
    expect([float(v) for v in collected] == list(np.arange(8.0)), f"collected {collected}")
    refused(lambda: place_batch_on_shards(np.zeros(3), sharding),
            "does not divide over the 2 shards of axis ('data',) this process holds (of 4); "
            "make this process's part of the batch a multiple of 2")


def train(mesh: jax.sharding.Mesh, sharding: jax.sharding.NamedSharding) -> tuple:
    me = jax.process_index()
    model, optimizer = spmd_model.placed_model_and_optimizer(mesh)
    losses = []
    rows = spmd_model.GLOBAL_BATCH // PROCESSES
    with jax.set_mesh(mesh):
        for batch in spmd_model.training_batches():
            mine = {k: v[me * rows:(me + 1) * rows] for k, v in batch.items()}
            loss = spmd_train_step(model, optimizer, place_batch_on_shards(mine, sharding),
                                   spmd_model.loss_fn)
            losses.append(float(loss.addressable_data(0)))
    return losses, spmd_model.params_of(model)


def main() -> None:
    address, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(coordinator_address=address, num_processes=PROCESSES,
                               process_id=process_id, cluster_detection_method="deactivate",
                               initialization_timeout=60)
    expect(jax.device_count() == 4 and jax.local_device_count() == 2,
           f"{jax.device_count()} devices, {jax.local_device_count()} local")
    check_meshes()
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    check_placement(sharding)
    losses, params = train(mesh, sharding)
    np.savez(os.path.join(out, f"process-{process_id}.npz"), losses=np.array(losses),
             **{f"param{i}": p for i, p in enumerate(params)})
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
