"""An open-loop HTTP load generator that records every request's outcome and time
(docs/testing.md, "Counting failed requests").

Open loop: request *n* is sent at ``start + n / rate`` whatever the earlier ones are doing (on an
idle kept-alive connection when there is one, else on a new one), so a stall of the server shows
as failed or late requests instead of as a pause of the generator (a closed-loop tool such as wrk waits for
answers before it sends more, and hides exactly that). A request fails on a non-2xx answer, a
refused or reset connection, or no complete answer within ``timeout`` (1 s by default). The
generator measures its own lag (how late it sent each request); a run whose lag passed
``max_lag`` (50 ms) is void: its figures say more about the generator than the server.

The engine is vegeta (``vegeta attack``, built from hack/vegeta/go.mod by
hack/build-controlplane.sh, found by ``find_tool``): a Go program of its own, whose pacer and
goroutines stay on time while the machine is busy with what it measures, where an asyncio loop
in Python fell behind by up to a second at 500 requests a second beside a real node (its own
reading of the answers, not the servers, made most of the timeouts it counted). Its results
(``vegeta encode -to json``: sequence number, send time, latency, status, error, body) become
the ``RequestRecord``s; this module only classifies them and sums them up.

``LoadGenerator(host, port).run(rate=500, seconds=10)`` returns a ``LoadReport``; ``start()``
and ``stop()`` run it in the background of a test. Answers' bodies are kept as the
``answered_by`` of each request (the pod servers of ``resourceconsist.testing.haproxy`` answer
with their pod's name).
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from resourceconsist.testing.controlplane import find_tool, set_priority

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
        #: The generator's priority (``set_priority``; below 0 needs root): a negative one
        #: keeps it on time while the machine is busy with what it measures.
        self.niceness = niceness
        self._rate = 0.0
        self._attack: subprocess.Popen[bytes] | None = None
        self._encode: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._finished = 0
        self._read = 0

    def run(self, rate: float, seconds: float) -> LoadReport:
        """Send ``rate`` requests a second for ``seconds`` (``rate * seconds`` requests in all),
        wait for the last answer, and return the report; blocking."""
        self.start(rate, limit_seconds=seconds)
        assert self._attack is not None
        self._attack.wait(seconds + self.timeout + 60)
        return self.stop()

    def start(self, rate: float, limit_seconds: float = 600.0) -> None:
        """Start sending ``rate`` requests a second in the background until ``stop()``, at most
        ``limit_seconds`` (``rate * limit_seconds`` requests): bounded in count and time."""
        if self._attack is not None:
            raise RuntimeError("the generator is running")
        if not rate > 0 or not limit_seconds > 0:
            raise ValueError(f"rate {rate!r} and limit {limit_seconds!r} s must be above 0")
        vegeta = str(find_tool("vegeta"))
        count = max(1, round(rate * limit_seconds))
        self._rate, self._finished, self._read = rate, 0, 0
        self._dir = Path(tempfile.mkdtemp(prefix="resourceconsist-loadgen-"))
        # The children get the priority and their own copies of the stderr files, so the parent
        # closes its own once they are started.
        prioritise = functools.partial(set_priority, self.niceness) if self.niceness else None
        with (
            open(self._dir / "attack.err", "wb") as attack_err,
            open(self._dir / "encode.err", "wb") as encode_err,
        ):
            # Request n is due (n + 1) / rate after the attack began; vegeta stops sending once the
            # duration has passed, checked before each wait: half an interval short of the
            # count's end sends exactly ``count``.
            duration_ms = max(1.0, (count - 0.5) / rate * 1000)
            self._attack = subprocess.Popen(
                [
                    vegeta,
                    "attack",
                    f"-rate={rate * 1000:.0f}/1000s",
                    f"-duration={duration_ms:.3f}ms",
                    f"-timeout={self.timeout * 1000:.0f}ms",
                    "-http2=false",
                    "-redirects=-1",
                    "-max-body=256",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=attack_err,
                start_new_session=prioritise is not None,
                preexec_fn=prioritise,  # noqa: PLW1509 - only sets the priority
            )
            assert self._attack.stdin is not None and self._attack.stdout is not None
            self._attack.stdin.write(f"GET http://{self.host}:{self.port}{self.path}\n".encode())
            self._attack.stdin.close()
            self._encode = subprocess.Popen(
                [vegeta, "encode", "-to=json", f"-output={self._dir / 'results.json'}"],
                stdin=self._attack.stdout,
                stderr=encode_err,
                start_new_session=prioritise is not None,
                preexec_fn=prioritise,  # noqa: PLW1509 - only sets the priority
            )
            self._attack.stdout.close()

    @property
    def finished_so_far(self) -> int:
        """Requests of the run under way that have ended so far (answered, failed or timed out;
        vegeta writes a request's result when it ends), counted from the results written."""
        if self._dir is None:
            return 0
        try:
            with open(self._dir / "results.json", "rb") as results:
                results.seek(self._read)
                chunk = results.read()
        except OSError:
            return self._finished
        # Only whole lines: the last one may still be being written.
        whole = chunk.rfind(b"\n") + 1
        self._finished += chunk.count(b"\n", 0, whole)
        self._read += whole
        return self._finished

    def stop(self) -> LoadReport:
        """Stop sending, wait for the answers in flight, and return the report."""
        attack, encode, directory = self._attack, self._encode, self._dir
        if attack is None or encode is None or directory is None:
            raise RuntimeError("the generator is not running")
        self._attack = self._encode = self._dir = None
        try:
            if attack.poll() is None:
                # vegeta's first SIGINT stops the attack and lets the requests in flight end.
                attack.send_signal(signal.SIGINT)
            attack.wait(self.timeout + 60)
            encode.wait(60)
            if attack.returncode != 0 or encode.returncode != 0:
                said = b"".join((directory / f).read_bytes() for f in ("attack.err", "encode.err"))
                raise RuntimeError(
                    f"the load generator failed (attack {attack.returncode}, encode "
                    f"{encode.returncode}): {said.decode(errors='replace').strip()}"
                )
            lines = (directory / "results.json").read_bytes().splitlines()
        finally:
            for process in (attack, encode):
                if process.poll() is None:
                    process.kill()
                    process.wait()
            shutil.rmtree(directory, ignore_errors=True)
        return self.report([json.loads(line) for line in lines if line])

    def report(self, results: list[dict[str, Any]]) -> LoadReport:
        """The ``LoadReport`` of vegeta's JSON results, on this process's monotonic clock."""
        report = LoadReport(max_lag=self.max_lag)
        if not results:
            report.started = report.ended = time.monotonic()
            return report
        # vegeta stamps wall-clock times; the callers compare them with time.monotonic().
        to_monotonic = time.monotonic() - time.time()
        results.sort(key=lambda r: r["seq"])
        first = _seconds(results[0]["timestamp"])
        interval = 1.0 / self._rate
        for r in results:
            sent = _seconds(r["timestamp"]) + to_monotonic
            outcome = _outcome(r.get("code", 0), r.get("error", ""))
            body = base64.b64decode(r["body"]) if r.get("body") else b""
            report.records.append(
                RequestRecord(
                    due=first + r["seq"] * interval + to_monotonic,
                    sent=sent,
                    outcome=outcome,
                    status=r.get("code") or None,
                    seconds=r["latency"] / 1e9,
                    answered_by=body.decode(errors="replace") if outcome == "ok" else "",
                )
            )
        report.started = report.records[0].due
        report.ended = max(r.sent + r.seconds for r in report.records)
        return report


def _seconds(stamp: str) -> float:
    """Unix seconds of an RFC 3339 time with up to nanoseconds (Python keeps microseconds)."""
    head, dot, tail = stamp.partition(".")
    if dot:
        digits = len(tail) - len(tail.lstrip("0123456789"))
        tail = tail[: min(digits, 6)] + tail[digits:]
    return datetime.fromisoformat(head + dot + tail.replace("Z", "+00:00")).timestamp()


def _outcome(code: int, error: str) -> Outcome:
    """How a request ended, from vegeta's status code and Go's error text for it."""
    if code:
        return "ok" if 200 <= code < 300 else "status"
    said = error.lower()
    if "timeout" in said or "deadline exceeded" in said:
        return "timeout"
    if "connection refused" in said:
        return "refused"
    if "reset by peer" in said or "broken pipe" in said or said.endswith("eof"):
        return "reset"
    return "error"
