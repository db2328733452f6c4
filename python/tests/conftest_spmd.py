"""Four CPU devices in this process for the mesh and spmd tests; import before anything imports jax.

JAX fixes its CPU device count when its backend starts, so the count is set here, through the
environment (JAX_NUM_CPU_DEVICES) and JAX's config, before the tests touch a device. ``require_jax()`` skips a test
module when the JAX extra is not installed, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

DEVICES = 4

# JAX_NUM_CPU_DEVICES, not XLA_FLAGS: the processes other tests start inherit the environment
# and set their own device count through JAX_NUM_CPU_DEVICES, which an XLA flag would override.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_NUM_CPU_DEVICES"] = str(DEVICES)


def require(module: str) -> ModuleType:
    """Import ``module``, or skip the test module (fail under ``CI=true``) when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{module} is not installed ({error}); install substrax[jax]",
                    allow_module_level=True)


def require_jax() -> None:
    """jax, flax and optax importable, and this process's JAX on exactly four CPU devices."""
    jax = require("jax")
    require("flax")
    require("optax")
    try:
        jax.config.update("jax_num_cpu_devices", DEVICES)
    except RuntimeError:
        pass  # the backend has started; the check below says whether it has four devices
    if jax.device_count() != DEVICES:
        raise RuntimeError(
            f"these tests need {DEVICES} CPU devices in one process, but JAX has "
            f"{jax.device_count()}: something started JAX's backend before conftest_spmd was "
            f"imported; set JAX_NUM_CPU_DEVICES={DEVICES} in the environment"
        )
