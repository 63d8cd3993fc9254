"""`cdclake ingest`: land Debezium topics in bronze until stopped (or, with --once, until caught up)."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

import click

from ingest.cli.common import config_option, settings_from
from ingest.config import Settings, redact
from ingest.logs import json_logging, logging_to
from ingest.pipeline import IngestStats, Pipeline
from ingest.sources.base import Source

if TYPE_CHECKING:
    from rich.console import Console

log = logging.getLogger(__name__)


def build_pipeline(settings: Settings) -> Pipeline:
    from ingest.bronze.tables import BronzeTables
    from ingest.lakehouse import load_catalog
    from ingest.metrics import IngestMetrics

    source_settings = settings.require_source()
    tables = BronzeTables(load_catalog(settings), settings.lakehouse.bronze_namespace, settings.ingest.commit_attempts)
    metrics = IngestMetrics()
    source: Source
    if source_settings.type == "file":
        from ingest.sources.file import FileSource

        assert source_settings.path is not None
        source = FileSource(
            settings.resolve(source_settings.path), source_settings.topics, source_settings.topic_pattern
        )
        return Pipeline(settings.ingest, tables, source, metrics, poll_timeout_s=source_settings.poll_timeout_s)
    from ingest.sources.kafka import KafkaSource

    def on_health(reason: str | None) -> None:
        # The broker is unreachable (reason) or back (None): shown by /healthz once progress stalls.
        metrics.health_reason = "running" if reason is None else redact(reason, settings)

    kafka = KafkaSource(source_settings, on_health=on_health, give_up_after_s=settings.ingest.unhealthy_after_s)
    pipeline = Pipeline(settings.ingest, tables, kafka, metrics, poll_timeout_s=source_settings.poll_timeout_s)
    kafka.on_revoke = pipeline.revoke
    return pipeline


@click.command()
@config_option
@click.option("--once", is_flag=True, help="Drain what is available, commit, and exit (for schedulers).")
@click.option("--progress/--no-progress", default=None, help="Live progress line (default: on a terminal).")
@click.pass_context
def ingest(ctx: click.Context, once: bool, progress: bool | None) -> int:
    """Land Debezium change events in Iceberg bronze, exactly once."""
    settings = settings_from(ctx)
    pipeline = build_pipeline(settings)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: committing the batch in hand, then exiting", signal.Signals(signum).name)
        pipeline.stop_requested.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    server = None
    if settings.ingest.metrics_port is not None:
        from ingest.metrics import MetricsServer

        server = MetricsServer(
            pipeline.metrics, settings.ingest.metrics_port, settings.ingest.unhealthy_after_s
        ).start()
        log.info("serving /metrics and /healthz on port %d", server.port)

    # By default on a terminal, unless logs are JSON (a container given a TTY: its log lines stay JSON).
    show = (sys.stderr.isatty() and not json_logging()) if progress is None else progress
    try:
        stats = _run_with_progress(pipeline, once) if show else pipeline.run(once=once)
    except Exception as exc:
        pipeline.metrics.healthy = False
        pipeline.metrics.health_reason = redact(str(exc), settings)
        raise
    finally:
        if server is not None:
            server.stop()
    # A log record, not a bare echo: with --log-format json every line on stderr stays a JSON object.
    log.info(
        "ingested %d records: %d written to %d bronze table(s), %d dead letters, %d skipped "
        "(already in bronze or heartbeats)",
        stats.records_in,
        stats.written,
        len(stats.tables),
        stats.dead_letters,
        stats.skipped,
        extra={
            "records_in": stats.records_in,
            "written": stats.written,
            "tables": sorted(stats.tables),
            "dead_letters": stats.dead_letters,
            "skipped": stats.skipped,
            "flushes": stats.flushes,
        },
    )
    return 0


def _run_with_progress(pipeline: Pipeline, once: bool, console: Console | None = None) -> IngestStats:
    """The pipeline's run under a live progress line on stderr, log lines printed above it."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def render(stats: IngestStats) -> Text:
        return Text(
            f"read {stats.records_in:,}  written {stats.written:,}  dead letters {stats.dead_letters:,}  "
            f"skipped {stats.skipped:,}  flushes {stats.flushes}  {stats.rate:,.0f} rec/s"
        )

    live = Live(render(pipeline.stats), console=console or Console(stderr=True), refresh_per_second=4)
    with live, logging_to(sys.stderr):  # sys.stderr is rich's proxy now (on a terminal)
        pipeline.on_progress = lambda stats: live.update(render(stats))
        return pipeline.run(once=once)
