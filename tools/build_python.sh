#!/usr/bin/env bash
# make python: builds the substrax Python package (python/) into
# dist/substrax-<version>-py3-none-any.whl and installs it into the pinned JAX environment
# (default /opt/substrax/jax, tools/install_deps.sh's; another venv as the first argument).
# Offline: Debian's python3 with its setuptools, wheel and pip (tools/install_deps.sh installs
# python3-setuptools, python3-wheel, python3-pip), no build isolation, no package index. The
# wheel is installed with pip, not put on PYTHONPATH: a job's processes may not inherit it.
# The build runs in a copy of python/, so the source tree gains no build/ or egg-info.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/opt/substrax/jax}

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' python/src/substrax/__init__.py)
if [ -z "$version" ]; then
  echo "build_python: no __version__ = \"...\" line in python/src/substrax/__init__.py" >&2
  exit 1
fi
for module in setuptools wheel pip; do
  if ! /usr/bin/python3 -c "import $module" 2>/dev/null; then
    echo "build_python: Debian's python3 has no $module: run tools/install_deps.sh" >&2
    exit 1
  fi
done
if [ ! -x "$venv/bin/python" ]; then
  echo "build_python: no Python environment at $venv: run tools/install_deps.sh (make deps)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r python/. "$work/src"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p dist
wheel="dist/substrax-$version-py3-none-any.whl"
rm -f "$wheel"
if ! /usr/bin/python3 -m pip wheel --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --no-index --wheel-dir "$work/dist" "$work/src" >"$work/log" 2>&1; then
  cat "$work/log" >&2
  echo "build_python: building the wheel failed (output above)" >&2
  exit 1
fi
cp "$work/dist/substrax-$version-py3-none-any.whl" "$wheel"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
    --force-reinstall --no-deps "$wheel" >"$work/log" 2>&1; then
  cat "$work/log" >&2
  echo "build_python: installing $wheel into $venv failed (output above)" >&2
  exit 1
fi
echo "make python: built $wheel and installed it into $venv"
