"""Structured logs: JSON lines when not on a terminal (containers, schedulers), readable text on one."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "INFO", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if use_json else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "pyiceberg", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def json_logging() -> bool:
    """Whether the root logger writes JSON lines (configure's json format)."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)


@contextlib.contextmanager
def logging_to(stream: TextIO) -> Iterator[None]:
    """The root logger's stream handlers write to ``stream`` meanwhile: rich's proxy of stderr while a live progress
    line shows, which prints each log line above it (written to the stderr configure() saw, a line landed in the
    middle of the progress line's text and escape codes)."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    previous = [handler.stream for handler in handlers]
    for handler in handlers:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, original in zip(handlers, previous, strict=True):
            handler.setStream(original)
