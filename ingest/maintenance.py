"""Iceberg upkeep of bronze and silver through Spark's stored procedures: the logic of `cdclake maintain`.

Per table, in this order:

1. ``rewrite_data_files`` — compact small files (bronze gets one per table per flush); on silver also rewrite the
   data files that carry position deletes (``delete-file-threshold``), so reads stop merging them.
2. ``rewrite_position_delete_files`` (silver) — compact the delete files MERGE leaves behind, drop dangling ones.
3. ``rewrite_manifests`` — one manifest per partition spec instead of one per commit.
4. ``expire_snapshots`` — forget old snapshots and delete the files only they referenced.
5. ``remove_orphan_files`` — delete files no snapshot references (failed writes); Iceberg refuses a window
   below 24 hours, since a running writer's new files are not referenced yet.

Exactly-once survives all of it: the ingester resumes from the table property ``cdclake.offsets``, which every
commit (Spark's included) carries forward; snapshot summaries are lineage only. Compaction and manifest rewrites
add ``replace`` snapshots that change no rows, so nothing is ingested or applied twice. The plan also keeps the
bronze snapshot each silver table has applied (``cdclake.bronze_snapshot_id``): silver's next run reads bronze
incrementally from it, and would otherwise fall back to re-reading the whole bronze table. After each bronze
table the offsets are read again and compared; a commit that lost or rewound them is reported as a failure.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from ingest.bronze.tables import OFFSETS_PROPERTY, Offsets, decode_offsets
from ingest.config import LayerMaintenance, MaintenanceSettings, Settings
from ingest.errors import ConfigError
from ingest.snapshots import ancestors, silver_positions

Layer = Literal["bronze", "silver"]
LAYERS: tuple[Layer, ...] = ("bronze", "silver")
# Iceberg's remove_orphan_files procedure rejects anything shorter.
MIN_ORPHAN_HOURS = 24.0


def maintenance_settings(settings: Settings) -> MaintenanceSettings:
    """``maintenance:`` in cdclake.yml."""
    return settings.maintenance


# -- SQL -------------------------------------------------------------------------------------------------------------
def sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_argument(namespace: str, name: str) -> str:
    """``'ns.t'`` for the procedures' ``table =>``; parts are backquoted unless they are plain identifiers."""

    def part(text: str) -> str:
        return text if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) else "`" + text.replace("`", "``") + "`"

    return sql_string(f"{part(namespace)}.{part(name)}")


def timestamp_literal(value: dt.datetime) -> str:
    """A UTC timestamp literal that does not depend on spark.sql.session.timeZone."""
    utc = value.astimezone(dt.UTC)
    return f"TIMESTAMP '{utc:%Y-%m-%d %H:%M:%S}.{utc.microsecond // 1000:03d}+00:00'"


def options_map(options: dict[str, str]) -> str:
    return "map(" + ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in options.items()) + ")"


# -- planning --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    layer: Layer
    table: str  # namespace.name
    procedure: str
    sql: str  # as planned (shown by --dry-run)
    note: str | None = None
    # Time-relative calls are rendered again when they run: "older than now" must include the snapshots that
    # compaction and manifest rewrites of the same run have just added.
    render: Callable[[dt.datetime], str] | None = field(default=None, compare=False, repr=False)

    def sql_at(self, now: dt.datetime) -> str:
        return self.sql if self.render is None else self.render(now)


@dataclass
class TablePlan:
    layer: Layer
    table: str
    steps: list[Step]
    snapshots: int
    expirable_snapshots: int  # estimate from the metadata, before compaction adds its own
    data_files: int
    delete_files: int
    offsets: Offsets = field(default_factory=dict)  # bronze: the committed offsets before maintenance
    # Why the table could not be read (its metadata file gone, say): no steps, and the command fails naming it
    # once the other tables are maintained.
    error: str | None = None


def _list_tables(catalog: Catalog, namespace: str) -> list[str]:
    try:
        return sorted(identifier[-1] for identifier in catalog.list_tables(namespace))
    except NoSuchNamespaceError:
        return []


def _summary_int(table: Table, key: str) -> int:
    snapshot = table.current_snapshot()
    value = None if snapshot is None or snapshot.summary is None else snapshot.summary[key]
    return int(value) if value is not None else 0


def expirable(table: Table, older_than: dt.datetime, retain_last: int) -> int:
    """How many snapshots expire_snapshots would remove (ignoring branches and tags, which cdclake does not use)."""
    kept = {s.snapshot_id for s in itertools.islice(ancestors(table), retain_last)}
    cutoff_ms = int(older_than.timestamp() * 1000)
    return sum(1 for s in table.snapshots() if s.timestamp_ms < cutoff_ms and s.snapshot_id not in kept)


def protected_position(table: Table, applied: dict[int, str]) -> tuple[int, int, str] | None:
    """(timestamp in ms, snapshot id, silver table) for the bronze snapshot silver applied that lies deepest in
    main's history, the timestamp being the oldest from main's head down to it: expiring only what is older keeps
    it. Iceberg keeps main's snapshots from the newest back to the first older than the cutoff, so one later
    snapshot stamped earlier (another host's clock) would have let the walk stop above the applied one."""
    oldest: int | None = None
    found: tuple[int, int, str] | None = None
    for snapshot in ancestors(table):
        oldest = snapshot.timestamp_ms if oldest is None else min(oldest, snapshot.timestamp_ms)
        if snapshot.snapshot_id in applied:
            found = (oldest, snapshot.snapshot_id, applied[snapshot.snapshot_id])
    if found is None:  # applied snapshots off main's history (a branch): their own timestamps
        off_main = [
            (s.timestamp_ms, s.snapshot_id, applied[s.snapshot_id])
            for s in table.snapshots()
            if s.snapshot_id in applied
        ]
        found = min(off_main, default=None)
    return found


def plan_table(
    catalog: Catalog,
    catalog_name: str,
    layer: Layer,
    namespace: str,
    name: str,
    config: LayerMaintenance,
    now: dt.datetime,
    protected: dict[int, str] | None = None,
) -> TablePlan | None:
    """The procedure calls for one table, or None when it has no snapshot yet (nothing to maintain)."""
    identifier = f"{namespace}.{name}"
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return None
    except Exception as exc:  # one unreadable table must not keep the others from their maintenance
        return TablePlan(layer, identifier, [], 0, 0, 0, 0, error=f"cannot be read: {type(exc).__name__}: {exc}")
    if table.current_snapshot() is None:
        return None
    target = table_argument(namespace, name)
    call = f"CALL {catalog_name}.system"

    def sql(procedure: str, arguments: str) -> str:
        return f"{call}.{procedure}(table => {target}{arguments})"

    def step(procedure: str, arguments: str, note: str | None = None) -> Step:
        return Step(layer, identifier, procedure, sql(procedure, arguments), note)

    options = {"min-input-files": str(config.min_input_files)}
    if config.delete_file_threshold is not None:
        options["delete-file-threshold"] = str(config.delete_file_threshold)
    steps = [step("rewrite_data_files", f", options => {options_map(options)}")]
    if layer == "silver":
        steps.append(step("rewrite_position_delete_files", ""))
    steps.append(step("rewrite_manifests", ""))

    expire_window = dt.timedelta(hours=config.expire_older_than_hours)
    kept = protected_position(table, protected or {})
    position: dt.datetime | None = None
    note = None
    if kept is not None:
        timestamp_ms, snapshot_id, by = kept
        position = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC)
        note = (
            f"keeps snapshot {snapshot_id} (applied by {by}, committed {position:%Y-%m-%d %H:%M:%S}Z) and newer: "
            f"{by} has not applied anything newer; if no model builds it any more, drop it"
        )

    def expire_before(at: dt.datetime, kept_from: dt.datetime | None = position) -> dt.datetime:
        # Snapshots strictly older than this expire: silver's applied snapshot stays.
        cutoff = at - expire_window
        return cutoff if kept_from is None else min(cutoff, kept_from)

    def expire_sql(at: dt.datetime, kept_from: dt.datetime | None = position) -> str:
        older_than = timestamp_literal(expire_before(at, kept_from))
        return sql("expire_snapshots", f", older_than => {older_than}, retain_last => {config.retain_last}")

    def expire_sql_when_run(at: dt.datetime) -> str:
        # Main's history as it is when the expiry runs: a snapshot committed since the plan, stamped earlier than
        # the applied one by a host whose clock is behind, would otherwise stop Iceberg's walk above it.
        kept_from = position
        with contextlib.suppress(Exception):  # the table unreadable now: the expiry itself will say so
            fresh = protected_position(catalog.load_table(identifier), protected or {})
            if fresh is not None:
                at_run = dt.datetime.fromtimestamp(fresh[0] / 1000, tz=dt.UTC)
                kept_from = at_run if kept_from is None else min(kept_from, at_run)
        return expire_sql(at, kept_from)

    orphan_window = dt.timedelta(hours=max(config.orphan_older_than_hours, MIN_ORPHAN_HOURS))

    def orphan_sql(at: dt.datetime) -> str:
        return sql("remove_orphan_files", f", older_than => {timestamp_literal(at - orphan_window)}")

    if position is not None and position >= now - expire_window:
        note = None  # the configured window keeps it anyway
    steps.append(Step(layer, identifier, "expire_snapshots", expire_sql(now), note, expire_sql_when_run))
    steps.append(Step(layer, identifier, "remove_orphan_files", orphan_sql(now), None, orphan_sql))
    return TablePlan(
        layer=layer,
        table=identifier,
        steps=steps,
        snapshots=len(table.snapshots()),
        expirable_snapshots=expirable(table, expire_before(now), config.retain_last),
        data_files=_summary_int(table, "total-data-files"),
        delete_files=_summary_int(table, "total-delete-files"),
        offsets=decode_offsets(table.properties.get(OFFSETS_PROPERTY)) if layer == "bronze" else {},
    )


def plan_maintenance(
    catalog: Catalog,
    settings: Settings,
    maintenance: MaintenanceSettings | None = None,
    layers: Iterable[Layer] = LAYERS,
    tables: Sequence[str] | None = None,
    now: dt.datetime | None = None,
) -> list[TablePlan]:
    """Every table of ``layers`` (or only ``tables``, names without namespace), in catalog order."""
    maintenance = maintenance or maintenance_settings(settings)
    now = now or dt.datetime.now(dt.UTC)
    lake = settings.lakehouse
    positions = silver_positions(catalog, lake.bronze_namespace, held=True)
    protected = {snapshot: " and ".join(names) for snapshot, names in positions.items()}
    if not maintenance.keep_silver_position:
        protected = {}
    # Silver is the silver namespace and every other one holding a table that applies bronze: a dbt model with a
    # `schema` of its own writes to `<silver namespace>_<schema>` (its tombstone tables beside it).
    silver_namespaces = sorted(
        {lake.silver_namespace} | {table.rsplit(".", 1)[0] for names in positions.values() for table in names}
    )
    plans: list[TablePlan] = []
    found: set[str] = set()
    listed: list[str] = []
    namespaces = [
        (layer, namespace)
        for layer in layers
        for namespace in ([lake.bronze_namespace] if layer == "bronze" else silver_namespaces)
    ]
    for layer, namespace in namespaces:
        names = _list_tables(catalog, namespace)
        listed.extend(f"{namespace}.{name}" for name in names)
        if tables:
            names = [name for name in names if name in set(tables)]
            found.update(names)
        for name in names:
            plan = plan_table(
                catalog,
                lake.catalog_name,
                layer,
                namespace,
                name,
                maintenance.layer(layer),
                now,
                protected if layer == "bronze" else None,
            )
            if plan is not None:
                plans.append(plan)
    unknown = sorted(set(tables or ()) - found)
    if unknown:
        raise ConfigError(
            f"--table {', '.join(unknown)}: no such table in {', '.join(layers)} "
            f"(tables: {', '.join(listed) or 'none'}; names are without the namespace)"
        )
    return plans


# -- running ---------------------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    step: Step
    ok: bool
    seconds: float
    output: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def spark_error_line(error: BaseException) -> str:
    """A Spark/Py4J error as one line: the error class and message, plus the SQL position when known."""
    java = getattr(error, "java_exception", None)
    text = str(error)
    if java is not None and not text.strip().startswith("["):
        with contextlib.suppress(Exception):  # keep the Python text
            text = str(java.getMessage())
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(error).__name__
    first = re.sub(r";\s*line \d+ pos \d+;?$", "", first).rstrip(";").strip()
    position = re.search(r"line (\d+),? pos (\d+)", text)
    if position and "line" not in first:
        first += f" (line {position.group(1)}, pos {position.group(2)})"
    return first


def _output(procedure: str, rows: list[Any]) -> dict[str, int]:
    if procedure == "remove_orphan_files":
        return {"orphan_files_count": len(rows)}
    if not rows:
        return {}
    return {key: int(value) for key, value in rows[0].asDict().items() if isinstance(value, int)}


def run_step(spark: Any, step: Step) -> StepResult:
    started = time.monotonic()
    try:
        rows = spark.sql(step.sql_at(dt.datetime.now(dt.UTC))).collect()
    except Exception as exc:
        return StepResult(step, False, time.monotonic() - started, error=spark_error_line(exc))
    return StepResult(step, True, time.monotonic() - started, _output(step.procedure, rows))


def check_offsets(catalog: Catalog, plan: TablePlan) -> str | None:
    """None when every offset committed before maintenance is still there, not rewound; else what went wrong."""
    if plan.layer != "bronze" or not plan.offsets:
        return None
    try:
        after = decode_offsets(catalog.load_table(plan.table).properties.get(OFFSETS_PROPERTY))
    except NoSuchTableError:
        return "the table was dropped while it was maintained"
    lost = [f"{t}[{p}] {o} -> {after.get((t, p))}" for (t, p), o in plan.offsets.items() if after.get((t, p), -1) < o]
    return None if not lost else "offsets lost or rewound: " + ", ".join(lost)


def run_maintenance(
    spark: Any,
    catalog: Catalog,
    plans: Sequence[TablePlan],
    on_start: Callable[[Step], None] | None = None,
    on_done: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Run every step; a failing step is recorded and the rest still run. Offsets are re-checked per bronze table."""
    results: list[StepResult] = []
    for plan in plans:
        for step in plan.steps:
            if on_start is not None:
                on_start(step)
            result = run_step(spark, step)
            results.append(result)
            if on_done is not None:
                on_done(result)
        problem = check_offsets(catalog, plan)
        if problem is not None:
            check = Step(plan.layer, plan.table, "check_offsets", f"-- {OFFSETS_PROPERTY} of {plan.table}")
            result = StepResult(check, False, 0.0, error=problem)
            results.append(result)
            if on_done is not None:
                on_done(result)
    return results
