#!/usr/bin/env bash
# Host memory of full fine-tuning at a real size (issue 25): on a random-init model of
# Qwen2.5-0.5B's shape (494M parameters, vocabulary 151936), run
#   sorft sft --max-steps 3 --batch-tokens 256   (full fine-tuning, f32, one checkpoint at step 3)
# then resume it for one more step (a second checkpoint), and report peak RSS (getrusage, via
# /usr/bin/time), bytes per checkpoint, checkpoint write time (from the temporary directory's
# appearance to the final directory's, polled every 50 ms) and resume time (process start to the
# first step line, minus one step's time of the first run).
# Usage: scripts/mem_bench.sh SORFT_BINARY WORKDIR [LABEL]
# WORKDIR/model is created with `SORFT_BINARY model init --preset qwen2.5-0.5b-shape` when absent
# (a binary with that preset is needed for that; any binary can be measured on an existing one).
# Needs ~18 GB free memory before the change, ~9 GB after, and ~9 GB of disk; run it alone,
# nice'd. The run directory (~5.6 GB) is left for inspection; delete it afterwards.
set -euo pipefail
BIN=$(realpath "$1")
WORK=$(realpath -m "$2")
LABEL=${3:-$(basename "$BIN")}
mkdir -p "$WORK"
cd "$WORK"
if [ ! -f model/model.safetensors ]; then
  nice "$BIN" model init --preset qwen2.5-0.5b-shape --out model >/dev/null
fi
if [ ! -f data.jsonl ]; then
  for i in $(seq 1 200); do
    printf '{"messages":[{"role":"user","content":"Question %d: what does the function number %d in module %d return when it is called twice with the same arguments?"},{"role":"assistant","content":"It returns the same value %d both times, because it is a pure function without hidden state."}]}\n' \
      "$i" "$((i * 7))" "$((i % 13))" "$((i * 3))"
  done >data.jsonl
fi
RUN="run-$LABEL"
avail=$(df -Pk . | awk 'NR==2 {print $4}')
if [ "$avail" -lt $((9 * 1024 * 1024)) ]; then
  echo "mem_bench: need 9 GB free disk in $WORK (one checkpoint and room), have $((avail / 1024 / 1024)) GB" >&2
  exit 1
fi
rm -rf "$RUN" "$RUN.stop"
trap 'touch "$RUN.stop"' EXIT
stamp() { while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done; }
watch_ckpt() { # $1: step dir name; $2: a checkpoint to delete once $1's write begins (disk room)
  local s="" e=""
  while [ -z "$e" ] && [ ! -e "$RUN.stop" ]; do
    if [ -z "$s" ] && compgen -G "$RUN/checkpoints/.$1.tmp*" >/dev/null; then
      s=$(date +%s.%N)
      if [ -n "${2:-}" ]; then rm -rf "$RUN/checkpoints/$2"; fi
    fi
    if [ -d "$RUN/checkpoints/$1" ]; then e=$(date +%s.%N); fi
    sleep 0.05
  done
  echo "$s $e"
}
sft() { # $1: log name, rest: extra args
  local log=$1; shift
  local t0; t0=$(date +%s.%N)
  echo "$t0 start" >"$log.lines"
  nice /usr/bin/time -f '%M %e' -o "$log.time" "$BIN" --threads "$(nproc)" sft --model model \
    --data data.jsonl --out "$RUN" --max-steps "$MAXSTEPS" --batch-tokens 256 --no-progress "$@" \
    2> >(stamp >>"$log.lines") || { echo "sorft sft failed; see $WORK/$log.lines" >&2; tail -3 "$log.lines" >&2; exit 1; }
  sleep 1
}
MAXSTEPS=3
watch_ckpt step-00000003 >"$RUN.ckpt1" &
W=$!
sft first
wait $W
find "$RUN/checkpoints/step-00000003" -type f -printf '%s\n' | awk '{s+=$1} END {printf "%d\n", s}' >"$RUN.size1"
MAXSTEPS=4
# The resumed run has read step 3 when it starts writing step 4: step 3 is deleted then, so the
# benchmark needs room for one checkpoint (~5.6 GB) beside the model (~2 GB), not two.
watch_ckpt step-00000004 step-00000003 >"$RUN.ckpt2" &
W=$!
sft resume --resume
wait $W
python3 - "$RUN" "$LABEL" <<'PY'
import os, sys, glob
run, label = sys.argv[1], sys.argv[2]
def rss(log):
    kb, wall = open(f"{log}.time").read().split()[-2:]
    return int(kb) / 2**20, float(wall)
def steps(log):
    out = {}
    for l in open(f"{log}.lines"):
        t, rest = l.split(" ", 1)
        if rest.startswith("start"):
            out["start"] = float(t)
        elif rest.startswith("step ") and " loss " in rest:
            out[int(rest.split()[1])] = float(t)
    return out
s1, s2 = steps("first"), steps("resume")
step_s = (s1[3] - s1[1]) / 2
ck = [tuple(map(float, open(f"{run}.ckpt{i}").read().split())) for i in (1, 2)]
size = lambda d: int(float(open(f"{run}.size1").read())) if d == "step-00000003" else sum(os.path.getsize(p) for p in glob.glob(f"{run}/checkpoints/{d}/*"))
g1, w1 = rss("first"); g2, w2 = rss("resume")
print(f"[{label}] first run (3 steps + checkpoint): peak RSS {g1:.2f} GiB, wall {w1:.1f} s, step {step_s:.1f} s")
print(f"[{label}] checkpoint step 3: {size('step-00000003')/2**30:.3f} GiB on disk, write {ck[0][1]-ck[0][0]:.1f} s")
print(f"[{label}] resume run (1 step + checkpoint): peak RSS {g2:.2f} GiB, wall {w2:.1f} s, resume ~{s2[4]-s2['start']-step_s:.1f} s (start to step 4 minus one step)")
print(f"[{label}] checkpoint step 4: {size('step-00000004')/2**30:.3f} GiB on disk, write {ck[1][1]-ck[1][0]:.1f} s")
PY
