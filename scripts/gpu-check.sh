#!/usr/bin/env bash
# GPU check of the CUDA backend, in two halves:
#
#   scripts/gpu-check.sh build   on the CPU machine (Rust, no GPU): makes the nvcc virtualenv
#                                (scripts/check-kernels.sh), builds target/release/sorft with the
#                                kernels compiled to PTX (compute_80) and an sm_90a cubin
#                                embedded, and checks the binary links only glibc.
#   scripts/gpu-check.sh run     on the GPU machine (driver only: no Rust, no CUDA toolkit, so no
#                                libcublas or libnvrtc): runs `sorft doctor`, `sorft selftest
#                                --device cuda` and `sorft bench kernels` with the carried binary,
#                                writing doctor.txt, selftest.txt, bench.jsonl and summary.txt to
#                                $OUT (default ./gpu-check-out). Fits in 8 minutes; exits non-zero
#                                if the selftest fails.
#
# Without libcublas the backend uses its built-in tiled GEMM kernel (doctor says so); pip's
# nvidia-cublas wheel (hundreds of MB) is far too large to carry next to the binary.
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
    "$bin" doctor | grep '^kernels:'
    ;;
run)
    bin="${SORFT_BIN:-$ROOT/target/release/sorft}"
    out="${OUT:-$ROOT/gpu-check-out}"
    mkdir -p "$out"
    [[ -x "$bin" ]] || { echo "gpu-check: $bin not found (run 'scripts/gpu-check.sh build' first)" >&2; exit 1; }
    rc_doctor=0; rc_self=0; rc_bench=0
    timeout 60 "$bin" doctor >"$out/doctor.txt" 2>&1 || rc_doctor=$?
    cat "$out/doctor.txt"
    timeout 240 "$bin" selftest --device cuda >"$out/selftest.txt" 2>&1 || rc_self=$?
    grep -E '^FAIL|passed, .* failed|^error' "$out/selftest.txt" || true
    timeout 150 "$bin" bench kernels >"$out/bench.jsonl" 2>"$out/bench.err" || rc_bench=$?
    cat "$out/bench.jsonl"
    {
        echo "doctor exit $rc_doctor"
        echo "selftest exit $rc_self ($(tail -n 1 "$out/selftest.txt"))"
        echo "bench exit $rc_bench"
    } | tee "$out/summary.txt"
    [[ $rc_self -eq 0 && $rc_doctor -eq 0 ]]
    ;;
*)
    echo "usage: scripts/gpu-check.sh build|run" >&2
    exit 2
    ;;
esac
