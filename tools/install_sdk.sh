#!/usr/bin/env bash
# make sdk: builds the substrax SDK (optimized) and installs it into PREFIX (default /usr/local):
#   PREFIX/include/substrax/*.h         the public headers
#   PREFIX/lib/libsubstrax.so*          the library (soname libsubstrax.so.<major>)
#   PREFIX/lib/pkgconfig/substrax.pc    for pkg-config
#   PREFIX/lib/cmake/substrax/          for CMake's find_package(substrax)
# The tree is relocatable (its files find each other relative to where they are), so it may also
# be copied elsewhere, e.g. into a container image. docs/sdk.md has the tutorial.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix="${PREFIX:-/usr/local}"
case "$prefix" in
  /*) ;;
  *) echo "make sdk: PREFIX must be an absolute path, got '$prefix'" >&2; exit 2 ;;
esac

SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh
echo "make sdk: building the SDK (bazel build -c opt //worker/sdk:install_tree)..."
bazel build -c opt //worker/sdk:install_tree
tarball="$(bazel info -c opt bazel-bin 2>/dev/null)/worker/sdk/substrax-sdk.tar"

if ! mkdir -p "$prefix" 2>/dev/null || [ ! -w "$prefix" ]; then
  echo "make sdk: cannot write to $prefix; run as a user who can, or choose PREFIX=\$HOME/.local" >&2
  exit 1
fi
# Files of an earlier install are replaced, never mixed with the new ones.
rm -rf "$prefix/include/substrax" "$prefix/lib/cmake/substrax" "$prefix"/lib/libsubstrax.so*
tar -C "$prefix" --no-same-owner -xf "$tarball"
version="$(sed -n 's/^#define SUBSTRAX_VERSION_STRING "\(.*\)"$/\1/p' "$prefix/include/substrax/version.h")"
cat <<MSG
make sdk: installed the substrax SDK $version into $prefix
  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig g++ -std=c++17 prog.cc \$(pkg-config --cflags --libs substrax)
  CMake:      cmake -DCMAKE_PREFIX_PATH=$prefix ...   with find_package(substrax 1 REQUIRED)
Programs built so find libsubstrax.so.1 in $prefix/lib through their run path. On worker hosts,
install the SDK at the same PREFIX, or put lib/libsubstrax.so.1 beside the program and link with
-Wl,-rpath,'\$ORIGIN' (docs/sdk.md, "3. Build it").
MSG
