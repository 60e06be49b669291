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
#                                runs, each step with its own time limit and all of them within
#                                GPU_CHECK_BUDGET seconds (default 500; later steps are skipped):
#                                doctor; selftest --device cuda; selftest --attention full (the
#                                tensor-core attention); `sorft bench kernels` alternating with
#                                PyTorch at the same shapes (scripts/bench_kernels_torch.py); a
#                                Qwen2.5-Coder-7B-shaped model with random bf16 weights (bench
#                                model --random-config); repro --quick on --device cuda and cpu;
#                                two LoRA GRPO steps on a 0.5B-shaped model directory;
#                                compute-sanitizer memcheck on selftest --quick --no-model;
#                                selftest --realistic; selftest --gemm builtin.
#                                GPU_CHECK_STEPS picks steps (comma list). $OUT
#                                (default ./gpu-check-out) gets summary.txt and results.tar.gz
#                                (every step's output). Exits non-zero if the selftest fails.
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
    work="$(mktemp -d /tmp/gpu-check.XXXXXX)"
    [[ -x "$bin" ]] || { echo "gpu-check: $bin not found (run 'scripts/gpu-check.sh build' first)" >&2; exit 1; }
    # What to run: GPU_CHECK_STEPS, a comma list of doctor,selftest,attn,bench,big,repro,resume,lora,memcheck,realistic,builtin
    # (default: all). GPU_CHECK_BUDGET (s, default 500) skips the steps that would start after it.
    steps=",${GPU_CHECK_STEPS:-doctor,selftest,attn,bench,big,repro,resume,lora,memcheck,realistic,builtin},"
    budget="${GPU_CHECK_BUDGET:-500}"
    t0=$SECONDS
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
    echo "gpu-check: CUDA libraries from: ${libdirs:-none found}" | tee "$work/libraries.txt"
    : >"$work/summary.txt"
    # step NAME TIMEOUT CMD...: runs CMD with its output in $work/NAME.txt, records the exit code.
    step() {
        local name="$1" limit="$2"; shift 2
        if [[ "$steps" != *",${name%%-*},"* ]]; then return 0; fi
        local el=$((SECONDS - t0))
        if (( el + 10 > budget )); then
            echo "$name skipped (budget: ${el}s of ${budget}s used)" | tee -a "$work/summary.txt"
            return 0
        fi
        local rc=0 s=$SECONDS
        timeout "$limit" "$@" >"$work/$name.txt" 2>&1 || rc=$?
        echo "$name exit $rc ($((SECONDS - s)) s)" | tee -a "$work/summary.txt"
        tail -n 4 "$work/$name.txt"
    }
    nvidia-smi -q >"$work/nvidia-smi.txt" 2>&1 || true
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv >>"$work/summary.txt" 2>&1 || true
    step doctor 60 "$bin" doctor
    step selftest 200 "$bin" selftest --device cuda
    # The tensor-core attention against the CPU backend at realistic shapes (hd 128, 28/4 heads,
    # long packed sequences, logits to about +-25).
    step attn 150 "$bin" selftest --device cuda --attention full
    # Kernel timings beside PyTorch at the same shapes, the two sides alternating.
    step bench 240 python3 "$ROOT/scripts/bench_kernels_torch.py" --sorft "$bin" --rounds 2
    # Qwen2.5-Coder-7B's shape with random bf16 weights made in memory (no download): prefill,
    # decode at batch 1 and 64, and a group rollout with and without the shared prefill.
    step big-7b 200 "$bin" bench model --random-config "$ROOT/tests/fixtures/qwen2.5-coder-7b/config.json" --device cuda --prompt-len 1024 --new-tokens 64 --batch 1,64 --repeats 2 --group 4 --group-prompts 8
    # The whole loop on the GPU and on the CPU (its data feeds the LoRA RL step below).
    step repro-cuda 150 "$bin" repro --quick --device cuda --out "$work/repro-cuda"
    step repro-cpu 150 "$bin" repro --quick --device cpu --out "$work/repro-cpu"
    # Exact resume of bf16 training: a run stopped after 2 steps and resumed must end with the
    # same weights as one that never stopped (fp32 master weights and f32 moments in the
    # checkpoint). Prints "resume: identical" or "resume: DIFFERENT".
    step resume "${GPU_CHECK_RESUME_LIMIT:-120}" bash -c '
        set -e; bin="$1"; w="$2"
        "$bin" model init --preset tiny --out "$w/rs-base" --seed 1 >/dev/null
        for i in $(seq 48); do
            printf "{\"messages\":[{\"role\":\"user\",\"content\":\"item %d says?\"},{\"role\":\"assistant\",\"content\":\"value %d\"}]}\n" "$i" "$((i % 7))"
        done >"$w/rs-data.jsonl"
        sft() { "$bin" sft --device cuda --dtype bf16 --model "$w/rs-base" --data "$w/rs-data.jsonl" \
            --epochs 1 --batch-tokens 512 --lr 2e-4 --seed 5 --save-every 0 --eval-fraction 0 \
            --no-progress "$@" >/dev/null; }
        sft --out "$w/rs-whole"
        sft --out "$w/rs-split" --max-steps 2
        sft --out "$w/rs-split" --resume
        if cmp -s "$w/rs-whole/final/model.safetensors" "$w/rs-split/final/model.safetensors"; then
            echo "resume: identical"
        else
            echo "resume: DIFFERENT"; exit 1
        fi
        rm -rf "$w"/rs-*' _ "$bin" "$work"
    # LoRA GRPO on a Qwen2.5-0.5B-shaped model directory (bf16 base, fp32 adapters, the base
    # with adapters off as the reference): step time, tokens/s and memory in metrics.jsonl.
    step lora-init 120 "$bin" model init --preset qwen2.5-0.5b-shape --out "$work/m05"
    if [[ -d "$work/repro-cuda/data" && -d "$work/m05" ]]; then
        step lora-rl 150 "$bin" rl --device cuda --model "$work/m05" --lora 16 --steps 2 \
            --instances "$work/repro-cuda/data/train.jsonl" --repos "$work/repro-cuda/data/repos" \
            --out "$work/lora-rl"
        [[ -f "$work/lora-rl/metrics.jsonl" ]] && cp "$work/lora-rl/metrics.jsonl" "$work/lora-rl-metrics.jsonl"
        rm -rf "$work/lora-rl/checkpoints" "$work/lora-rl/final"
    fi
    rm -rf "$work/m05"
    if command -v compute-sanitizer >/dev/null; then
        step memcheck 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin" selftest --device cuda --quick --no-model
    else
        echo "memcheck skipped (no compute-sanitizer)" | tee -a "$work/summary.txt"
    fi
    # Realistic shapes at full size (T 4096, vocabulary 151,936), and every check again with the
    # built-in tiled GEMM forced instead of cuBLAS.
    step realistic 150 "$bin" selftest --device cuda --realistic --no-model
    step builtin 200 "$bin" selftest --device cuda --gemm builtin
    echo "total $((SECONDS - t0)) s" | tee -a "$work/summary.txt"
    cp "$work/summary.txt" "$out/summary.txt"
    tar -C "$work" -czf "$out/results.tar.gz" .
    grep -q '^selftest exit 0' "$work/summary.txt"
    ;;
*)
    echo "usage: scripts/gpu-check.sh build|run" >&2
    exit 2
    ;;
esac
