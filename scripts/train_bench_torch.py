#!/usr/bin/env python3
"""The PyTorch side of scripts/train_bench.sh: the same full fine-tuning step (forward, token
cross-entropy, backward, AdamW) on the same model directory and the same packed tokens as
benches/train.rs, in float32, with the same thread count. Prints one JSON line.

Usage: train_bench_torch.py MODEL_DIR SEQS LEN STEPS THREADS
"""
import json
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    model_dir, n_seq, length, steps, threads = sys.argv[1], *map(int, sys.argv[2:6])
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    v = model.config.vocab_size
    ids = torch.tensor([[(s * 7919 + i * 104729 + 13) % v for i in range(length)] for s in range(n_seq)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    times = []
    loss = None
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    tokens = n_seq * length
    print(json.dumps({
        "impl": "pytorch " + torch.__version__,
        "attn": getattr(model.config, "_attn_implementation", "?"),
        "threads": torch.get_num_threads(),
        "tokens_per_step": tokens,
        "step_s_median": med,
        "step_s_best": times[0],
        "tokens_per_s": tokens / med,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "loss_last": loss.item(),
    }))


if __name__ == "__main__":
    main()
