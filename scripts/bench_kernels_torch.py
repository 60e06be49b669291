#!/usr/bin/env python3
"""PyTorch's timings at the shapes of `sorft bench kernels`, interleaved with sorft's own runs, and
the ratio of the two for each kernel (ratio > 1: sorft is faster).

    python3 scripts/bench_kernels_torch.py --sorft target/release/sorft [--rounds 2] > kernels.jsonl

Each round runs `sorft bench kernels` once and then PyTorch's side once, so that both sides see the
same machine state over the run; the medians over rounds are compared. Needs torch with CUDA (the
GPU machine's image has it); not needed by sorft or CI. Prints one JSON object per line: sorft's
lines (tagged "side": "sorft"), PyTorch's ("side": "torch") and a final "ratios" object.
"""
import argparse
import json
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

REPEATS = 25
WARMUP = 3


def timed(fn, inputs):
    """Median seconds of fn(inputs[i % n]) over REPEATS launches, CUDA events around each."""
    for i in range(WARMUP):
        fn(inputs[i % len(inputs)])
    times = []
    for i in range(REPEATS):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn(inputs[i % len(inputs)])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def copies(set_bytes):
    return max(1, min(8, -(-(200 << 20) // max(1, set_bytes))))


def rope(x, pos, hd, theta):
    t, d = x.shape
    h = d // hd
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    xv = x.view(t, h, hd).float()
    x1, x2 = xv[..., : hd // 2], xv[..., hd // 2:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype).view(t, d)


def sample_top_k_top_p(logits, temperature, k, p, gen):
    x = logits.float() / temperature
    vals, idx = torch.topk(x, k, dim=-1)
    probs = torch.softmax(vals, dim=-1)
    cum = probs.cumsum(-1)
    probs = probs.masked_fill(cum - probs > p, 0.0)
    choice = torch.multinomial(probs, 1, generator=gen)
    return idx.gather(-1, choice)


def token_logprobs(h, head, targets, chunk):
    out = []
    for s in range(0, h.shape[0], chunk):
        logits = (h[s:s + chunk] @ head.t()).float()
        lp = torch.log_softmax(logits, dim=-1)
        tg = targets[s:s + chunk].clamp(min=0)
        out.append(lp.gather(-1, tg[:, None])[:, 0])
    return torch.cat(out)


def torch_side():
    dev = "cuda"
    bf = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(42)
    rows = {}
    t, d = 16384, 4096
    xs = [torch.randn(t, d, device=dev, dtype=bf, generator=g) for _ in range(copies(t * d * 2))]
    w = torch.randn(d, device=dev, dtype=bf, generator=g)
    rows["rms_norm bf16 16384x4096"] = timed(lambda x: F.rms_norm(x, (d,), w, 1e-6), xs)
    rows["swiglu bf16 16384x4096"] = timed(lambda x: F.silu(x) * xs[0], xs)
    pos = torch.arange(t, device=dev)
    rows["rope bf16 16384x4096 hd128"] = timed(lambda x: rope(x, pos, 128, 1e6), xs)
    del xs
    seqs, ln = 4, 2048
    q = torch.randn(seqs, 32, ln, 128, device=dev, dtype=bf, generator=g)
    k = torch.randn(seqs, 8, ln, 128, device=dev, dtype=bf, generator=g)
    v = torch.randn(seqs, 8, ln, 128, device=dev, dtype=bf, generator=g)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        # GQA: expand K/V to the query heads (the flash backend needs equal head counts).
        ke = k.repeat_interleave(4, dim=1)
        ve = v.repeat_interleave(4, dim=1)
        rows["flash_fwd bf16 4x2048 h32/8 hd128"] = timed(
            lambda _: F.scaled_dot_product_attention(q, ke, ve, is_causal=True), [0])
        qg = q.clone().requires_grad_(True)
        kg = ke.clone().requires_grad_(True)
        vg = ve.clone().requires_grad_(True)
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        do = torch.randn_like(o)
        rows["flash_bwd bf16 4x2048 h32/8 hd128"] = timed(
            lambda _: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True), [0])
    del q, k, v, ke, ve, qg, kg, vg, o, do
    bsz, ctx = 64, 4096
    kc = torch.randn(bsz, 8, ctx, 128, device=dev, dtype=bf, generator=g)
    vc = torch.randn(bsz, 8, ctx, 128, device=dev, dtype=bf, generator=g)
    qd = torch.randn(bsz, 32, 1, 128, device=dev, dtype=bf, generator=g)
    rows["decode attention bf16 64x4096 h32/8 hd128"] = timed(
        lambda _: F.scaled_dot_product_attention(qd, kc, vc, enable_gqa=True), [0])
    del kc, vc, qd
    vocab = 151936
    logits = torch.randn(bsz, vocab, device=dev, dtype=bf, generator=g) * 3
    rows["sample bf16 64x151936 top-k 50 top-p 0.95"] = timed(
        lambda _: sample_top_k_top_p(logits, 0.8, 50, 0.95, g), [0])
    del logits
    tl, dl = 4096, 2048
    h = torch.randn(tl, dl, device=dev, dtype=bf, generator=g)
    head = torch.randn(vocab, dl, device=dev, dtype=bf, generator=g) * 0.02
    tg = (torch.arange(tl, device=dev) * 7) % vocab
    rows["token_logprobs bf16 4096x2048 V151936"] = timed(
        lambda _: token_logprobs(h, head, tg, 1024), [0])
    del h, head
    np_ = 64 << 20
    p = torch.zeros(np_, device=dev, requires_grad=True)
    p.grad = torch.zeros(np_, device=dev)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.0, fused=True)
    rows["adamw f32 64M params"] = timed(lambda _: opt.step(), [0])
    return rows


def sorft_side(binary):
    out = subprocess.run([binary, "bench", "kernels"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"sorft bench kernels failed: {out.stderr.strip().splitlines()[-1:]}")
    rows, lines = {}, []
    for ln in out.stdout.splitlines():
        obj = json.loads(ln)
        lines.append(obj)
        if "kernel" in obj:
            rows[obj["kernel"]] = obj["ms"] / 1e3
    return rows, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sorft", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    s_all, t_all = {}, {}
    for r in range(a.rounds):
        rows, lines = sorft_side(a.sorft)
        for obj in lines:
            print(json.dumps({"side": "sorft", "round": r, **obj}), flush=True)
        for k, v in rows.items():
            s_all.setdefault(k, []).append(v)
        trows = torch_side()
        for k, v in trows.items():
            print(json.dumps({"side": "torch", "round": r, "kernel": k, "ms": v * 1e3}), flush=True)
            t_all.setdefault(k, []).append(v)
    ratios = {}
    for k in s_all:
        if k in t_all:
            s, t = statistics.median(s_all[k]), statistics.median(t_all[k])
            ratios[k] = {"sorft_ms": s * 1e3, "torch_ms": t * 1e3, "speed_vs_torch": t / s}
    print(json.dumps({"ratios": ratios, "rounds": a.rounds, "torch": torch.__version__}))


if __name__ == "__main__":
    sys.exit(main())
