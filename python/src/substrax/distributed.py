"""`jax.distributed` and `torch.distributed` set up from the command-job contract.

JAX reads only JAX_COORDINATOR_ADDRESS itself (and JAX_NUM_CPU_DEVICES, the CPU devices a
process drives, at `import jax`); its cluster auto-detection would take ranks from SLURM or
Open MPI variables that a substrax job does not have. `initialize()` passes the contract's
address, process count and id explicitly and turns the detection off. The frameworks are
imported here, inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import datetime
from typing import Any

from substrax import job
from substrax._ports import free_port

# How long a process waits for its peers at start (JAX's coordinator, torch's store): long
# enough for a slow first import on a loaded machine, short enough that a peer that never comes
# fails the attempt instead of hanging it.
DEFAULT_TIMEOUT_SECONDS = 300


def initialize(timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS) -> job.JobInfo:
    """Connects this process to the job's other processes through JAX's coordinator.

    A no-op for a job of one process and outside a job (one process alone: JAX needs no
    coordinator); a no-op too when jax.distributed is already initialized. Returns the job's
    facts. Raises ValueError when the contract lacks the coordinator's address, and what
    `jax.distributed.initialize` raises when a peer does not come within `timeout_seconds`.
    """
    me = job.info()
    if me.num_processes == 1:
        return me
    import jax  # noqa: PLC0415: only a job of several processes needs it

    if jax.distributed.is_initialized():
        return me
    if not me.jax_coordinator_address:
        raise ValueError("JAX_COORDINATOR_ADDRESS is not set, but SUBSTRAX_NUM_PROCESSES="
                         f"{me.num_processes}: the contract sets it for every job's process")
    jax.distributed.initialize(coordinator_address=me.jax_coordinator_address,
                               num_processes=me.num_processes, process_id=me.process_index,
                               cluster_detection_method="deactivate",
                               initialization_timeout=timeout_seconds)
    return me


def init_torch_process_group(backend: str | None = None,
                             timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS) -> Any:
    """`torch.distributed.init_process_group` from the contract: MASTER_ADDR and MASTER_PORT,
    RANK and WORLD_SIZE (torchrun's, when torchrun started this process).

    backend=None: "nccl" when the process was given GPUs (CUDA_VISIBLE_DEVICES not empty; its
    own is cuda:LOCAL_RANK, made the current device), else "gloo". Outside a job, a group of one
    process on a free local port. Returns torch.distributed, initialized.
    """
    import torch  # noqa: PLC0415: only torch programs need it
    import torch.distributed as dist  # noqa: PLC0415

    me = job.info()
    if backend is None:
        backend = "nccl" if me.cuda_visible_devices else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(me.local_rank)
    if me.in_job:
        if not me.master_addr or not me.master_port:
            raise ValueError("MASTER_ADDR or MASTER_PORT is not set: the contract sets both "
                             "for every job's process")
        address, port = me.master_addr, me.master_port
    else:
        address, port = "127.0.0.1", free_port()
    host = f"[{address}]" if ":" in address else address
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=me.rank,
                            world_size=me.world_size,
                            timeout=datetime.timedelta(seconds=timeout_seconds))
    return dist
