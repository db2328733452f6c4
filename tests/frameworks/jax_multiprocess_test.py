"""One process of a JAX program on CPU, as a command job's process runs it: its 2 CPU devices
come from JAX_NUM_CPU_DEVICES, and it joins the others through jax.distributed.initialize with
the coordinator address, process count and id read from the variables a command job gets
(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID: JAX itself reads only the first)
and given explicitly, cluster auto-detection off. Then a psum over every device of every process
through shard_map: device d contributes d + 1, so each process must read 1 + 2 + ... + n.
Argument: the test's directory (unused here: named so that the test finds any process left
behind). Exits 0 and prints "OK ..." when the sum is right.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import flax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

LOCAL_DEVICES = 2


def main():
    address = os.environ["JAX_COORDINATOR_ADDRESS"]
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    process_id = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(coordinator_address=address, num_processes=num_processes,
                               process_id=process_id, cluster_detection_method="deactivate",
                               initialization_timeout=60)
    where = f"process {process_id} of {num_processes}"
    if jax.process_count() != num_processes or jax.process_index() != process_id:
        raise SystemExit(f"{where}: JAX sees process {jax.process_index()} of "
                         f"{jax.process_count()}: initialize did not join the others")
    if jax.local_device_count() != LOCAL_DEVICES:
        raise SystemExit(f"{where}: {jax.local_device_count()} local devices, not "
                         f"{LOCAL_DEVICES}: JAX_NUM_CPU_DEVICES was not read")
    n = jax.device_count()
    if n != LOCAL_DEVICES * num_processes:
        raise SystemExit(f"{where}: {n} devices in all, not {LOCAL_DEVICES * num_processes}")

    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    # Device d holds d + 1 (its global index in the mesh, from this process's own devices).
    shards = [jax.device_put(np.array([mesh.devices.tolist().index(d) + 1.0], np.float32), d)
              for d in jax.local_devices()]
    x = jax.make_array_from_single_device_arrays((n,), sharding, shards)
    total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"),
                                  out_specs=P()))(x)
    got = float(total.addressable_data(0)[0])
    want = n * (n + 1) / 2
    if got != want:
        raise SystemExit(f"{where}: psum over {n} devices gave {got}, want {want}")

    # flax and optax load and take one step on the all-reduced value (the environment's other
    # two packages, as a training program uses them).
    params = {"w": jnp.zeros(())}
    opt = optax.sgd(1.0)
    updates, _ = opt.update({"w": jnp.asarray(got)}, opt.init(params), params)
    if float(optax.apply_updates(params, updates)["w"]) != -want:
        raise SystemExit(f"{where}: optax.sgd step gave the wrong value")
    print(f"OK {where}: psum over {n} devices = {got} (jax {jax.__version__}, "
          f"flax {flax.__version__}, optax {optax.__version__})", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
