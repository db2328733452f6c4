#!/usr/bin/env bash
# libsubstrax.so exports the SDK's public API and nothing else (libsubstrax.lds):
#  1. every exported symbol is substrax's: nothing of protobuf, gRPC, Abseil, Gloo or the
#     standard library (their template instantiations included);
#  2. none is of a namespace the API does not declare (substrax::v1, the generated protobuf
#     messages, and ToProto; substrax::internal but InitForVersion, which the inline
#     substrax::Init calls) nor of a class that is substrax's own machinery;
#  3. the API is exported: a symbol of each public header that the examples call.
# Argument: the library.
set -euo pipefail
lib="$1"
for tool in nm c++filt; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (binutils)" >&2; exit 1; }
done
exported="$(nm -D --defined-only "$lib" | awk 'NF == 3 { print $3 }' | c++filt)"
count="$(printf '%s\n' "$exported" | grep -c . || true)"
echo "$lib exports $count symbols"
failed=0
fail() {  # what symbols...
  local what="$1"
  shift
  echo "FAIL: libsubstrax.so exports $what ($# symbols; libsubstrax.lds says what it may export):" >&2
  printf '  %s\n' "${@:1:20}" >&2
  failed=1
}

public='^(substrax::|typeinfo for substrax::|typeinfo name for substrax::|vtable for substrax::)'
mapfile -t foreign < <(printf '%s\n' "$exported" | grep -Ev "$public" || true)
[ ${#foreign[@]} -eq 0 ] || fail "symbols that are not substrax's" "${foreign[@]}"

mapfile -t internal < <(printf '%s\n' "$exported" |
  grep -E 'substrax::(v1|internal|pki|shm|job_spec_internal)::|::ToProto\(|substrax::(ProgramImpl|StepReporter|CoordinatorStore|GlooCommunicator|ShmCommunicator|MeshCommunicators|Checkpointer|Communicator|Model|OptimizerConfig)\b' |
  grep -Fv 'substrax::internal::InitForVersion(' || true)
[ ${#internal[@]} -eq 0 ] || fail "substrax's internals" "${internal[@]}"

for needed in 'substrax::internal::InitForVersion(' 'substrax::Tensor::Tensor(' \
    'substrax::SpmdTrainStep(' 'substrax::PlaceBatchOnShards(' 'substrax::Optimizer::Create(' \
    'substrax::CreateDataParallelSharding(' 'substrax::Mesh::AxisSize(' \
    'substrax::ExitWithError(' 'typeinfo for substrax::Program'; do
  # A here-string, not a pipe: grep -q stops at the first match, and a writer still writing
  # into the pipe would die of SIGPIPE and fail the pipeline (pipefail).
  grep -qF "$needed" <<<"$exported" || {
    echo "FAIL: libsubstrax.so does not export $needed, which programs call" >&2
    failed=1
  }
done
[ $failed -eq 0 ] && echo "PASS"
exit $failed
