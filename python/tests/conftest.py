"""Shared by the package's tests (python/tests), run by the pinned JAX environment's pytest:

    /opt/substrax/jax/bin/python -m pytest python/tests -q     (make test runs it)

They test the installed package (`make python` builds the wheel and installs it there), the
same one the processes that `substrax.launch` starts import. JAX runs on CPU with 4 devices
(JAX_NUM_CPU_DEVICES, read by JAX at import): set here, before any test imports JAX.

A test that needs something missing (JAX, Debian's torch) skips itself, except under CI=true,
where it fails: `need(...)`.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import types

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_NUM_CPU_DEVICES"] = "4"

# python/tests -> the repository's root.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def missing(what: str) -> None:
    """Skips the calling test for want of `what`, or fails it under CI=true."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing, and CI=true: tools/install_deps.sh and make python "
                    "install it", pytrace=False)
    pytest.skip(f"{what} is missing (tools/install_deps.sh and make python install it)")


@pytest.fixture
def need():
    """need("jax") imports and returns a module, or skips (fails under CI=true) without it."""

    def need_module(name: str) -> types.ModuleType:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            missing(f"the module {name} ({e})")
            raise AssertionError("unreachable") from e

    return need_module


@pytest.fixture
def repo_root() -> pathlib.Path:
    return REPO_ROOT


@pytest.fixture
def outside_job(monkeypatch):
    """No contract variable in os.environ (but JAX_NUM_CPU_DEVICES, which JAX may yet read at
    import): the test process is not a job's."""
    from substrax._contract import NAMES

    for name in NAMES:
        if name != "JAX_NUM_CPU_DEVICES":
            monkeypatch.delenv(name, raising=False)
    return monkeypatch
