"""Child processes for tests: `cdclake ARGS` run as a real process with its output collected line by line.

Each child gets a runtime directory of its own under the test's root (``CDCLAKE_RUNTIME_DIR``: the project's jars,
binaries and JVM class archive linked, a dbt profile and Spark warehouse of its own), so concurrent children never
collide.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ingest.errors import SetupError
from ingest.lakehouse import RUNTIME_DIR_ENV, runtime_dir
from tests.conftest import TEST_SPARK_CONF
from tests.missing import missing_runtime

SUBPROCESS_TIMEOUT_S = 600.0
# The `spark:` section of children's configs: a small local JVM with the tests' settings (TEST_SPARK_CONF says why).
# Its code only C1 compiles: a `cdclake dbt build` JVM lives 10-20 s, too short for C2's optimisations to repay
# their compile time (~3 s of each build here).
CHILD_SPARK: dict[str, Any] = {"master": "local[2]", "driver_memory": "1g", "conf": dict(TEST_SPARK_CONF)}
FLUSHED = '"msg":"flushed '


def cdclake_command() -> str:
    beside = Path(sys.executable).parent / "cdclake"
    found = str(beside) if beside.is_file() else shutil.which("cdclake")
    assert found, "the cdclake script is not installed (make setup)"
    return found


def isolated_runtime(root: Path) -> Path:
    """A runtime directory with the project's jars, binaries and JVM class archive, and a dbt profile and warehouse
    of its own."""
    try:
        from ingest.lakehouse import spark_jars

        spark_jars()
    except SetupError as exc:
        missing_runtime(str(exc))
    runtime = root / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    for name in ("jars", "bin", "jvm"):
        link = runtime / name
        if not link.exists() and (runtime_dir() / name).exists():
            link.symlink_to(runtime_dir() / name)
    return runtime


def subprocess_env(root: Path) -> dict[str, str]:
    # Temporary files under the test's root: a child the test SIGKILLs leaves its dbt profile and Spark's block
    # manager directory behind, which pytest's basetemp rotation removes and the system's /tmp would keep.
    scratch = root / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        RUNTIME_DIR_ENV: str(isolated_runtime(root)),
        "TMPDIR": str(scratch),
        "SPARK_LOCAL_DIRS": str(scratch),
        "TZ": "UTC",
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
    }


class Cdclake:
    """`cdclake --config CONFIG ARGS` as a child process; its output lines are collected by a reader thread."""

    def __init__(self, config: Path, *args: str, root: Path, log_format: str = "json", log_level: str = "INFO") -> None:
        command = [cdclake_command(), "--config", str(config), "--log-format", log_format, "--log-level", log_level]
        command += args
        self.process = subprocess.Popen(
            command,
            cwd=root,
            env=subprocess_env(root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self.started = time.monotonic()
        self._changed = threading.Condition()
        self._done = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with self._changed:
                self.lines.append(raw.decode("utf-8", errors="replace"))
                self._changed.notify_all()
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def count(self, needle: str) -> int:
        with self._changed:
            return sum(needle in line for line in self.lines)

    def wait_for(self, needle: str, timeout_s: float, times: int = 1) -> bool:
        """Until ``needle`` appeared in ``times`` output lines (False on timeout or when the process ended)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: sum(needle in line for line in self.lines) >= times or self._done, timeout_s
            ) and (sum(needle in line for line in self.lines) >= times)

    @property
    def flushes(self) -> int:
        """Flushes `cdclake ingest` logged so far."""
        return self.count(FLUSHED)

    def wait_for_flushes(self, count: int, timeout_s: float) -> bool:
        return self.wait_for(FLUSHED, timeout_s, times=count)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self._reader.join(10)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float = SUBPROCESS_TIMEOUT_S) -> int:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(10)
        return code

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def tail(self, lines: int = 30) -> str:
        with self._changed:
            return "".join(self.lines[-lines:])


def ingester(config: Path, root: Path, *args: str, log_level: str = "INFO") -> Cdclake:
    """`cdclake ingest --no-progress ARGS` with JSON logs."""
    return Cdclake(config, "ingest", "--no-progress", *args, root=root, log_level=log_level)


def run_cdclake(config: Path, *args: str, root: Path) -> str:
    """Run `cdclake` to completion; fail the test with its output if it fails."""
    process = Cdclake(config, *args, root=root, log_format="text")
    code = process.wait()
    assert code == 0, f"cdclake {' '.join(args)} failed ({code}):\n{process.tail(60)}"
    return process.output


def wait_until(condition: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> float:
    """Poll ``condition()`` until true; returns the seconds it took, fails the test with ``what`` on timeout."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(interval_s)
    return time.monotonic() - started
