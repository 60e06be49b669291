"""sorft's rewards for veRL: a custom reward function that asks `sorft serve-reward`.

veRL calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` once per response
(``custom_reward_function.path=<this file>``, ``custom_reward_function.name=compute_score``); the
ground truth is the sorft reward label that ``sorft export --format verl`` wrote into
``reward_model.ground_truth``. The score comes from the service, so veRL gets exactly the numbers
sorft trains with (rule rewards, and the sandbox's execution reward for edits when the service was
started with ``--instances/--repos``). ``compute_score_batch`` scores many responses in one request
(veRL's batch reward manager).

Environment:
  SORFT_REWARD_URL      the service (default http://127.0.0.1:8000)
  SORFT_REWARD_TIMEOUT  seconds per request (default 300)
  SORFT_REWARD_RETRIES  tries on an unreachable or busy (503) service (default 8)

Only the standard library is used.
"""

import json
import os
import time
import urllib.error
import urllib.request

# The keys of every returned dict, in every mode (veRL gathers each key over the batch).
_RULE_KEYS = ("rule_reward", "precision", "recall", "format_error", "invented_target")


class SorftRewardError(RuntimeError):
    """The service refused a request (a malformed label, ...) or could not be reached."""


def _url():
    return os.environ.get("SORFT_REWARD_URL", "http://127.0.0.1:8000").rstrip("/") + "/"


def _post(payload):
    body = json.dumps(payload).encode("utf-8")
    timeout = float(os.environ.get("SORFT_REWARD_TIMEOUT", "300"))
    tries = max(1, int(os.environ.get("SORFT_REWARD_RETRIES", "8")))
    last = None
    for attempt in range(tries):
        req = urllib.request.Request(
            _url(), data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            if e.code != 503:
                raise SorftRewardError(f"sorft serve-reward answered {e.code}: {detail}") from None
            last = f"503: {detail}"
            wait = float(e.headers.get("Retry-After") or 1)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            last = str(e)
            wait = min(0.2 * 2**attempt, 5.0)
        time.sleep(wait)
    raise SorftRewardError(f"sorft serve-reward at {_url()} not reachable after {tries} tries: {last}")


def _results(resp, n):
    rewards = resp.get("rewards")
    if not isinstance(rewards, list) or len(rewards) != n:
        raise SorftRewardError(f"answer without {n} rewards: {str(resp)[:200]}")
    logs = resp.get("extra_logs") or {}
    out = []
    for i in range(n):
        r = {"score": float(rewards[i])}
        for k in _RULE_KEYS + tuple(k for k in ("executed", "resolved") if k in logs):
            r[k] = float(logs[k][i])
        out.append(r)
    return out


def _label(ground_truth):
    # veRL hands the parquet cell over as stored: the label's JSON text.
    if isinstance(ground_truth, (dict, list)):
        return json.dumps(ground_truth)
    return ground_truth


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The reward of one response, with sorft's breakdown (veRL logs the extra keys)."""
    payload = {"query": [solution_str], "prompts": [""], "labels": [_label(ground_truth)]}
    return _results(_post(payload), 1)[0]


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs):
    """The rewards of many responses in one request, in order."""
    n = len(solution_strs)
    payload = {
        "query": list(solution_strs),
        "prompts": [""] * n,
        "labels": [_label(g) for g in ground_truths],
    }
    return _results(_post(payload), n)
