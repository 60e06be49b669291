#!/usr/bin/env bash
# Compiles every kernel in kernels/ with nvcc for sm_80 and sm_90a with `-Xptxas -v`, and fails on
# a compile error or on a register spill (spill stores or loads) in any kernel. Also emits the PTX
# for compute_80 that build.rs embeds, as a check that it compiles too.
#
# nvcc comes from a Python virtualenv (no system CUDA needed): $SORFT_NVCC_VENV, default
# /tmp/sorft-nvcc-venv, created on first use with pip's NVIDIA wheels (nvcc and nvvm versions must
# match). Set NVCC to use another compiler instead.
#
# Usage: scripts/check-kernels.sh            (prints a per-kernel register / spill table)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${SORFT_NVCC_VENV:-/tmp/sorft-nvcc-venv}"
CUDA_PIP_VERSION="13.0.*"

if [[ -z "${NVCC:-}" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "check-kernels: creating $VENV with nvcc $CUDA_PIP_VERSION" >&2
        if ! python3 -m venv "$VENV"; then
            # Debian's python3 needs python3-venv for `-m venv`.
            if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
                apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
                rm -rf "$VENV"
                python3 -m venv "$VENV"
            else
                echo "check-kernels: python3 -m venv failed (install python3-venv)" >&2
                exit 1
            fi
        fi
    fi
    NVCC_DIR="$("$VENV/bin/python" - <<'PY'
import pathlib, site
for p in site.getsitepackages():
    d = pathlib.Path(p) / "nvidia" / "cu13" / "bin"
    if (d / "nvcc").exists():
        print(d)
        break
PY
)"
    if [[ -z "$NVCC_DIR" ]]; then
        "$VENV/bin/pip" install --quiet \
            "nvidia-cuda-nvcc==$CUDA_PIP_VERSION" "nvidia-nvvm==$CUDA_PIP_VERSION" \
            "nvidia-cuda-runtime==$CUDA_PIP_VERSION" "nvidia-cuda-cccl==$CUDA_PIP_VERSION"
        NVCC_DIR="$(ls -d "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin | head -1)"
    fi
    NVCC="$NVCC_DIR/nvcc"
    # The SASS census (scripts/sass-census.sh) disassembles with cuobjdump + nvdisasm (13.2: the
    # oldest on PyPI; they read 13.0's cubins).
    if [[ ! -x "$NVCC_DIR/cuobjdump" || ! -x "$NVCC_DIR/nvdisasm" ]]; then
        "$VENV/bin/pip" install --quiet "nvidia-cuda-cuobjdump==13.2.*" "nvidia-cuda-nvdisasm==13.2.*"
    fi
fi
export NVCC
echo "check-kernels: $("$NVCC" --version | tail -2 | head -1)" >&2

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
fail=0
printf '%-34s %-6s %5s %7s %s\n' kernel arch regs smem spill
# tests/softgpu/ptx_test.cu: the test kernels of kernels/ptx.cuh (its inline PTX for sm_80 / sm_90a).
for cu in "$ROOT"/kernels/*.cu "$ROOT"/tests/softgpu/ptx_test.cu; do
    name="$(basename "$cu" .cu)"
    if ! "$NVCC" -ptx -arch=compute_80 -I "$ROOT/kernels" -o "$OUT/$name.ptx" "$cu" 2>"$OUT/$name.ptx.log"; then
        echo "check-kernels: $name.cu: PTX compile error:" >&2
        cat "$OUT/$name.ptx.log" >&2
        fail=1
        continue
    fi
    for arch in sm_80 sm_90a; do
        log="$OUT/$name.$arch.log"
        if ! "$NVCC" -cubin -arch="$arch" -I "$ROOT/kernels" -Xptxas -v -o "$OUT/$name.$arch.cubin" "$cu" >"$log" 2>&1; then
            echo "check-kernels: $name.cu ($arch): compile error:" >&2
            cat "$log" >&2
            fail=1
            continue
        fi
        # ptxas prints, per entry: "Compiling entry function 'NAME' for 'ARCH'", then
        # "N bytes stack frame, S bytes spill stores, L bytes spill loads", then "Used R registers, ...".
        awk -v arch="$arch" '
            /Compiling entry function/ { match($0, /function .[A-Za-z0-9_]+/); fn = substr($0, RSTART + 10, RLENGTH - 10) }
            /spill stores/ { st = $5; ld = $9 }
            /Used [0-9]+ registers/ {
                match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
                smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
                printf "%-34s %-6s %5s %7s %s\n", fn, arch, regs, smem, st "/" ld
                if (st + 0 > 0 || ld + 0 > 0) { bad = 1 }
            }
            END { exit bad }
        ' "$log" || { echo "check-kernels: $name.cu ($arch): register spill (see table)" >&2; fail=1; }
        if grep -qi "warning" "$log"; then
            echo "check-kernels: $name.cu ($arch): warnings:" >&2
            grep -i "warning" "$log" >&2
        fi
    done
done
# Tensor-core instructions present where kernels/census.txt requires them, no local memory in
# hot kernels (sm_80 SASS).
"$ROOT/scripts/sass-census.sh" "$OUT"/*.sm_80.cubin || fail=1
if [[ $fail -ne 0 ]]; then
    echo "check-kernels: FAILED" >&2
    exit 1
fi
echo "check-kernels: all kernels compile for sm_80 and sm_90a without spills"
