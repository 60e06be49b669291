"""Checks that python/sorft_reward.py gives sorft's rewards: reads cases (JSONL of label, answer,
expected) and scores each through compute_score (one request each) and all through
compute_score_batch; exits 1 on any difference, printing the first few."""

import importlib.util
import json
import sys


def load(path):
    spec = importlib.util.spec_from_file_location("sorft_reward", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(module_path, cases_path):
    mod = load(module_path)
    cases = [json.loads(line) for line in open(cases_path, encoding="utf-8") if line.strip()]
    bad = []
    single = [mod.compute_score("sorft", c["answer"], c["label"], {"index": i}) for i, c in enumerate(cases)]
    batch = mod.compute_score_batch(
        ["sorft"] * len(cases), [c["answer"] for c in cases], [c["label"] for c in cases]
    )
    for i, c in enumerate(cases):
        for how, got in (("compute_score", single[i]), ("compute_score_batch", batch[i])):
            if abs(got["score"] - c["expected"]) > 1e-12 or abs(got["rule_reward"] - c["expected"]) > 1e-12:
                bad.append(f"case {i} ({c['kind']}) {how}: got {got['score']}, sorft says {c['expected']}")
    keys = {tuple(sorted(r)) for r in single + batch}
    if len(keys) != 1:
        bad.append(f"result dicts have differing keys: {keys}")
    for b in bad[:5]:
        print(b)
    print(f"{len(cases)} cases, {len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
