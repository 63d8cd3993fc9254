"""A helper server run as a child process (the Tansu broker, SeaweedFS), its output kept for error messages."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path


class ChildProcess:
    """``command`` in a session of its own (a Ctrl-C in the terminal reaches us, and we stop the child in order),
    with stdout and stderr in a temporary file."""

    def __init__(
        self, command: Sequence[str], *, env: Mapping[str, str], log_prefix: str, cwd: Path | None = None
    ) -> None:
        self._log = tempfile.TemporaryFile(prefix=log_prefix)  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            list(command),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def output_tail(self, limit: int = 2000) -> str:
        if self._log.closed:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", errors="replace")[-limit:].strip()

    def stop(self, timeout_s: float, *, whole_group: bool = False) -> None:
        """SIGTERM (to the child's whole process group if ``whole_group``), SIGKILL after ``timeout_s``. Idempotent."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM, whole_group)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL, whole_group)
                self.process.wait(timeout_s)
        self._log.close()

    def _signal(self, signum: signal.Signals, whole_group: bool) -> None:
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)
