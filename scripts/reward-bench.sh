#!/usr/bin/env bash
# Benchmark (not a test) of `sorft serve-reward`: rewards/s with rule rewards only and with sandbox
# execution of edits, on this machine, over loopback. Makes its own synthetic data.
#   scripts/reward-bench.sh            # uses target/release/sorft, else target/debug/sorft
#   SORFT_BIN=path/to/sorft N=24 WORKERS=2 scripts/reward-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tgt="${CARGO_TARGET_DIR:-target}"
bin="${SORFT_BIN:-}"
[ -n "$bin" ] || { [ -x "$tgt/release/sorft" ] && bin="$tgt/release/sorft"; } || true
[ -n "$bin" ] || bin="$tgt/debug/sorft"
[ -x "$bin" ] || { echo "no sorft binary at $bin (cargo build --release, or set SORFT_BIN)" >&2; exit 1; }
n="${N:-24}"; workers="${WORKERS:-$(nproc)}"
work="$(mktemp -d)"; pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
echo "binary: $bin ($("$bin" --version)); $(nproc) cores; workers $workers; $n instances"
"$bin" data synth --n "$n" --seed 7 --out "$work/d" >/dev/null
"$bin" export --format openrlhf --instances "$work/d/instances.jsonl" --repos "$work/d/repos" --out "$work/x" >/dev/null

serve() {  # start the service with extra flags; sets $pid and $url
  "$bin" serve-reward --port 0 --workers "$workers" --queue 1024 "$@" >"$work/serve.log" &
  pid=$!
  for _ in $(seq 100); do grep -q listening "$work/serve.log" 2>/dev/null && break; sleep 0.1; done
  url="$(grep -o 'http://[0-9.:]*' "$work/serve.log" | head -1)/"
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=""; tail -1 "$work/serve.log"; }

echo "== rule rewards only"
serve
python3 scripts/reward_bench.py "$url" "$work/x/train.jsonl" file,function,line,edit 8 50 64
python3 scripts/reward_bench.py "$url" "$work/x/train.jsonl" file,function,line,edit 8 400 1
stop
echo "== edits with sandbox execution (gold edit or gold edit + noise; tests run per answer)"
serve --instances "$work/d/instances.jsonl" --repos "$work/d/repos"
python3 scripts/reward_bench.py "$url" "$work/x/train.jsonl" edit "$workers" 6 1
stop
