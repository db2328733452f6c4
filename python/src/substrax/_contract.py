"""The command-job contract's environment variables: the one list of their names in Python.

docs/command-jobs.md ("The environment contract") is the reference; contract/command_env.cc
renders them for the agent (its CommandEnvNames() lists them in the same order, and
python/tests/test_launch.py checks that the two lists agree). `substrax.job` reads these
variables, `substrax.launch` sets them for its local processes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One variable of the contract: its name and what it holds (docs/command-jobs.md)."""

    name: str
    meaning: str
    # Set for every process of every job (absent only when the spec leaves the setting out, or
    # for JAX_NUM_CPU_DEVICES, on a CUDA worker).
    always: bool = True


VARIABLES: tuple[Variable, ...] = (
    Variable("MASTER_ADDR", "host of torch's rendezvous (the TCP store), on the first worker"),
    Variable("MASTER_PORT", "its port"),
    Variable("RANK", "the process's rank"),
    Variable("WORLD_SIZE", "the command's processes in the attempt"),
    Variable("LOCAL_RANK", "the process's rank on its worker"),
    Variable("LOCAL_WORLD_SIZE", "the command's processes on its worker"),
    Variable("GROUP_RANK", "the worker's index (torchrun's node)"),
    Variable("NODE_RANK", "the worker's index"),
    Variable("TORCHELASTIC_RUN_ID", "the job's id, the same in every attempt"),
    Variable("TORCHELASTIC_RESTART_COUNT", "times the job was restarted before this attempt"),
    Variable("TORCHELASTIC_MAX_RESTARTS", "the spec's max_restarts"),
    Variable("TORCHELASTIC_ERROR_FILE", "the error file, where torch's @record writes"),
    Variable("PET_NNODES", "torchrun's --nnodes: the attempt's workers"),
    Variable("PET_NPROC_PER_NODE", "torchrun's --nproc-per-node: the worker's devices"),
    Variable("PET_NODE_RANK", "torchrun's --node-rank: the worker's index"),
    Variable("PET_MASTER_ADDR", "torchrun's --master-addr: MASTER_ADDR"),
    Variable("PET_MASTER_PORT", "torchrun's --master-port: MASTER_PORT"),
    Variable("JAX_COORDINATOR_ADDRESS", "host:port of JAX's coordinator, on the first worker"),
    Variable("JAX_NUM_PROCESSES", "the command's processes"),
    Variable("JAX_PROCESS_ID", "the process's rank"),
    Variable("JAX_NUM_CPU_DEVICES", "CPU workers only: the CPU devices the process drives",
             always=False),
    Variable("CUDA_VISIBLE_DEVICES", "the worker's GPUs; empty on CPU"),
    Variable("SUBSTRAX_JOB_ID", "the job"),
    Variable("SUBSTRAX_ATTEMPT", "the attempt"),
    Variable("SUBSTRAX_PROCESS_INDEX", "the process's rank"),
    Variable("SUBSTRAX_NUM_PROCESSES", "the command's processes"),
    Variable("SUBSTRAX_LOCAL_DEVICE_IDS", "the mesh ids of the process's devices, comma-separated"),
    Variable("SUBSTRAX_SEED", "spec.seed (0 when the spec gives none)"),
    Variable("SUBSTRAX_GLOBAL_BATCH_SIZE", "spec.batch.global_batch_size", always=False),
    Variable("SUBSTRAX_PER_DEVICE_BATCH_SIZE", "spec.batch.per_device_batch_size", always=False),
    Variable("SUBSTRAX_STEPS", "spec.steps", always=False),
    Variable("SUBSTRAX_EPOCHS", "spec.epochs (instead of SUBSTRAX_STEPS)", always=False),
    Variable("SUBSTRAX_REPORT_EVERY_STEPS", "spec.report_every_steps", always=False),
    Variable("SUBSTRAX_METRICS", "each declared metric and its reduction: name=reduction,...",
             always=False),
    Variable("SUBSTRAX_CHECKPOINT_DIR", "spec.checkpoint.directory", always=False),
    Variable("SUBSTRAX_RESUME_FROM", "where to resume from when the checkpoint directory has none",
             always=False),
    Variable("SUBSTRAX_TENSORBOARD_DIR", "spec.tensorboard.directory", always=False),
    Variable("SUBSTRAX_DATA_ROOTS", "the worker's data roots, ':'-separated", always=False),
    Variable("SUBSTRAX_CHECKPOINT_ROOTS", "the worker's checkpoint roots, ':'-separated",
             always=False),
    Variable("SUBSTRAX_MESH_FILE", "a file with the attempt's mesh (JSON)"),
    Variable("SUBSTRAX_REPORT_FILE", "the file the process appends its reports to"),
    Variable("SUBSTRAX_ERROR_FILE", "the file the process may write its error to"),
)

NAMES: tuple[str, ...] = tuple(v.name for v in VARIABLES)

# The reductions a declared metric may have (proto Reduction, as the spec's YAML spells them).
REDUCTIONS: tuple[str, ...] = ("mean", "sum", "max", "min", "none")
