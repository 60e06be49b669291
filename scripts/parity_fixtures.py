#!/usr/bin/env python3
"""Creates the parity fixtures under tests/fixtures/parity with Hugging Face transformers.

Run by developers, not by CI (CI uses the committed outputs):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python scripts/parity_fixtures.py

Each variant is a tiny random model whose every parameter (norms and biases too) is re-initialised
randomly, saved with save_pretrained, plus reference.json: token sequences, the log-probability of
each token given its prefix (float64 log-softmax of float32 logits), and greedy continuations from
model.generate.
"""
import json
import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "parity")

COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

VARIANTS = [
    # name, family, extra config, save options
    ("qwen2_gqa_tied", "qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=5000.0), {}),
    ("qwen2_mha_untied_sharded", "qwen2", dict(num_key_value_heads=4, tie_word_embeddings=False, rope_theta=10000.0), {"max_shard_size": "40KB"}),
    ("llama_mha_untied", "llama", dict(num_key_value_heads=4, tie_word_embeddings=False, attention_bias=False, rope_theta=10000.0), {}),
    ("llama_gqa_bias_tied", "llama", dict(num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, rope_theta=20000.0), {}),
    ("qwen2_bf16", "qwen2", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0), {"dtype": torch.bfloat16}),
]


def build(family, extra):
    if family == "qwen2":
        cfg = Qwen2Config(**COMMON, **extra)
        cls = Qwen2ForCausalLM
    else:
        cfg = LlamaConfig(**COMMON, **extra)
        cls = LlamaForCausalLM
    cfg._attn_implementation = "eager"
    return cls(cfg)


def reinit(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    seq_gen = torch.Generator().manual_seed(99)
    sequences = [torch.randint(0, COMMON["vocab_size"], (n,), generator=seq_gen).tolist() for n in (2, 7, 16, 45)]
    for name, family, extra, save in VARIANTS:
        model = build(family, extra).float().eval()
        reinit(model, gen)
        out = os.path.join(ROOT, name)
        dtype = save.get("dtype")
        if dtype is not None:
            model = model.to(dtype)
        kwargs = {"safe_serialization": True}
        if "max_shard_size" in save:
            kwargs["max_shard_size"] = save["max_shard_size"]
        model.save_pretrained(out, **kwargs)
        # The reference runs in float32 on exactly the stored weights, in a fresh float32 model
        # (a model cast to bf16 and back would keep bf16-rounded RoPE frequencies).
        state = {k: v.float() for k, v in model.state_dict().items()}
        model = build(family, extra).float().eval()
        model.load_state_dict(state)
        ref = {"sequences": sequences, "logprobs": [], "greedy": []}
        with torch.no_grad():
            for ids in sequences:
                logits = model(torch.tensor([ids])).logits[0].double()
                lsm = torch.log_softmax(logits, dim=-1)
                ref["logprobs"].append([None] + [lsm[i - 1, ids[i]].item() for i in range(1, len(ids))])
            for ids in sequences[1:3]:
                g = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                   min_new_tokens=12, pad_token_id=0)
                ref["greedy"].append({"prompt": ids, "output": g[0, len(ids):].tolist()})
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f)
        print(name, "written", sorted(os.listdir(out)), file=sys.stderr)


if __name__ == "__main__":
    main()
