"""A JAX program as a command job runs it (`per_worker`): its CPU devices from
JAX_NUM_CPU_DEVICES, jax.distributed.initialize with the contract's address, process count and
id (JAX reads only the address itself), then a psum over every device of every process: device
d contributes d + 1. Each process reports step 1 with the psum (declared `max` in the test's
spec) for both of its devices.
"""
import json
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def main():
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    process_id = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                               num_processes=num_processes, process_id=process_id,
                               cluster_detection_method="deactivate", initialization_timeout=60)
    n = jax.device_count()
    if jax.local_device_count() != int(os.environ["JAX_NUM_CPU_DEVICES"]):
        raise SystemExit(f"process {process_id}: {jax.local_device_count()} local devices, "
                         f"JAX_NUM_CPU_DEVICES={os.environ['JAX_NUM_CPU_DEVICES']}")
    mesh = Mesh(np.array(jax.devices()), ("d",))
    shards = [jax.device_put(np.array([mesh.devices.tolist().index(d) + 1.0], np.float32), d)
              for d in jax.local_devices()]
    x = jax.make_array_from_single_device_arrays((n,), NamedSharding(mesh, P("d")), shards)
    total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"),
                                  out_specs=P()))(x)
    got = float(total.addressable_data(0)[0])
    if got != n * (n + 1) / 2:
        raise SystemExit(f"process {process_id}: psum over {n} devices gave {got}")
    with open(os.environ["SUBSTRAX_REPORT_FILE"], "a") as f:
        f.write(json.dumps({"type": "step", "step": 1, "metrics": {"psum": got}}) + "\n")
    print(f"OK process {process_id} of {num_processes}: psum over {n} devices = {got}",
          flush=True)


if __name__ == "__main__":
    main()
