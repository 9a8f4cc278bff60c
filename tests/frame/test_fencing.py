"""A leader frozen past its Lease writes nothing when it resumes (docs/concepts.md, "Fencing").

Two ``resourceconsist run --adapter demo --leader-elect`` processes, each under its own
ServiceAccount, against a real kube-apiserver that writes an audit log. The first leads and
serves a Service; it is then stopped (SIGSTOP) for about three lease durations, during which the
second takes the Lease over and pods come and go; then it is resumed (SIGCONT). The judge is the
API server's audit log: no request of the first replica, other than its own Lease's, may reach the
server after its Lease deadline (its last successful renewal, as the server stamped it, plus the
lease duration) but the one case the fence cannot close (docs/concepts.md, "Fencing", "What remains
possible"): a write whose fence check passed an instant before the stop and which went out on the
resume. Such a write is the replica's own word only in this: it logs a warning for each write
answered after its deadline (resourceconsist.cluster.transport, ``RequestLedger.answered``); each
late write in the audit log must be one of those, and a write sent on a check made after the
resume (a fence not checked, or not current) is not.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, free_port
from resourceconsist.testing.process import CommandProcess

pytestmark = pytest.mark.controlplane

NAMESPACE = "fencing"
LEASE = "fencing-lease"
LEASE_DURATION = 4.0
TIMINGS = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")
MUTATING = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.fixture(scope="module")
def audited() -> Iterator[LocalControlPlane]:
    with LocalControlPlane(audit=True) as plane:
        yield plane


def _replica(plane: LocalControlPlane, client: KubeClient, name: str, tmp: Path) -> CommandProcess:
    """A manager process under the ServiceAccount ``name`` (cluster-admin), as a pod would run it."""
    client.create(client.resource("v1", "ServiceAccount"), NAMESPACE, {"metadata": {"name": name}})
    binding = {
        "metadata": {"name": f"{NAMESPACE}-{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
    }
    client.create(client.resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), None, binding)
    kubeconfig = plane.token_kubeconfig(
        plane.service_account_token(NAMESPACE, name), tmp / f"{name}.kubeconfig"
    )
    port = free_port()
    args = [
        "run",
        "--adapter",
        "demo",
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        str(kubeconfig),
        "--leader-elect",
        "--leader-election-id",
        LEASE,
        "--leader-election-namespace",
        NAMESPACE,
        *TIMINGS,
        "--health-probe-bind-address",
        f"127.0.0.1:{port}",
        "--metrics-bind-address",
        "0",
    ]
    env = {**os.environ, "POD_NAME": name, wire.POD_NAMESPACE_ENV: NAMESPACE}
    return CommandProcess(args, env, port)


def _stamp(event: dict[str, Any]) -> datetime.datetime:
    return datetime.datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00"))


def _code(event: dict[str, Any]) -> Any:
    return (event.get("responseStatus") or {}).get("code")


def _late_writes(events: list[dict[str, Any]], user: str) -> tuple[list[dict[str, Any]], int]:
    """The writes of ``user`` (its own Lease's excepted) received after its Lease deadline: its
    last successful renewal, as the server stamped it, plus the lease duration; and how many of
    its Lease writes succeeded."""
    renewals = [
        _stamp(e)
        for e in events
        if e["user"]["username"] == user
        and e["verb"] in ("update", "patch", "create")
        and (e.get("objectRef") or {}).get("resource") == "leases"
        and (_code(e) or 0) < 300
    ]
    if not renewals:
        return [], 0
    # A renewal is stamped when it arrives; the holder's own deadline counts from when it sent it.
    deadline = max(renewals) + datetime.timedelta(seconds=LEASE_DURATION)
    late = [
        e
        for e in events
        if e["user"]["username"] == user
        and e["verb"] in MUTATING
        and (e.get("objectRef") or {}).get("resource") != "leases"
        and _stamp(e) > deadline
    ]
    return late, len(renewals)


#: An HTTP method as the audit log names the request's verb (a DELETE of a collection aside).
_VERB = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
#: The warning ``RequestLedger.answered`` logs for a write answered after its Lease deadline.
_ANSWERED_LATE = re.compile(r"\b(POST|PUT|PATCH|DELETE) (\S+) \(answered \d+\) was sent for a Lease whose")


def _unaccounted(late: list[dict[str, Any]], output: str) -> list[str]:
    """The late writes the replica did not report as answered after its deadline, each report
    accounting for one write of its verb and path."""
    reported = Counter((_VERB[m[1]], m[2]) for m in _ANSWERED_LATE.finditer(output))
    left = []
    for e in late:
        key = (e["verb"], str(e["requestURI"]).split("?")[0])
        if reported[key] > 0:
            reported[key] -= 1
        else:
            left.append(f"{e['verb']} {e['requestURI']} at {e['requestReceivedTimestamp']} ({_code(e)})")
    return left


async def test_a_leader_frozen_past_its_lease_writes_nothing_when_it_resumes(
    audited: LocalControlPlane, tmp_path: Path
) -> None:
    client = KubeClient.from_kubeconfig(str(audited.kubeconfig))
    client.create(kube.NAMESPACE, None, {"metadata": {"name": NAMESPACE}})
    cluster = Cluster(client, NAMESPACE)
    first = _replica(audited, client, "replica-a", tmp_path)
    second: CommandProcess | None = None
    try:
        await async_wait_for(first.ready, timeout=60, message="replica-a ready")

        async def holder() -> str:
            lease = await cluster.get(kube.LEASE, LEASE)
            return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

        await async_wait_for(lambda: _starts(holder(), "replica-a"), timeout=30, message="replica-a leads")
        await cluster.service("web", {"app": "web"})
        for index in range(4):
            await cluster.pod(f"web-{index}", {"app": "web"})
            await cluster.set_status(f"web-{index}", ready=True)

        async def served(names: list[str]) -> bool:
            pods = [await cluster.get(kube.POD, n) for n in names]
            return all(p is not None and p["metadata"].get("finalizers") for p in pods)

        await async_wait_for(lambda: served([f"web-{i}" for i in range(4)]), timeout=60, message="served")

        # Frozen for about three lease durations: the second replica takes the Lease over and
        # serves pods that come and go meanwhile, news the frozen one gets when it resumes.
        first.process.send_signal(signal.SIGSTOP)
        second = _replica(audited, client, "replica-b", tmp_path)
        await async_wait_for(lambda: _starts(holder(), "replica-b"), timeout=30, message="replica-b leads")
        for index in range(4, 8):
            await cluster.pod(f"web-{index}", {"app": "web"})
            await cluster.set_status(f"web-{index}", ready=True)
        await cluster.set_status("web-0", ready=False)
        await cluster.delete(kube.POD, "web-1")
        await async_wait_for(
            lambda: served([f"web-{i}" for i in range(4, 8)]), timeout=60, message="b serves"
        )
        await async_wait_for(_slept(3 * LEASE_DURATION), timeout=3 * LEASE_DURATION + 5, message="frozen")
        # Pods that come just before it resumes: the resumed replica's passes race the holder's.
        for index in range(8, 12):
            await cluster.pod(f"web-{index}", {"app": "web"})
            await cluster.set_status(f"web-{index}", ready=True)
        first.process.send_signal(signal.SIGCONT)

        async def stepped_down() -> bool:
            return "lost lease" in first.output or "stepping down" in first.output

        await async_wait_for(stepped_down, timeout=30, message="replica-a steps down after resuming")
        await async_wait_for(_slept(3.0), timeout=10, message="the resumed replica's last moves")
        events = audited.audit_events()
        late, renewals = _late_writes(events, f"system:serviceaccount:{NAMESPACE}:replica-a")
        assert renewals > 0, "the audit log names replica-a's own renewals"
        unaccounted = _unaccounted(late, first.output)
        assert unaccounted == [], (
            "replica-a wrote after its Lease deadline:\n"
            + "\n".join(unaccounted)
            + "\nthe end of its output:\n"
            + first.output[-6000:]
        )
        # The second replica, the holder, was not fenced: it served the new pods (above).
        assert await holder() == "replica-b" or (await holder()).startswith("replica-b")
    finally:
        for process in (first, second):
            if process is not None:
                process.process.send_signal(signal.SIGCONT)
                process.stop(timeout=15)
        client.close()


async def _starts(found: Any, prefix: str) -> bool:
    return str(await found).startswith(prefix)


def _slept(seconds: float) -> Any:
    """A condition that turns true ``seconds`` from now: how long the scenario holds a state."""
    until = time.monotonic() + seconds
    return lambda: time.monotonic() >= until
