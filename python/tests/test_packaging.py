"""The package's packaging: one version (the SDK's), the `jax` extra's pins (the JAX
environment's), and pytest's pins kept apart from the worker image's."""

from __future__ import annotations

import re

import substrax


def requirements(path) -> list[str]:
    """A pip requirements file's lines as pip reads them (comments and blank lines dropped)."""
    lines = [re.sub(r"(^|\s)#.*$", "", line).strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line]


def name(pin: str) -> str:
    return re.sub(r"[-_.]+", "-", pin.split("==")[0]).lower()


def test_the_version_is_the_sdks(repo_root):
    header = (repo_root / "contract/include/substrax/version.h").read_text()
    want = re.search(r'#define SUBSTRAX_VERSION_STRING "([^"]+)"', header).group(1)
    assert substrax.__version__ == want


def test_the_jax_extra_pins_the_jax_environment(repo_root):
    pins = set(requirements(repo_root / "tools/jax_requirements.txt"))
    pyproject = (repo_root / "python/pyproject.toml").read_text()
    extra = re.search(r"^jax = \[(.*)\]$", pyproject, re.M).group(1)
    wanted = {p.strip().strip('"') for p in extra.split(",")}
    assert wanted == {"jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8"}
    assert wanted <= pins


def test_the_test_pins_are_apart_from_the_images(repo_root):
    """pytest and its dependencies: pinned, none of them pinned again in the JAX pins (which the
    Python worker image installs), and installed by install_deps.sh into the JAX environment
    together with them."""
    image = requirements(repo_root / "tools/jax_requirements.txt")
    tests = requirements(repo_root / "tools/jax_test_requirements.txt")
    assert any(pin.startswith("pytest==") for pin in tests)
    for pin in tests:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+!-]*", pin), pin
    assert not {name(p) for p in tests} & {name(p) for p in image}
    script = (repo_root / "tools/install_deps.sh").read_text()
    assert ('install_venv /opt/substrax/jax "${JAX_REQUIREMENTS[@]}" '
            '"${JAX_TEST_REQUIREMENTS[@]}"') in script
    dockerfile = (repo_root / "deploy/docker/Dockerfile.worker-python").read_text()
    assert "jax_test_requirements" not in dockerfile
