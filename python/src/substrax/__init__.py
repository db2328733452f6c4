"""substrax: the Python side of the substrax training platform.

- `substrax.job`: the command-job contract (the job's facts, progress reports, the error file);
  standard library only.
- `substrax.distributed`: `jax.distributed` and `torch.distributed` set up from that contract.
- `substrax.launch`: `python -m substrax.launch -n 2 -- python train.py`, the contract on one
  machine, without a cluster.
- `substrax.mesh`, `substrax.spmd`: the distributed-training guide's API over JAX (the `jax`
  extra).

Importing `substrax` imports none of them: each is imported where it is used, so a job that only
reports pays for no framework. docs/python.md is the guide.
"""

# The package's version: pyproject.toml reads it from here, and python/tests/test_job.py checks
# it is the SDK's (contract/include/substrax/version.h).
__version__ = "1.0.0"
