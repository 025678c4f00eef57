"""`bench quality`'s report: the run's summary (exact match, pass@1, decoded tokens), its JSON, and two runs
compared task by task."""

from __future__ import annotations

from typing import Any

import orjson


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(results)
    exact = sum(r["exact"] for r in results)
    out: dict[str, Any] = {"tasks": n, "exact": exact, "exact_rate": exact / n if n else None,
                           "repeats_suffix": sum(bool(r.get("repeats_suffix")) for r in results)}  # fmt: skip
    decoded = [r["decoded_tokens"] for r in results if isinstance(r.get("decoded_tokens"), int)]
    if decoded:
        out["decoded_tokens"] = sum(decoded)
        out["decoded_tokens_per_task"] = sum(decoded) / len(decoded)
    if results and "passed" in results[0]:
        passed = sum(r["passed"] for r in results)
        out.update(passed=passed, pass_at_1=passed / n)
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Task by task: what B got wrong that A got right (worse), and the other way round."""
    key = "passed" if all("passed" in r for r in a["tasks"] + b["tasks"]) else "exact"
    by_id = {r["id"]: r for r in b["tasks"]}
    common = [r for r in a["tasks"] if r["id"] in by_id]
    worse = [r["id"] for r in common if r[key] and not by_id[r["id"]][key]]
    better = [r["id"] for r in common if not r[key] and by_id[r["id"]][key]]
    return {"scored_by": key, "common_tasks": len(common), "worse": worse, "better": better}


def as_json(meta: dict[str, Any], results: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({**meta, "summary": summary(results), "tasks": results}, option=orjson.OPT_INDENT_2)
