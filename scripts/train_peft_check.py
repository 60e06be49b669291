#!/usr/bin/env python3
"""Checks that a LoRA run of `sorft sft --lora R` is loadable by peft and transformers: the PEFT
adapter on the base model and the merged export give the same log-probabilities, and both match
`sorft score` on the merged export. Needs torch, transformers, peft (+ accelerate, psutil).

Usage: train_peft_check.py BASE_DIR OUT_DIR SORFT_BINARY
"""
import json
import subprocess
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def logprobs(model, ids):
    with torch.no_grad():
        lsm = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return [lsm[i - 1, ids[i]].item() for i in range(1, len(ids))]


def main():
    base_dir, out_dir, sorft = sys.argv[1:4]
    ids = [5, 17, 42, 99, 3, 250, 7, 11, 64, 128]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    base_lp = logprobs(base, ids)
    peft_model = PeftModel.from_pretrained(base, f"{out_dir}/adapter").eval()
    adapted = logprobs(peft_model, ids)
    merged = logprobs(AutoModelForCausalLM.from_pretrained(f"{out_dir}/final", dtype=torch.float32), ids)
    ours = json.loads(subprocess.check_output(
        [sorft, "score", "--model", f"{out_dir}/final", "--ids", ",".join(map(str, ids))]))["logprobs"][1:]
    moved = max(abs(a - b) for a, b in zip(adapted, base_lp))
    d_merge = max(abs(a - b) for a, b in zip(adapted, merged))
    d_sorft = max(abs(a - b) for a, b in zip(adapted, ours))
    print(json.dumps({"adapter_vs_base": moved, "peft_adapter_vs_merged": d_merge, "peft_adapter_vs_sorft_score": d_sorft}))
    assert moved > 1e-3, "the adapter does not change the model"
    assert d_merge < 1e-4 and d_sorft < 1e-4, "mismatch"
    print("ok: peft loads the adapter; adapter, merged export and sorft agree")


if __name__ == "__main__":
    main()
