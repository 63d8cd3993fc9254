"""Whether a bronze table's changes land in their source's order, kept in its snapshot summaries.

Each append records the greatest ``_cdc_order`` of the changes appended so far (``cdclake.order-max``) and how many
appends held a change that was not newer than that (``cdclake.order-regressions-total``). A silver run whose unit of
work lies between two snapshots with the same count knows that every change in it is newer than everything bronze
held before, so newer than anything silver applied: it need not look up silver's positions for them (the lookup
costs 0.1-0.3 s at 10M rows even when it finds nothing). A topic of one partition keeps the count; several
partitions interleave, and their units look up silver as before.

Orders compare as Spark compares the arrays (element by element, a null element first, then the shorter first).
A change without an order counts as a regression: silver compares its position as smaller than any.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import orjson
import pyarrow as pa
import pyarrow.compute as pc

ORDER_MAX_PROPERTY = "cdclake.order-max"
ORDER_REGRESSIONS_PROPERTY = "cdclake.order-regressions-total"
# The ops of changes that silver looks up by key (truncates and tombstones carry no key to look up).
_KEYED_OPS = pa.array(["c", "u", "d", "r"])

Order = tuple[int | None, ...]


def _sort_key(order: Sequence[int | None]) -> tuple[tuple[int, int], ...]:
    return tuple((0, 0) if part is None else (1, part) for part in order)


def order_bounds(data: pa.Table) -> tuple[tuple[Order, Order] | None, bool]:
    """The least and the greatest ``_cdc_order`` of the changes in ``data`` that have one (None: no such change),
    and whether a change has none."""
    if "_cdc_order" not in data.column_names or "op" not in data.column_names:
        return None, False
    orders = pc.filter(data["_cdc_order"], pc.is_in(data["op"], value_set=_KEYED_OPS)).combine_chunks()
    unordered = orders.null_count > 0
    orders = orders.drop_null()
    if not len(orders):
        return None, unordered
    lengths = pc.min_max(pc.list_value_length(orders)).as_py()
    if pc.list_flatten(orders).null_count or lengths["min"] != lengths["max"]:
        # Uneven or with null parts (no connector's order, so far): compared one by one.
        listed: list[Order] = [tuple(order) for order in orders.to_pylist()]
        return (min(listed, key=_sort_key), max(listed, key=_sort_key)), unordered
    # Even and without nulls (every connector's): narrowed part by part to the rows that hold the extreme.
    return (_extreme(orders, lengths["min"], "min"), _extreme(orders, lengths["min"], "max")), unordered


def _extreme(orders: pa.ListArray, length: int, which: Literal["min", "max"]) -> Order:
    for part in range(length):
        parts = pc.list_element(orders, part)
        orders = pc.filter(orders, pc.equal(parts, pc.min_max(parts).as_py()[which]))
    return tuple(orders[0].as_py())


def order_summary(data: pa.Table, previous_max: str | None, previous_regressions: int | None) -> dict[str, str]:
    """The two summary entries of an append of ``data`` after a snapshot that recorded ``previous_max`` (JSON: an
    array, or null before any change) and ``previous_regressions``; none when those are unknown (an append by
    another writer, or by cdclake before it kept them, came first)."""
    if previous_max is None or previous_regressions is None:
        return {}
    greatest: Sequence[int | None] | None = orjson.loads(previous_max)
    bounds, unordered = order_bounds(data)
    regressed = unordered
    if bounds is not None:
        lowest, highest = bounds
        regressed = regressed or (greatest is not None and _sort_key(lowest) <= _sort_key(greatest))
        if greatest is None or _sort_key(highest) > _sort_key(greatest):
            greatest = highest
    return {
        ORDER_MAX_PROPERTY: orjson.dumps(None if greatest is None else list(greatest)).decode(),
        ORDER_REGRESSIONS_PROPERTY: str(previous_regressions + int(regressed)),
    }
