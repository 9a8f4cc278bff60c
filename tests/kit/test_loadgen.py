"""The open-loop load generator (resourceconsist.testing.loadgen) against a real HAProxy and the
pods' real HTTP servers: it sends at its rate, counts every request, sees which pod answered, and
counts the requests that fail when a server HAProxy still believes up stops answering."""

from __future__ import annotations

import time

import pytest

from resourceconsist.testing import wait_for
from resourceconsist.testing.haproxy import Backend, LocalHAProxy, PodServers
from resourceconsist.testing.loadgen import LoadGenerator

# The generator's engine, vegeta, lives beside the control plane's binaries (find_tool): CI's
# unit-test run without them skips this module by the marker, never by a missing binary.
pytestmark = pytest.mark.controlplane


def _serve(haproxy: LocalHAProxy, servers: PodServers, names: list[str], checks: str = "") -> dict[str, str]:
    ips = {}
    for name in names:
        ip = servers.next_ip()
        servers.start(ip, name)
        ips[name] = ip
        assert "New server registered" in haproxy.command(
            f"add server web/{name} {ip}:{servers.port} {checks}"
        )
        haproxy.command(f"set server web/{name} state ready")
    return ips


def test_every_request_is_counted_at_the_rate_asked() -> None:
    with LocalHAProxy([Backend("web", httpchk=None)]) as haproxy, PodServers() as servers:
        _serve(haproxy, servers, ["web-0", "web-1"])
        report = LoadGenerator("127.0.0.1", haproxy.ports["web"]).run(rate=400, seconds=2)
    assert report.sent == 800
    assert report.failed == [], report.summary()
    # Its own lateness is measured, and a run late by more than 50 ms says it is void.
    assert report.void is (report.lag > 0.05)
    assert set(report.answered_by()) == {"web-0", "web-1"}
    # No request failed, so no second passed without a successful answer (1 s: the timeout).
    assert 0 < report.longest_gap < 1.0
    # Open loop: the requests went out at their times, not as answers came back.
    dues = [r.due for r in report.records]
    assert 1.9 < dues[-1] - dues[0] < 2.1


def test_a_server_that_stops_answering_while_still_up_costs_requests() -> None:
    with LocalHAProxy([Backend("web", httpchk=None)]) as haproxy, PodServers() as servers:
        # Slow checks: HAProxy goes on believing web-1 up for a while after it stopped.
        ips = _serve(haproxy, servers, ["web-0", "web-1"], "check inter 3s")
        haproxy.command("enable health web/web-0")
        generator = LoadGenerator("127.0.0.1", haproxy.ports["web"])
        generator.start(rate=300, limit_seconds=30)
        wait_for(lambda: generator.finished_so_far >= 150, timeout=10, message="half a second of requests")
        servers.stop(ips["web-1"])
        stopped = time.monotonic()
        wait_for(lambda: time.monotonic() - stopped > 0.5, timeout=5, interval=0.05)
        report = generator.stop()
    assert report.failed, "requests to the stopped server failed, and were counted"
    assert {r.outcome for r in report.failed} <= {"status", "reset", "refused"}
    assert report.summary()["non_2xx"] == report.outcomes.get("status", 0)
