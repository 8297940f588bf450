"""A mergeable latency sketch with 1 % relative accuracy (the DDSketch idea: logarithmic buckets).

A value x > 0 goes to bucket k = ceil(log(x) / log(gamma)) with gamma = (1 + a) / (1 - a); every value in bucket k
lies in (gamma^(k-1), gamma^k], and the bucket's representative 2·gamma^k / (gamma + 1) is within a = 1 % of each of
them. So any quantile read from the sketch is within 1 % of the sample at that rank, and two sketches merge by
adding their counts — per-minute sketches add up to any time range exactly as if the samples had been kept.

A sketch is a plain dict, JSON-ready: {"s<k>": count}. Keys without the "s" prefix are upper bounds (ms) of the
older fixed-bucket histograms; they are read as their bound, so rows written before the sketch keep working.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

RELATIVE_ACCURACY = 0.01
GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(GAMMA)
# Below a microsecond nobody cares; clamping keeps the number of buckets small.
MIN_VALUE = 0.001

Sketch = dict[str, int]


def key_for(value: float) -> str:
    value = max(float(value), MIN_VALUE)
    return f"s{math.ceil(math.log(value) / _LOG_GAMMA)}"


def value_of(key: str) -> float:
    """The representative value of a bucket key (legacy keys are their own upper bound)."""
    if key.startswith("s"):
        k = int(key[1:])
        return 2 * GAMMA ** k / (GAMMA + 1)
    return float(key)


def add(sketch: Sketch, value: float, count: int = 1) -> Sketch:
    """Add a value in place; returns the sketch for chaining."""
    k = key_for(value)
    sketch[k] = int(sketch.get(k, 0)) + count
    return sketch


def from_values(values: Iterable[float]) -> Sketch:
    sketch: Sketch = {}
    for v in values:
        add(sketch, v)
    return sketch


def merge(into: Sketch, other: Mapping[str, int] | None) -> Sketch:
    """Add other's counts into `into` (in place) and return it."""
    get = into.get
    for k, n in (other or {}).items():  # hot loop of long chart ranges: counts are ints already (JSON)
        into[k] = get(k, 0) + n
    return into


def count(sketch: Mapping[str, int] | None) -> int:
    return sum(int(n) for n in (sketch or {}).values())


def quantile(sketch: Mapping[str, int] | None, q: float) -> float | None:
    """The q-quantile (0 <= q <= 1) of the sketched values, None when empty.

    Nearest rank: the ceil(q · n)-th smallest sample (1-based), so p99 of a handful of calls is their slowest.
    """
    if not sketch:
        return None
    items = sorted(((value_of(k), int(n)) for k, n in sketch.items() if int(n) > 0), key=lambda kv: kv[0])
    total = sum(n for _, n in items)
    if not total:
        return None
    rank = max(0, math.ceil(min(max(q, 0.0), 1.0) * total) - 1)  # 0-based
    seen = 0
    for value, n in items:
        seen += n
        if seen > rank:
            return value
    return items[-1][0]


def count_at_most(sketch: Mapping[str, int] | None, bound: float) -> int:
    """How many sketched values are <= bound (to within the sketch's accuracy): for cumulative histograms."""
    return sum(int(n) for k, n in (sketch or {}).items() if value_of(k) <= bound)


def display_ms(value: float | None) -> str:
    """A latency as people read it: '609 ms', '12.4 ms', '0.35 ms', '2.31 s'."""
    if value is None:
        return "—"
    if value >= 10_000:
        return f"{value / 1000:.1f} s"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"
