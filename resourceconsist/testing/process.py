"""The command line as its own process: ``run_cli`` runs one ``python -m resourceconsist ...``
to its end, and ``CommandProcess`` keeps one running, for tests that run the controller the way
a cluster does (its own process, its own credentials, SIGTERM to stop).

A ``CommandProcess``'s output is collected as it comes (``output``), ``ready()`` asks its
/readyz, and ``stop()`` sends SIGTERM and waits (docs/testing.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Final

from resourceconsist.testing.controlplane import ControlPlaneError

#: The command line as this interpreter runs it: ``python -m resourceconsist``.
CLI: Final = (sys.executable, "-m", "resourceconsist")


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 180, columns: int = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m resourceconsist <args>`` run to its end, its output captured as text and no
    stdin, in ``env`` (default: this process's environment) with ``COLUMNS=<columns>`` so help
    and tables wrap alike on every terminal. A non-zero exit is returned, not raised: the test
    says what it expects of ``returncode``. Past ``timeout`` seconds: ``TimeoutExpired``."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**(os.environ if env is None else env), "COLUMNS": str(columns)},
        check=False,
    )


class CommandProcess:
    """``python -m resourceconsist <args>`` with environment ``env``, its /readyz served at
    ``127.0.0.1:<health_port>`` (the args must say so), and its /metrics at
    ``127.0.0.1:<metrics_port>`` when given (the args say so too)."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        health_port: int,
        *,
        metrics_port: int | None = None,
    ) -> None:
        self.health_port = health_port
        self.metrics_port = metrics_port
        self.process = subprocess.Popen(
            [*CLI, *args],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        if self.process.stdout is not None:
            self.lines.extend(iter(self.process.stdout.readline, ""))

    @property
    def output(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        return "".join(self.lines)

    def ready(self) -> bool:
        """Its /readyz answers 200; raises when the process has ended (with its output)."""
        if self.process.poll() is not None:
            raise ControlPlaneError(
                f"the process ended early (exit {self.process.returncode}):\n{self.output}"
            )
        with (
            suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r,
        ):
            return bool(r.status == 200)
        return False

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as the kubelet sends; SIGKILL after ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(5)
