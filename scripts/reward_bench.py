"""Load generator of scripts/reward-bench.sh: rewards/s of a running `sorft serve-reward`.

Reads an OpenRLHF export (JSONL with `input` and `label`), builds answers from each label's ground
truth (right answers, and one wrong line appended to every other one), and sends them from
CLIENTS threads in requests of BATCH samples until ROUNDS requests per client are answered. Prints
one line: requests, rewards, seconds, rewards/s, p50/p99 request latency. Standard library only.
"""

import json
import sys
import threading
import time
import urllib.request


def answer(label):
    t = label["truth"]
    sub = label["subtask"]
    if sub == "file":
        return "\n".join(t["files"])
    if sub == "function":
        return "".join(f"{f['path']}\n{f['kind']}: {f['name']}\n" for f in t["functions"])
    if sub == "line":
        return "".join(f"{l['path']}\nline: {l['line']}\n" for l in t["lines"])
    out = []
    for b in t["edits"]:
        out.append(f"```python\n### {b['path']}\n<<<<<<< SEARCH\n{b['search']}=======\n{b['replace']}>>>>>>> REPLACE\n```\n")
    return "".join(out)


def main(url, jsonl, subtasks, clients, rounds, batch):
    rows = [json.loads(l) for l in open(jsonl, encoding="utf-8") if l.strip()]
    wanted = set(subtasks.split(","))
    samples = []
    for i, r in enumerate(rows):
        label = json.loads(r["label"])
        if label["subtask"] not in wanted:
            continue
        a = answer(label)
        if i % 2:
            a += "\nsomewhere/else.py\n"
        samples.append((a, r["label"]))
    if not samples:
        sys.exit(f"no {subtasks} rows in {jsonl}")
    lat, errors, done = [], [], [0]
    lock = threading.Lock()

    def client(c):
        for k in range(rounds):
            pick = [samples[(c * rounds * batch + k * batch + j) % len(samples)] for j in range(batch)]
            body = json.dumps({"query": [p[0] for p in pick], "prompts": [""] * batch,
                               "labels": [p[1] for p in pick]}).encode()
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            t = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    n = len(json.loads(resp.read())["rewards"])
            except Exception as e:  # counted, reported, fails the run
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                lat.append(time.perf_counter() - t)
                done[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    p = lambda q: 1e3 * lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] if lat else float("nan")
    print(f"subtasks={subtasks} clients={clients} batch={batch}: {len(lat)} requests, {done[0]} rewards "
          f"in {wall:.2f} s = {done[0] / wall:.1f} rewards/s; latency p50 {p(0.5):.1f} ms p99 {p(0.99):.1f} ms; "
          f"errors {len(errors)}")
    if errors:
        print("first error:", errors[0])
        sys.exit(1)


if __name__ == "__main__":
    url, jsonl, subtasks, clients, rounds, batch = sys.argv[1:7]
    main(url, jsonl, subtasks, int(clients), int(rounds), int(batch))
