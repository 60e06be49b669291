#!/usr/bin/env bash
# Training tokens/s of the `small` preset: sorft (benches/train.rs) against PyTorch on the same CPU,
# the same threads, model and batch, in the same run, alternating and keeping each one's best
# median. Usage: scripts/train_bench.sh [THREADS] [SEQS] [LEN] [STEPS] [ROUNDS]
# PYTHON defaults to /work/pyenv/bin/python (needs torch + transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
SEQS=${2:-4}
LEN=${3:-256}
STEPS=${4:-5}
ROUNDS=${5:-2}
PYTHON=${PYTHON:-/work/pyenv/bin/python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cargo build --release --quiet
target/release/sorft model init --preset small --out "$TMP/small" --seed 0 >/dev/null
cargo bench --bench train --no-run --quiet 2>/dev/null
for r in $(seq "$ROUNDS"); do
  RAYON_NUM_THREADS=$THREADS SORFT_BENCH_MODEL="$TMP/small" SORFT_BENCH_SEQS=$SEQS \
    SORFT_BENCH_LEN=$LEN SORFT_BENCH_STEPS=$STEPS cargo bench --bench train --quiet 2>/dev/null \
    | tee -a "$TMP/sorft.jsonl"
  OMP_NUM_THREADS=$THREADS "$PYTHON" scripts/train_bench_torch.py "$TMP/small" "$SEQS" "$LEN" "$STEPS" "$THREADS" \
    2>/dev/null | tee -a "$TMP/torch.jsonl"
done
"$PYTHON" - "$TMP/sorft.jsonl" "$TMP/torch.jsonl" <<'PY'
import json, sys
best = lambda p: max((json.loads(l) for l in open(p) if l.strip()), key=lambda r: r["tokens_per_s"])
s, t = best(sys.argv[1]), best(sys.argv[2])
print(f"small preset, {s['tokens_per_step']} tokens/step, {s['threads']} threads")
print(f"sorft   {s['tokens_per_s']:9.0f} tokens/s  peak RSS {s['peak_rss_mib']:.0f} MiB (saved activations {s.get('activations_mib', 0):.0f} MiB)  loss {s['loss_last']:.4f}")
print(f"pytorch {t['tokens_per_s']:9.0f} tokens/s  peak RSS {t['peak_rss_mib']:.0f} MiB  loss {t['loss_last']:.4f}")
print(f"ratio sorft/pytorch: {s['tokens_per_s'] / t['tokens_per_s']:.2f}x")
PY
