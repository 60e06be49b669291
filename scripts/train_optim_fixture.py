#!/usr/bin/env python3
"""Writes tests/fixtures/train/adamw.json: torch.optim.AdamW with global-norm clipping over a few
steps (a matrix with weight decay, a vector without, as sorft's optimizer treats 1-D parameters),
with given per-step learning rates. Run: /work/pyenv/bin/python scripts/train_optim_fixture.py
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "train", "adamw.json")


def main():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 4, generator=g)
    b = torch.randn(4, generator=g)
    grads = [(torch.randn(3, 4, generator=g) * s, torch.randn(4, generator=g) * s) for s in (1.0, 0.05, 3.0, 0.2)]
    lrs = [0.01, 0.02, 0.015, 0.005]
    pw, pb = w.clone().requires_grad_(), b.clone().requires_grad_()
    opt = torch.optim.AdamW([{"params": [pw], "weight_decay": 0.1}, {"params": [pb], "weight_decay": 0.0}],
                            lr=lrs[0], betas=(0.9, 0.95), eps=1e-8)
    norms = []
    for (gw, gb), lr in zip(grads, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        pw.grad, pb.grad = gw.clone(), gb.clone()
        norms.append(torch.nn.utils.clip_grad_norm_([pw, pb], 1.0).item())
        opt.step()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({
            "w": w.flatten().tolist(), "b": b.tolist(),
            "grads_w": [x.flatten().tolist() for x, _ in grads], "grads_b": [y.tolist() for _, y in grads],
            "lrs": lrs, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "max_grad_norm": 1.0,
            "norms": norms, "final_w": pw.detach().flatten().tolist(), "final_b": pb.detach().tolist(),
        }, f)


if __name__ == "__main__":
    main()
