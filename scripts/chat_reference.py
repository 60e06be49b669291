#!/usr/bin/env python3
"""Reference chat renderings for sorft's chat-template parity test (tests/model_chat.rs).

For a model directory and a JSON file of conversations, prints a JSON list with one case per
conversation and `add_generation_prompt` value: the text of transformers' `apply_chat_template`,
the ids the `tokenizers` library gives that text (no added special tokens, as
`apply_chat_template(tokenize=True)`), and, for templates with `{% generation %}` blocks,
transformers' assistant token mask.

Usage: chat_reference.py MODEL_DIR CONVERSATIONS.json
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def main() -> None:
    model_dir, conv_file = sys.argv[1], sys.argv[2]
    with open(conv_file, encoding="utf-8") as f:
        conversations = json.load(f)
    hf = AutoTokenizer.from_pretrained(model_dir)
    raw = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    template = hf.chat_template or ""
    out = []
    for i, messages in enumerate(conversations):
        for gen in (False, True):
            text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            case = {
                "conversation": i,
                "add_generation_prompt": gen,
                "text": text,
                "ids": raw.encode(text, add_special_tokens=False).ids,
            }
            if "{% generation %}" in template and not gen:
                enc = hf.apply_chat_template(
                    messages,
                    tokenize=True,
                    return_dict=True,
                    return_assistant_tokens_mask=True,
                )
                case["mask"] = list(enc["assistant_masks"])
            out.append(case)
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
