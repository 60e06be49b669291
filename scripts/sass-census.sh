#!/usr/bin/env bash
# Instruction census of compiled kernels: counts, per kernel, the tensor-core and memory
# instructions of its SASS (`cuobjdump -sass`) and checks them against kernels/census.txt, which
# names, per kernel (a regex on the name), the instructions it must contain (e.g. HMMA, LDSM,
# LDGSTS) and whether it may use local memory (LDL/STL). A kernel that loses its tensor-core
# instructions, or spills to local memory where it must not, fails.
#
# Usage: scripts/sass-census.sh [--spec FILE] FILE.cubin|FILE.cu...
#   .cu files are compiled for sm_80 first (with -I kernels/). Tools: $NVCC and cuobjdump beside
#   it (scripts/check-kernels.sh's venv, with nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${SORFT_NVCC_VENV:-/tmp/sorft-nvcc-venv}"
spec="$ROOT/kernels/census.txt"
if [[ "${1:-}" == --spec ]]; then spec=$2; shift 2; fi
[[ $# -gt 0 ]] || { echo "usage: scripts/sass-census.sh [--spec FILE] FILE.cubin|FILE.cu..." >&2; exit 2; }
if [[ -z "${NVCC:-}" ]]; then
    NVCC="$(ls "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -1 || true)"
fi
BIN="$(dirname "${NVCC:-/nonexistent/nvcc}")"
if [[ ! -x "$BIN/cuobjdump" || ! -x "$BIN/nvdisasm" ]]; then
    echo "sass-census: cuobjdump/nvdisasm not found beside nvcc ($BIN); run scripts/check-kernels.sh" >&2
    exit 1
fi
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
cubins=()
for f in "$@"; do
    case "$f" in
        *.cu)
            c="$OUT/$(basename "$f" .cu).sm_80.cubin"
            "$NVCC" -cubin -arch=sm_80 -I "$ROOT/kernels" -o "$c" "$f"
            cubins+=("$c")
            ;;
        *) cubins+=("$f") ;;
    esac
done
# One line per kernel: name HMMA LDSM LDGSTS LOCAL(LDL+STL)
for c in "${cubins[@]}"; do
    PATH="$BIN:$PATH" "$BIN/cuobjdump" -sass "$c"
done | awk '
    /Function : / { name = $3; order[++n] = name; next }
    name == "" { next }
    / HMMA/ { hmma[name]++ }
    / LDSM/ { ldsm[name]++ }
    / LDGSTS/ { ldgsts[name]++ }
    / (LDL|STL)[ .]/ { local_[name]++ }
    END { for (i = 1; i <= n; i++) { k = order[i]; print k, hmma[k] + 0, ldsm[k] + 0, ldgsts[k] + 0, local_[k] + 0 } }
' >"$OUT/census"
printf '%-34s %5s %5s %6s %5s\n' kernel HMMA LDSM LDGSTS local
awk '{ printf "%-34s %5s %5s %6s %5s\n", $1, $2, $3, $4, $5 }' "$OUT/census"
# The spec: lines "REGEX REQUIRED[,REQUIRED...]|- local|nolocal"; every kernel matching REGEX
# must contain each REQUIRED instruction, and with nolocal no LDL/STL.
awk -v specfile="$spec" '
    BEGIN {
        while ((getline line < specfile) > 0) {
            if (line ~ /^[ \t]*(#|$)/) continue
            split(line, f, /[ \t]+/)
            ns++; re[ns] = f[1]; req[ns] = f[2]; loc[ns] = f[3]; seen[ns] = 0
        }
        col["HMMA"] = 2; col["LDSM"] = 3; col["LDGSTS"] = 4
    }
    {
        for (i = 1; i <= ns; i++) {
            if ($1 !~ ("^" re[i] "$")) continue
            seen[i]++
            if (req[i] != "-") {
                m = split(req[i], r, ",")
                for (j = 1; j <= m; j++)
                    if (!(r[j] in col)) { print "sass-census: unknown instruction " r[j] " in the spec" > "/dev/stderr"; bad = 1 }
                    else if ($(col[r[j]]) == 0) { print "sass-census: kernel " $1 " has no " r[j] " instruction (required by the census spec)" > "/dev/stderr"; bad = 1 }
            }
            if (loc[i] == "nolocal" && $5 > 0) { print "sass-census: kernel " $1 " uses local memory (" $5 " LDL/STL)" > "/dev/stderr"; bad = 1 }
        }
    }
    END {
        for (i = 1; i <= ns; i++)
            if (!seen[i]) { print "sass-census: no kernel matches " re[i] " of the census spec" > "/dev/stderr"; bad = 1 }
        exit bad
    }
' "$OUT/census" || { echo "sass-census: FAILED" >&2; exit 1; }
echo "sass-census: every kernel has the instructions its spec requires"
