#!/usr/bin/env bash
# GPU check of the CUDA backend, in two halves:
#
#   scripts/gpu-check.sh build   on the CPU machine (Rust, no GPU): makes the nvcc virtualenv
#                                (scripts/check-kernels.sh), builds target/release/sorft with the
#                                kernels compiled to PTX (compute_80) and an sm_90a cubin
#                                embedded, and checks the binary links only glibc.
#   scripts/gpu-check.sh run     on the GPU machine (no Rust): finds cuBLAS and NVRTC in the
#                                image's Python site-packages (the nvidia-cublas and
#                                nvidia-cuda-nvrtc wheels) and puts them on LD_LIBRARY_PATH, then
#                                runs `sorft doctor`, `sorft selftest --device cuda`,
#                                compute-sanitizer memcheck on `selftest --no-model` (when the
#                                sanitizer is there), `sorft bench kernels`, and `sorft repro
#                                --quick` on `--device cuda` and on `--device cpu` in the same run,
#                                writing their outputs, summary.txt and summary.json to $OUT
#                                (default ./gpu-check-out). Fits in 9 minutes; exits non-zero if
#                                the selftest fails.
#
# The libraries are found, not carried: pip's nvidia-cublas wheel (hundreds of MB) is far too
# large to carry next to the binary. Without them the backend uses its built-in tiled GEMM kernel
# and the embedded cubin/PTX (doctor says which).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mode="${1:-}"

case "$mode" in
build)
    scripts/check-kernels.sh >/dev/null
    export SORFT_NVCC_VENV="${SORFT_NVCC_VENV:-/tmp/sorft-nvcc-venv}"
    cargo build --release --locked
    bin="${CARGO_TARGET_DIR:-$ROOT/target}/release/sorft"
    echo "gpu-check: built $bin"
    # Only glibc (and the dynamic loader / vdso) may be linked; CUDA is dlopen'd at run time.
    if ldd "$bin" | grep -vE 'linux-vdso|ld-linux|lib(c|m|pthread|dl|rt|gcc_s)\.so' | grep -q '=>'; then
        echo "gpu-check: $bin links more than glibc:" >&2
        ldd "$bin" >&2
        exit 1
    fi
    ldd "$bin"
    # The device tool carries at most 64 MiB with the working tree: the binary must leave room.
    size=$(stat -c %s "$bin")
    if (( size > 56 * 1024 * 1024 )); then
        echo "gpu-check: $bin is $((size >> 20)) MiB, too large to carry (limit 64 MiB in all)" >&2
        exit 1
    fi
    echo "gpu-check: $bin is $((size >> 20)) MiB (carry limit 64 MiB)"
    "$bin" doctor | grep '^kernels:'
    ;;
run)
    bin="${SORFT_BIN:-$ROOT/target/release/sorft}"
    out="${OUT:-$ROOT/gpu-check-out}"
    mkdir -p "$out"
    [[ -x "$bin" ]] || { echo "gpu-check: $bin not found (run 'scripts/gpu-check.sh build' first)" >&2; exit 1; }
    # cuBLAS and NVRTC from the wheels in the image's Python (nvidia/cublas/lib,
    # nvidia/cuda_nvrtc/lib, or CUDA 13's shared nvidia/cu13/lib).
    libdirs="$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")])
dirs = set()
for r in roots:
    for pat in ("libcublas.so*", "libcublasLt.so*", "libnvrtc.so*"):
        for f in glob.glob(os.path.join(r, "nvidia", "**", pat), recursive=True):
            dirs.add(os.path.dirname(f))
print(":".join(sorted(dirs)))
PY
)"
    if [[ -n "$libdirs" ]]; then
        export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    echo "gpu-check: CUDA libraries from: ${libdirs:-none found}" | tee "$out/libraries.txt"
    rc_doctor=0; rc_self=0; rc_san=skipped; rc_bench=0; rc_cuda=0; rc_cpu=0
    nvidia-smi -q >"$out/nvidia-smi.txt" 2>&1 || true
    timeout 60 "$bin" doctor >"$out/doctor.txt" 2>&1 || rc_doctor=$?
    cat "$out/doctor.txt"
    timeout 200 "$bin" selftest --device cuda >"$out/selftest.txt" 2>&1 || rc_self=$?
    grep -E '^FAIL|passed, .* failed|^error' "$out/selftest.txt" || true
    if command -v compute-sanitizer >/dev/null; then
        rc_san=0
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin" selftest --device cuda --no-model \
            >"$out/memcheck.txt" 2>&1 || rc_san=$?
        tail -n 3 "$out/memcheck.txt"
    fi
    timeout 60 "$bin" bench kernels >"$out/bench.jsonl" 2>"$out/bench.err" || rc_bench=$?
    cat "$out/bench.jsonl"
    # The whole loop on the GPU beside the same run on the CPU.
    timeout 100 "$bin" repro --quick --device cuda --out "$out/repro-cuda" >"$out/repro-cuda.md" 2>"$out/repro-cuda.err" || rc_cuda=$?
    timeout 100 "$bin" repro --quick --device cpu --out "$out/repro-cpu" >"$out/repro-cpu.md" 2>"$out/repro-cpu.err" || rc_cpu=$?
    {
        echo "doctor exit $rc_doctor"
        echo "selftest exit $rc_self ($(tail -n 1 "$out/selftest.txt"))"
        echo "memcheck exit $rc_san"
        echo "bench exit $rc_bench"
        echo "repro --quick --device cuda exit $rc_cuda"
        echo "repro --quick --device cpu exit $rc_cpu"
    } | tee "$out/summary.txt"
    printf '{"doctor":%s,"selftest":%s,"memcheck":"%s","bench":%s,"repro_cuda":%s,"repro_cpu":%s,"libraries":"%s"}\n' \
        "$rc_doctor" "$rc_self" "$rc_san" "$rc_bench" "$rc_cuda" "$rc_cpu" "$libdirs" >"$out/summary.json"
    [[ $rc_self -eq 0 && $rc_doctor -eq 0 ]]
    ;;
*)
    echo "usage: scripts/gpu-check.sh build|run" >&2
    exit 2
    ;;
esac
