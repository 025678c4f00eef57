"""`mellum-proxy stats [LOG.jsonl]`: what a request log says, at a glance or as JSON.

Without a file, the log `serve` writes with the same settings (by default `requests.jsonl` in the user's
state folder). Malformed lines are counted and reported, never fatal.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

LATENCIES = ("ttft_ms", "total_ms", "queue_ms")
QUANTILES = (50, 90, 99)


def log_to_read(given: Path | None) -> Path:
    """`given`, else the request log `serve` writes with the settings in force (environment, config file).

    Raises:
        ValueError: no file given, and the log is off or not written yet (the message says which).
    """
    if given is not None:
        return given
    from mellum_proxy.settings_file import load_settings

    path = load_settings({}).log
    if path is None:
        raise ValueError("the request log is off (log = off): give a log file")
    if not path.is_file():
        raise ValueError(f"no request log at {path} yet: `mellum-proxy serve` writes one there; or give a file")
    return path


def read_log(path: Path, every_lane: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The records of a JSONL log, its rotated files' first, and how many lines were not records. A suggestion's
    `acceptance` line (written once the session's later requests settled it) gives its record `accepted_chars`.
    The completions' records only, unless `every_lane` (bulk requests, chat and agents, have figures of their own
    that would muddle a completion's: `stats --by lane` shows them)."""
    records: list[dict[str, Any]] = []
    judged: dict[str, dict[str, Any]] = {}
    malformed = 0
    for part in log_files(path):
        malformed += _read_part(part, records, judged)
    if not every_lane:
        records = [record for record in records if record.get("lane", "completion") == "completion"]
    for record in records:
        if (acceptance := judged.get(str(record.get("id")))) is not None:
            record["accepted_chars"] = acceptance.get("accepted_chars")
    return records, malformed


def log_files(path: Path) -> list[Path]:
    """A log's files, oldest first: those rotated out of it (`FILE.N` ... `FILE.1`), then `FILE` itself."""
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()), key=lambda p: -int(p.suffix[1:])
    )
    return [*rotated, path] if path.exists() or not rotated else rotated


def _read_part(path: Path, records: list[dict[str, Any]], judged: dict[str, dict[str, Any]]) -> int:
    malformed = 0
    with path.open("rb") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                malformed += 1
                continue
            if isinstance(record, dict) and record.get("event", "request") == "request" and "outcome" in record:
                records.append(record)
            elif isinstance(record, dict) and record.get("event") == "acceptance" and isinstance(record.get("id"), str):
                judged[record["id"]] = record
            else:
                malformed += 1
    return malformed


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts per outcome, latency percentiles, truncation share, VRAM peak, upstream requests per request."""
    rows = list(records)
    summary: dict[str, Any] = {"requests": len(rows), "outcomes": dict(Counter(str(r.get("outcome")) for r in rows))}
    for field in LATENCIES:
        values = [float(r[field]) for r in rows if isinstance(r.get(field), int | float)]
        summary[field] = {f"p{q}": percentile(values, q) for q in QUANTILES}
    flagged = [r["truncated"] for r in rows if isinstance(r.get("truncated"), bool)]
    summary["truncated_share"] = sum(flagged) / len(flagged) if flagged else None
    peaks = [float(r["vram_peak_mib"]) for r in rows if isinstance(r.get("vram_peak_mib"), int | float)]
    summary["vram_peak_mib"] = max(peaks) if peaks else None
    reached = sum(1 for r in rows if r.get("reached_upstream"))
    summary["upstream_requests"] = reached
    summary["upstream_per_request"] = reached / len(rows) if rows else None
    kept = [r["accepted_chars"] for r in rows if isinstance(r.get("accepted_chars"), int)]
    summary["suggestions_judged"] = len(kept)
    summary["acceptance_rate"] = sum(1 for n in kept if n > 0) / len(kept) if kept else None
    summary["accepted_chars_per_suggestion"] = sum(kept) / len(kept) if kept else None
    return summary


def stats(records: list[dict[str, Any]], malformed: int, by: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"malformed_lines": malformed, "all": summarize(records)}
    if by is not None:
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in records:
            groups[str(record.get(by))].append(record)
        result["by"] = by
        result["groups"] = {key: summarize(group) for key, group in sorted(groups.items())}
    return result


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_table(result: dict[str, Any]) -> str:
    """A terminal table: one row per group (or one for all)."""
    groups = result.get("groups") or {"all": result["all"]}
    head = ["group", "requests", "outcomes", *(f"{f} p{q}" for f in LATENCIES for q in QUANTILES),
            "truncated", "vram peak MiB", "upstream/request", "accepted", "kept chars"]  # fmt: skip
    rows = [head]
    for name, s in groups.items():
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(s["outcomes"].items()))
        share = s["truncated_share"]
        rows.append([name, str(s["requests"]), outcomes, *(_fmt(s[f][f"p{q}"]) for f in LATENCIES for q in QUANTILES),
                     "-" if share is None else f"{share:.0%}", _fmt(s["vram_peak_mib"], 0),
                     _fmt(s["upstream_per_request"], 2),
                     "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.0%}/{s['suggestions_judged']}",
                     _fmt(s["accepted_chars_per_suggestion"])])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    if result["malformed_lines"]:
        lines.append(f"({result['malformed_lines']} malformed lines skipped)")
    return "\n".join(lines)
