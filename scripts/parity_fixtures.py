#!/usr/bin/env python3
"""Creates the parity fixtures under tests/fixtures/parity with Hugging Face transformers.

Run by developers, not by CI (CI uses the committed outputs):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python scripts/parity_fixtures.py

With --train-only, the existing fixtures are kept and only the training references are (re)written.

Each variant is a tiny random model whose every parameter (norms and biases too) is re-initialised
randomly, saved with save_pretrained, plus reference.json: token sequences, the log-probability of
each token given its prefix (float64 log-softmax of float32 logits), and greedy continuations from
model.generate.

Training references (train_reference.json + train_grads.safetensors): for a fixed packed batch of
two sequences with prompt masks and per-sequence weights, the loss
    L = sum_t w_t * (-log p(target_t)) / N  +  beta * sum_t H_t / N
over the N trained tokens (H is the entropy of the next-token distribution), and the gradient of
every parameter (float32 autograd; a tied LM head adds into the embedding's gradient).
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
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


TRAIN_BETA = 0.1


def train_batch():
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, COMMON["vocab_size"], (n,), generator=gen).tolist() for n in (9, 20)]
    # mask[i] = 1: token i is trained on (predicted from its prefix).
    masks = [[0] * 3 + [1] * 6, [0] * 5 + [1] * 8 + [0] * 2 + [1] * 5]
    weights = [1.0, 0.5]
    return seqs, masks, weights


def record_train_reference(out, family, extra):
    """Loss and every parameter's gradient of the training reference batch for the model in out."""
    from safetensors.torch import load_file
    state = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors") and not f.startswith("train_"):
            state.update({k: v.float() for k, v in load_file(os.path.join(out, f)).items()})
    model = build(family, extra).float().train()
    model.load_state_dict(state, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    seqs, masks, weights = train_batch()
    n = sum(sum(m[1:]) for m in masks)
    model.zero_grad()
    total = 0.0
    for ids, mask, w in zip(seqs, masks, weights):
        logits = model(torch.tensor([ids])).logits[0]
        lsm = torch.log_softmax(logits[:-1], dim=-1)
        tgt = torch.tensor(ids[1:])
        m = torch.tensor(mask[1:], dtype=torch.float32)
        logp = lsm.gather(1, tgt[:, None])[:, 0]
        ent = -(lsm.exp() * lsm).sum(-1)
        loss = (-(w * m * logp).sum() + TRAIN_BETA * (m * ent).sum()) / n
        loss.backward()
        total += loss.item()
    grads = {}
    for name, p in model.named_parameters():
        grads[name] = p.grad.detach().clone().contiguous()
    save_file(grads, os.path.join(out, "train_grads.safetensors"))
    with open(os.path.join(out, "train_reference.json"), "w") as f:
        json.dump({"sequences": seqs, "masks": masks, "weights": weights, "beta": TRAIN_BETA,
                   "loss": total, "normaliser": n}, f)


def main():
    if "--train-only" in sys.argv:
        for name, family, extra, _ in VARIANTS:
            record_train_reference(os.path.join(ROOT, name), family, extra)
            print(name, "training reference written", file=sys.stderr)
        return
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
        record_train_reference(out, family, extra)
        print(name, "written", sorted(os.listdir(out)), file=sys.stderr)


if __name__ == "__main__":
    main()
