"""The real-node tier's HTTP test server (resourceconsist/testing/testserver.py), run on the host:
it answers with its Pod's name and stops as a real server does on SIGTERM - it stops accepting
at once, finishes the requests in flight, then exits 0 - and its log, on stdout and in
``$LOG_DIR/<pod>.log``, says when each of these happened."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.testing import testserver, wait_for


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[dict[str, Any]]]]:
    env = {**os.environ, "POD_NAME": "web-7d9f-x2", "PORT": "0", "LOG_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, testserver.__file__], env=env, stdout=subprocess.PIPE, text=True)
    lines: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        lines.extend(json.loads(line) for line in proc.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    yield proc, lines
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    reader.join(10)


def _get(port: int, path: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as answer:
        body: bytes = answer.read()
    return body.decode()


def test_it_answers_with_its_pod_name_and_logs_each_request(
    server: tuple[subprocess.Popen[str], list[dict[str, Any]]], tmp_path: Path
) -> None:
    proc, lines = server
    listening = wait_for(lambda: next((e for e in lines if e["event"] == "listening"), None), timeout=10)
    port = listening["port"]
    assert _get(port, "/?id=41") == "web-7d9f-x2\n"
    assert _get(port, "/healthz") == "web-7d9f-x2\n"
    with pytest.raises(urllib.error.HTTPError, match="404"):
        _get(port, "/nothing")
    served = wait_for(lambda: [e for e in lines if e["event"] == "served"], timeout=5)
    assert [(e["path"], e["id"], e["client"]) for e in served] == [("/", "41", "127.0.0.1")]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    # The file holds the same lines as stdout, each with the pod's name and a time.
    in_file = [json.loads(line) for line in (tmp_path / "web-7d9f-x2.log").read_text().splitlines()]
    wait_for(lambda: len(lines) == len(in_file), timeout=5)
    assert in_file == lines
    assert all(e["pod"] == "web-7d9f-x2" and isinstance(e["t"], float) for e in lines)


def test_on_sigterm_it_stops_accepting_at_once_and_finishes_what_is_in_flight(
    server: tuple[subprocess.Popen[str], list[dict[str, Any]]],
) -> None:
    proc, lines = server
    port = wait_for(lambda: next((e for e in lines if e["event"] == "listening"), None), timeout=10)["port"]
    answers: list[str] = []
    slow = threading.Thread(target=lambda: answers.append(_get(port, "/sleep?seconds=4")))
    slow.start()
    wait_for(lambda: any(e["event"] == "sleeping" for e in lines), timeout=5, message="the slow request")
    proc.send_signal(signal.SIGTERM)

    def refused() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                # A port of the ephemeral range, once free, can be the probe's own: a TCP
                # "simultaneous open" with itself, no server in it.
                return bool(probe.getsockname() == probe.getpeername())
        except ConnectionRefusedError:
            return True
        except OSError:
            # Queued on the listening socket just as it closed, then reset: not refused yet.
            return False

    # New connections are refused while the slow request is still being served ...
    wait_for(refused, timeout=10, message="new connections refused")
    # ... which then gets its answer, and only then does the server exit, with 0. (The server's
    # own log tells the order; the test's clock, on a loaded machine, might not.)
    slow.join(15)
    assert answers == ["web-7d9f-x2\n"]
    assert proc.wait(10) == 0
    events = [e["event"] for e in lines if e["event"] != "served"]
    assert events == ["listening", "sleeping", "sigterm", "stopped-accepting", "drained", "exit"]
    at = {e["event"]: e["t"] for e in lines if e["event"] != "served"}
    slept = next(e for e in lines if e["event"] == "served" and e["path"] == "/sleep")
    assert at["stopped-accepting"] < slept["t"] < at["drained"]
    drained = next(e for e in lines if e["event"] == "drained")
    assert drained["in_flight"] >= 1  # the slow request (and a probe accepted before the stop)
    times = [e["t"] for e in lines]
    assert times == sorted(times)


def test_it_keeps_connections_alive_and_a_stop_closes_the_idle_ones(
    server: tuple[subprocess.Popen[str], list[dict[str, Any]]],
) -> None:
    proc, lines = server
    port = wait_for(lambda: next((e for e in lines if e["event"] == "listening"), None), timeout=10)["port"]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(3):
        connection.request("GET", "/")
        answer = connection.getresponse()
        assert answer.read() == b"web-7d9f-x2\n"
        assert answer.getheader("Connection") is None  # kept alive
    held = connection.sock
    assert held is not None
    # The connection is idle and open: a stop neither waits for it nor leaves it open.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    held.settimeout(5)
    assert held.recv(1) == b"", "the server closed the idle connection"
    drained = next(e for e in lines if e["event"] == "drained")
    assert drained["in_flight"] == 0
