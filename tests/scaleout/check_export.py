"""Loads sorft's exports with pyarrow and checks the engines' layouts: veRL parquet columns and
types, OpenRLHF JSONL keys, and that both hold the same prompts and labels. Exits 1 on a problem."""

import json
import sys

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main(parquet_path, jsonl_path, input_key, label_key):
    t = pq.read_table(parquet_path)
    want = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    if t.column_names != want:
        fail(f"parquet columns {t.column_names}, want {want}")
    prompt_t = t.schema.field("prompt").type
    if not (pa.types.is_list(prompt_t) and pa.types.is_struct(prompt_t.value_type)):
        fail(f"prompt is {prompt_t}, want list<struct<role, content>>")
    if [f.name for f in prompt_t.value_type] != ["role", "content"]:
        fail(f"prompt messages {prompt_t.value_type}")
    rm_t = t.schema.field("reward_model").type
    if [f.name for f in rm_t] != ["style", "ground_truth"]:
        fail(f"reward_model is {rm_t}")
    ei = [f.name for f in t.schema.field("extra_info").type]
    for k in ("split", "index", "instance_id", "subtask"):
        if k not in ei:
            fail(f"extra_info lacks {k}: {ei}")
    rows = t.to_pylist()
    j = pj.read_json(jsonl_path)
    for k in (input_key, label_key):
        if k not in j.column_names:
            fail(f"JSONL lacks key {k}: {j.column_names}")
    jrows = j.to_pylist()
    if len(rows) != len(jrows) or not rows:
        fail(f"{len(rows)} parquet rows, {len(jrows)} JSONL rows")
    subtasks = set()
    for i, (r, jr) in enumerate(zip(rows, jrows)):
        msgs = r["prompt"]
        if len(msgs) != 1 or msgs[0]["role"] != "user" or not msgs[0]["content"]:
            fail(f"row {i}: prompt {str(msgs)[:80]}")
        if msgs[0]["content"] != jr[input_key]:
            fail(f"row {i}: parquet and JSONL prompts differ")
        if r["reward_model"]["style"] != "rule":
            fail(f"row {i}: style {r['reward_model']['style']}")
        gt = r["reward_model"]["ground_truth"]
        if gt != jr[label_key]:
            fail(f"row {i}: parquet and JSONL labels differ")
        label = json.loads(gt)
        if label["subtask"] != r["extra_info"]["subtask"] or r["ability"] != "swe_" + label["subtask"]:
            fail(f"row {i}: subtask {label['subtask']} vs {r['extra_info']} / {r['ability']}")
        if r["extra_info"]["index"] != i or r["data_source"] != "sorft":
            fail(f"row {i}: index {r['extra_info']['index']}, data_source {r['data_source']}")
        subtasks.add(label["subtask"])
    print(f"pyarrow {pa.__version__}: {len(rows)} rows, subtasks {sorted(subtasks)}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
