"""Topic -> bronze table name. The one place this rule lives (scaffold and status use it too)."""

from __future__ import annotations

import re
from collections.abc import Mapping

_NOT_IDENTIFIER = re.compile(r"[^a-z0-9_]")
DEAD_LETTER_TABLE = "_cdc_dead_letters"


def bronze_table_name(topic: str, mapping: Mapping[str, str] | None = None) -> str:
    """``dbserver1.inventory.customers`` -> ``dbserver1_inventory_customers``; a mapping entry wins."""
    if mapping and topic in mapping:
        return mapping[topic]
    return _NOT_IDENTIFIER.sub("_", topic.lower())
