#!/usr/bin/env bash
# Builds the sorft software GPU (tests/softgpu/): a libcuda.so and a libnvrtc.so that run the
# kernels of kernels/*.cu, compiled as host C++, on the CPU, with memory, initialisation and race
# checks. Test infrastructure only; never part of the release binary. Idempotent: objects are
# cached by content, so a second run with nothing changed only prints the folder.
#
# Usage: scripts/softgpu.sh [--kernels DIR] [--out DIR]
#   --kernels DIR  kernel sources to build from (default: kernels/; the planted-bug test passes
#                  a mutated copy)
#   --out DIR      where lib/ goes (default: $CARGO_TARGET_DIR or target/, then softgpu/)
# The last line printed is the folder to put on LD_LIBRARY_PATH:
#   LD_LIBRARY_PATH=$(scripts/softgpu.sh | tail -1) sorft selftest --device cuda --quick
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
src=$repo/tests/softgpu
kernels=$repo/kernels
base=${CARGO_TARGET_DIR:-$repo/target}/softgpu
out=$base
while [ $# -gt 0 ]; do
  case "$1" in
    --kernels) kernels=$(cd "$2" && pwd); shift 2 ;;
    --out) mkdir -p "$2"; out=$(cd "$2" && pwd); shift 2 ;;
    *) echo "usage: scripts/softgpu.sh [--kernels DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ "$(uname -m)" = x86_64 ] || { echo "softgpu: needs x86-64 (its fiber switch is x86-64 assembly)" >&2; exit 1; }
command -v g++ >/dev/null || { echo "softgpu: g++ not found (apt-get install g++)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "softgpu: python3 not found" >&2; exit 1; }
cache=$base/obj
mkdir -p "$out/gen" "$out/lib" "$cache"
modules=$(python3 "$src/gen.py" "$kernels" "$out/gen")

cxx=(g++ -std=c++17 -O1 -g -fPIC -fno-strict-aliasing -ffp-contract=off -fvisibility=hidden)
kflags=(-fvisibility=default -fsanitize=thread --param tsan-instrument-func-entry-exit=0 -I "$src" -I "$kernels")
key() { cat "$@" | sha256sum | cut -c1-32; }
flags_file=$out/gen/flags
echo "${cxx[*]} ${kflags[*]}" >"$flags_file"

objs=()
pids=()
compile() { # key source extra-flags...
  local k=$1 f=$2; shift 2
  local o=$cache/$k.o
  objs+=("$o")
  if [ ! -f "$o" ]; then
    ( "${cxx[@]}" "$@" -c "$f" -o "$o.tmp$$" && mv "$o.tmp$$" "$o" ) &
    pids+=($!)
  fi
}
compile "$(key "$src/runtime.cpp" "$flags_file")" "$src/runtime.cpp"
headers=("$kernels"/*.cuh)
for m in $modules; do
  compile "$(key "$out/gen/k_$m.cpp" "$kernels/$m.cu" "${headers[@]}" "$src/shim.h" "$flags_file")" \
    "$out/gen/k_$m.cpp" "${kflags[@]}"
done
# The lane-by-lane test of kernels/ptx.cuh's PTX emulations (bin/ptx_test, run by the tests).
compile "$(key "$src/ptx_test_main.cpp" "$src/ptx_test.cu" "${headers[@]}" "$src/shim.h" "$flags_file")" \
  "$src/ptx_test_main.cpp" "${kflags[@]}"
ptxo=${objs[${#objs[@]}-1]}
unset 'objs[${#objs[@]}-1]'
nv=$(key "$src/nvrtc.cpp" "$out/gen/modules.h" "$flags_file")
compile "$nv" "$src/nvrtc.cpp" -I "$out/gen"
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ $fail = 0 ] || { echo "softgpu: compile failed" >&2; exit 1; }
nvo=${objs[${#objs[@]}-1]}
unset 'objs[${#objs[@]}-1]'
stamp=$(echo "${objs[*]} $nvo $ptxo" | sha256sum | cut -c1-32)
if [ "$(cat "$out/lib/stamp" 2>/dev/null)" != "$stamp" ]; then
  g++ -shared -Wl,-Bsymbolic -o "$out/lib/libcuda.so.tmp$$" "${objs[@]}" -ldl -lm
  g++ -shared -o "$out/lib/libnvrtc.so.tmp$$" "$nvo"
  mkdir -p "$out/bin"
  g++ -o "$out/bin/ptx_test.tmp$$" "${objs[0]}" "$ptxo" -ldl -lm
  mv "$out/bin/ptx_test.tmp$$" "$out/bin/ptx_test"
  mv "$out/lib/libcuda.so.tmp$$" "$out/lib/libcuda.so"
  mv "$out/lib/libnvrtc.so.tmp$$" "$out/lib/libnvrtc.so"
  ln -sf libcuda.so "$out/lib/libcuda.so.1"
  echo "$stamp" >"$out/lib/stamp"
fi
echo "softgpu: libcuda.so and libnvrtc.so built from $kernels ($modules)" >&2
echo "$out/lib"
