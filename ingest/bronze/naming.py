"""Topic -> bronze table name. The one place this rule lives (scaffold and status use it too)."""

from __future__ import annotations

import re
from collections.abc import Mapping

_NOT_IDENTIFIER = re.compile(r"[^a-z0-9_]")
# What Spark SQL reads as a number, not a name: 2024, 1e10, 12d, 7l, 3bd, ...
_NUMERIC_LITERAL = re.compile(r"[0-9]+(e[0-9]+)?(l|s|y|d|f|bd)?")
# cdclake's own tables (the dead letters) start with this; no topic may land in one of them.
RESERVED_PREFIX = "_cdc_"
DEAD_LETTER_TABLE = "_cdc_dead_letters"


def bronze_table_name(topic: str, mapping: Mapping[str, str] | None = None) -> str:
    """``dbserver1.inventory.customers`` -> ``dbserver1_inventory_customers``; a mapping entry wins.

    A name Spark would read as a number (topic ``2024``) or one in cdclake's own ``_cdc_`` space (topic
    ``_cdc.dead.letters``) gets the prefix ``t_``.
    """
    if mapping and topic in mapping:
        return mapping[topic]
    name = _NOT_IDENTIFIER.sub("_", topic.lower())
    if not name or name.startswith(RESERVED_PREFIX) or _NUMERIC_LITERAL.fullmatch(name):
        return "t_" + name
    return name
