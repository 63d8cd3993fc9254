"""Structured logs: JSON lines when not on a terminal (containers, schedulers), readable text on one."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_MAX_REMEMBERED = 1024
# What differs between librdkafka's repeats of one line: "(after 1001ms in state UP, 3 identical error(s) suppressed)".
_VARYING = re.compile(r"\b\d+ms\b|, \d+ identical error\(s\) suppressed")


def _same(part: re.Match[str]) -> str:
    """A varying part of a line as the filter compares it: any duration alike, the suppressed count left out."""
    return "" if part.group().startswith(",") else "#ms"


class RepeatFilter(logging.Filter):
    """Lets a warning or error through once per ``window_s``; the first one after the window says how many it
    stood for. Only the same text counts as the same line (one partition's offset reset does not hide another's),
    but for the parts librdkafka varies in a repeated line: the time an attempt took (`after 0ms`, `after 1ms`)
    and how many it suppressed itself. Lines below WARNING (librdkafka's ``debug``, turned on to see everything)
    all pass.

    librdkafka logs a failing connection at every reconnect attempt: twice a second per broker while a cluster is
    down (at cdclake's ``reconnect.backoff.ms``), 7,200 identical error lines an hour.
    """

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._shown: dict[tuple[int, str], tuple[float, int]] = {}  # line -> (when last shown, repeats held back)
        self._lock = threading.Lock()  # librdkafka's log lines are served from the threads that poll

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.levelno, _VARYING.sub(_same, record.getMessage()))
        now = time.monotonic()
        with self._lock:
            shown, held = self._shown.get(key, (-math.inf, 0))
            if now - shown < self.window_s:
                self._shown[key] = (shown, held + 1)
                return False
            if len(self._shown) >= _MAX_REMEMBERED:
                self._shown.clear()
            self._shown[key] = (now, 0)
        if held:
            line = record.getMessage()
            record.msg, record.args = f"{line} (repeated {held} more times in the last {now - shown:.0f}s)", ()
        return True


class SecretFilter(logging.Filter):
    """Takes the configured secrets out of every line a handler writes, its traceback included: an error's text
    can quote a secret (a driver's message with the catalog URI, a setting echoed back), and the line that logs it
    is not always one that thought to redact it (an unexpected error at the top of a command). ``redact`` is
    config.redact bound to the loaded settings."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


_TRACEBACKS = logging.Formatter()


class CdclakeHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs (only such handlers get a SecretFilter: not those of a host program
    that calls cdclake's code, e.g. pytest's)."""


def redact_logs(redact: Callable[[str], str]) -> None:
    """Every line cdclake's own log handlers write from now on goes through ``redact`` (replacing an earlier one)."""
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, CdclakeHandler):
            continue
        for old in [f for f in handler.filters if isinstance(f, SecretFilter)]:
            handler.removeFilter(old)
        handler.addFilter(SecretFilter(redact))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_text:  # a SecretFilter's redacted text, or logging.Formatter's cache of the traceback
            entry["exc"] = record.exc_text
        elif record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "INFO", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = CdclakeHandler(sys.stderr)
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
