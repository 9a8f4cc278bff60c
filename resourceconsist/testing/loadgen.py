"""An open-loop HTTP load generator that records every request's outcome and time
(docs/testing.md, "Counting failed requests").

Open loop: request *n* is sent at ``start + n / rate`` whatever the earlier ones are doing, each
on a connection of its own (``Connection: close``), so a stall of the server shows as failed or
late requests instead of as a pause of the generator (a closed-loop tool such as wrk waits for
answers before it sends more, and hides exactly that). A request fails on a non-2xx answer, a
refused or reset connection, or no complete answer within ``timeout`` (1 s by default). The
generator measures its own lag (how late it sent each request); a run whose lag passed
``max_lag`` (50 ms) is void: its figures say more about the generator than the server.

``LoadGenerator(host, port).run(rate=500, seconds=10)`` returns a ``LoadReport``; ``start()``
and ``stop()`` run it in the background of a test. Either way it runs in a process of its own
(``python -m resourceconsist.testing.loadgen``), so that the test's threads (a controller, the
pods' servers) never make it late. Answers'
bodies are kept as the ``answered_by`` of each request (the pod servers of
``resourceconsist.testing.haproxy`` answer with their pod's name).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Outcome = Literal["ok", "status", "refused", "reset", "timeout", "error"]


@dataclass(frozen=True)
class RequestRecord:
    """One request: when it was due and sent (monotonic seconds), how it ended, how long it took."""

    due: float
    sent: float
    outcome: Outcome
    status: int | None
    seconds: float
    answered_by: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass
class LoadReport:
    """What a run sent and how each request ended."""

    records: list[RequestRecord] = field(default_factory=list)
    max_lag: float = 0.05
    started: float = 0.0
    ended: float = 0.0

    @property
    def sent(self) -> int:
        return len(self.records)

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.ok]

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.records)

    @property
    def lag(self) -> float:
        """The latest the generator sent a request after it was due (seconds)."""
        return max((r.sent - r.due for r in self.records), default=0.0)

    @property
    def void(self) -> bool:
        """The generator itself was late by more than ``max_lag``: the run says nothing."""
        return self.lag > self.max_lag

    @property
    def longest_gap(self) -> float:
        """The longest time without a successful answer (from the start, between successes, to the end)."""
        ends = sorted(r.sent + r.seconds for r in self.records if r.ok)
        points = [self.started, *ends, self.ended]
        return max((b - a for a, b in itertools.pairwise(points)), default=0.0)

    def answered_by(self) -> Counter[str]:
        return Counter(r.answered_by for r in self.records if r.ok)

    def summary(self) -> dict[str, object]:
        outcomes = self.outcomes
        return {
            "sent": self.sent,
            "failed": len(self.failed),
            "non_2xx": outcomes.get("status", 0),
            "connection_errors": outcomes.get("refused", 0) + outcomes.get("error", 0),
            "resets": outcomes.get("reset", 0),
            "timeouts": outcomes.get("timeout", 0),
            "longest_gap_seconds": round(self.longest_gap, 3),
            "lag_seconds": round(self.lag, 4),
            "void": self.void,
        }


class LoadGenerator:
    """Sends ``GET path`` to ``host:port`` at a fixed rate (see the module doc)."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str = "/",
        *,
        timeout: float = 1.0,
        max_lag: float = 0.05,
        niceness: int = 0,
    ) -> None:
        self.host, self.port, self.path = host, port, path
        self.timeout = timeout
        self.max_lag = max_lag
        #: The generator process's nice value (``os.nice``; below 0 needs root): a negative one
        #: keeps the generator on time while the machine is busy with what it measures.
        self.niceness = niceness
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            "User-Agent: resourceconsist-loadgen\r\n\r\n"
        ).encode()
        self._process: subprocess.Popen[bytes] | None = None
        self._out: str | None = None
        self._stop = asyncio.Event()
        self._progress: Path | None = None

    # -- in a process of its own --------------------------------------------------------------------------

    def run(self, rate: float, seconds: float) -> LoadReport:
        """Send ``rate`` requests a second for ``seconds`` (``rate * seconds`` requests in all) from
        a process of its own, wait for the last answer, and return the report; blocking."""
        self.start(rate, limit_seconds=seconds)
        assert self._process is not None
        self._process.wait(seconds + self.timeout + 60)
        return self.stop()

    def start(self, rate: float, limit_seconds: float = 600.0) -> None:
        """Start sending ``rate`` requests a second from a process of its own (so that the test's
        own threads never make it late) until ``stop()``, at most ``limit_seconds``: bounded in
        count and time."""
        if self._process is not None:
            raise RuntimeError("the generator is running")
        handle, self._out = tempfile.mkstemp(prefix="resourceconsist-loadgen-", suffix=".json")
        os.close(handle)
        argv = [
            sys.executable,
            "-m",
            "resourceconsist.testing.loadgen",
            f"--host={self.host}",
            f"--port={self.port}",
            f"--path={self.path}",
            f"--rate={rate}",
            f"--seconds={limit_seconds}",
            f"--timeout={self.timeout}",
            f"--out={self._out}",
        ]
        niceness = self.niceness

        def renice() -> None:
            os.nice(niceness)

        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=renice if niceness else None,  # noqa: PLW1509 - only sets the nice value
        )

    @property
    def sent_so_far(self) -> int:
        """Requests sent so far by the run under way (read from its progress file)."""
        if self._out is None:
            return 0
        try:
            return int(Path(self._out + ".sent").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def stop(self) -> LoadReport:
        """Stop sending, wait for the answers in flight, and return the report."""
        process, out = self._process, self._out
        if process is None or out is None:
            raise RuntimeError("the generator is not running")
        self._process = self._out = None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=self.timeout + 60)
        try:
            data = json.loads(Path(out).read_text() or "null")
        finally:
            for path in (out, out + ".sent"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        if process.returncode != 0 or data is None:
            raise RuntimeError(
                f"the load generator failed ({process.returncode}): {err.decode(errors='replace')}"
            )
        return LoadReport(
            records=[RequestRecord(**r) for r in data["records"]],
            max_lag=self.max_lag,
            started=data["started"],
            ended=data["ended"],
        )

    # -- the loop ----------------------------------------------------------------------------------------

    async def _run(self, rate: float, count: int) -> LoadReport:
        if not rate > 0:
            raise ValueError(f"rate {rate!r} must be above 0 requests a second")
        report = LoadReport(max_lag=self.max_lag)
        interval = 1.0 / rate
        loop = asyncio.get_running_loop()
        start = loop.time()
        report.started = time.monotonic()
        offset = report.started - start
        tasks: set[asyncio.Task[None]] = set()
        for n in range(count):
            if self._stop.is_set():
                break
            if self._progress is not None and n % 50 == 0:
                self._progress.write_text(str(n))
            if n % 1000 == 999:
                # The records kept so far leave the collector's sight: a full collection over tens
                # of thousands of them would stall the loop for tens of milliseconds, as lag.
                gc.freeze()
            due = start + n * interval
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(report, due + offset))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        report.ended = time.monotonic()
        report.records.sort(key=lambda r: r.due)
        return report

    async def _one(self, report: LoadReport, due: float) -> None:
        sent = time.monotonic()
        outcome: Outcome = "ok"
        status: int | None = None
        body = b""
        writer = None
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(self._request)
                await writer.drain()
                answer = await reader.read()
            head, _, body = answer.partition(b"\r\n\r\n")
            if not head:
                outcome = "reset"
            else:
                status = int(head.split(b" ", 2)[1])
                if not 200 <= status < 300:
                    outcome = "status"
        except TimeoutError:
            outcome = "timeout"
        except ConnectionRefusedError:
            outcome = "refused"
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
            outcome = "reset"
        except (OSError, ValueError, IndexError):
            outcome = "error"
        finally:
            if writer is not None:
                writer.close()
        report.records.append(
            RequestRecord(
                due=due,
                sent=sent,
                outcome=outcome,
                status=status,
                seconds=time.monotonic() - sent,
                answered_by=body.decode(errors="replace") if outcome == "ok" else "",
            )
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m resourceconsist.testing.loadgen``: one run, its records written as JSON to
    ``--out``; SIGTERM stops sending and lets the answers in flight come in."""
    parser = argparse.ArgumentParser(prog="python -m resourceconsist.testing.loadgen")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    generator = LoadGenerator(args.host, args.port, args.path, timeout=args.timeout)
    generator._progress = Path(args.out + ".sent")

    async def run() -> LoadReport:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, generator._stop.set)
        return await generator._run(args.rate, int(args.rate * args.seconds))

    report = asyncio.run(run())
    data = {
        "started": report.started,
        "ended": report.ended,
        "records": [dataclasses.asdict(r) for r in report.records],
    }
    Path(args.out).write_text(json.dumps(data))


if __name__ == "__main__":
    main()
