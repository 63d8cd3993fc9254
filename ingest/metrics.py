"""Prometheus metrics of the ingest service and its /metrics + /healthz endpoint."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ingest.errors import ConfigError


class IngestMetrics:
    """One registry per pipeline, so tests (and several pipelines in one process) never share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.records_in = Counter("cdclake_records_in", "Records read from the source", ["topic"], registry=r)
        self.records_written = Counter("cdclake_records_written", "Records committed to bronze", ["table"], registry=r)
        self.records_skipped = Counter(
            "cdclake_records_skipped",
            "Records already in bronze (replays) or read before (rewound), heartbeats",
            ["reason"],
            registry=r,
        )
        self.dead_letters = Counter(
            "cdclake_dead_letters", "Records sent to the dead-letter table", ["topic"], registry=r
        )
        self.flush_seconds = Histogram("cdclake_flush_seconds", "Duration of a flush (all table commits)", registry=r)
        self.commit_failures = Counter(
            "cdclake_commit_failures", "Bronze commits that failed (before retry)", ["table"], registry=r
        )
        self.lag = Gauge(
            "cdclake_consumer_lag", "Records behind the end of the partition", ["topic", "partition"], registry=r
        )
        self.last_commit = Gauge(
            "cdclake_last_commit_timestamp_seconds", "Unix time of the last bronze commit", registry=r
        )
        self.seconds_since_commit = Gauge(
            "cdclake_seconds_since_last_commit", "Seconds since the last bronze commit or idle check", registry=r
        )
        self.seconds_since_commit.set_function(self._since_progress)
        self._progress_at = time.time()
        self._last_commit_at = 0.0
        self._commit_lock = threading.Lock()  # the writer threads commit tables in parallel
        self.healthy = True
        self.health_reason = "starting"

    def committed(self, at: float) -> None:
        """A bronze commit at Unix time ``at``: one of this process's, or the latest a table held when it was
        loaded (a restarted service does not report 0: an alert on the time since the last commit fired at once)."""
        with self._commit_lock:
            if at > self._last_commit_at:
                self._last_commit_at = at
                self.last_commit.set(at)

    def progress(self) -> None:
        """Called after every commit and whenever the source is idle and caught up."""
        self._progress_at = time.time()

    def _since_progress(self) -> float:
        return time.time() - self._progress_at

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """Serves /metrics and /healthz on a background thread; /healthz is 503 once unhealthy."""

    def __init__(self, metrics: IngestMetrics, port: int, unhealthy_after_s: float, host: str = "0.0.0.0") -> None:  # noqa: S104
        self.metrics = metrics
        self.unhealthy_after_s = unhealthy_after_s
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body, status, ctype = outer.metrics.render(), 200, CONTENT_TYPE_LATEST
                elif self.path == "/healthz":
                    ok, reason = outer.health()
                    body, status, ctype = reason.encode(), 200 if ok else 503, "text/plain"
                else:
                    body, status, ctype = b"not found", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"ingest.metrics_port: cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)

    def health(self) -> tuple[bool, str]:
        if not self.metrics.healthy:
            return False, f"unhealthy: {self.metrics.health_reason}\n"
        stalled = self.metrics._since_progress()
        if stalled > self.unhealthy_after_s:
            return False, f"unhealthy: no progress for {stalled:.0f}s ({self.metrics.health_reason})\n"
        return True, "ok\n"

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
