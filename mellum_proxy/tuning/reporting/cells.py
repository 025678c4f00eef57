"""How a value is written in a report's table cell: `-` where nothing was measured."""

from __future__ import annotations

import math
from typing import Any


def cell(value: Any, spec: str) -> str:
    """`value` in `spec` (`"{:.0f}"`, `"{:.0%}"`, ...); `-` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def yes_no(value: bool | None) -> str:
    """`yes`, `no`, or `-` where nothing was judged."""
    return "-" if value is None else "yes" if value else "no"
