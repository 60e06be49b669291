#!/usr/bin/env python3
"""Prefill and greedy-decode throughput of sorft against PyTorch + HF transformers on the CPU,
same model, same machine, same thread count, interleaved in one run; prints ratios.

    /path/to/venv/bin/python scripts/bench_vs_torch.py [--model DIR] [--threads N] [--rounds R]

The model defaults to the `small` preset created by `sorft model init`. Needs torch and
transformers in the running interpreter (not needed by sorft itself or by CI).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def torch_bench(model, vocab, prompt_len, new_tokens, batches, repeats):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=g)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            model(prompt)
            times.append(time.perf_counter() - t)
    prefill = prompt_len / statistics.median(times[1:])
    decode = {}
    for b in batches:
        ids = torch.stack([(prompt[0, :16] + i) % vocab for i in range(b)])
        times = []
        with torch.inference_mode():
            for _ in range(min(repeats, 3) + 1):
                t = time.perf_counter()
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
                times.append(time.perf_counter() - t)
        decode[f"batch_{b}"] = b * new_tokens / statistics.median(times[1:])
    return {"prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--sorft", default=os.path.join(ROOT, "target", "release", "sorft"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    model_dir = args.model
    if model_dir is None:
        model_dir = tempfile.mkdtemp(prefix="sorft-small-")
        subprocess.run([args.sorft, "model", "init", "--preset", "small", "--out", model_dir, "--seed", "1"],
                       check=True, stdout=subprocess.DEVNULL)
    torch.set_num_threads(args.threads)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    batches = [1, 8]
    ours, theirs = [], []
    for _ in range(args.rounds):
        out = subprocess.run([args.sorft, "--threads", str(args.threads), "bench", "model", "--model", model_dir,
                              "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
                              "--batch", ",".join(map(str, batches)), "--repeats", "5"],
                             check=True, capture_output=True, text=True).stdout
        ours.append(json.loads(out))
        theirs.append(torch_bench(hf, vocab, args.prompt_len, args.new_tokens, batches, 5))

    def med(rows, key, sub=None):
        return statistics.median(r[key][sub] if sub else r[key] for r in rows)

    print(f"machine: {os.cpu_count()} cpus, threads {args.threads}, torch {torch.__version__}, rounds {args.rounds}")
    print(f"{'measure':<28}{'sorft':>12}{'pytorch':>12}{'ratio':>8}")
    rows = [("prefill tok/s (512)", "prefill_tokens_per_s", None)]
    rows += [(f"decode tok/s batch {b}", "decode_tokens_per_s", f"batch_{b}") for b in batches]
    result = {}
    for name, key, sub in rows:
        a, b = med(ours, key, sub), med(theirs, key, sub)
        result[name] = {"sorft": a, "pytorch": b, "ratio": a / b}
        print(f"{name:<28}{a:>12.0f}{b:>12.0f}{a / b:>8.2f}")
    json.dump(result, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
