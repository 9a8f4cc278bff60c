"""Readiness gates and the drain on termination (docs/zero-downtime.md).

Pure parts first: the gate's name (a valid qualified name whatever the employer's name, checked by
the real API server too), lifecycle-readiness of a gated pod (the circle: never wait for Ready),
the gate decision and the webhook's spec mutation. Then, on the working local cluster
(kube-controller-manager, kube-scheduler, kwok playing the kubelet): a Deployment rolled with
``maxSurge: 25%, maxUnavailable: 0`` behind a Service whose pods the real webhook gates, watched
from the provider's side at every instant; the fail-safe; an employer that lets its pods go; the
drain of a deleted pod; and an adapter that does not follow PodOpsLifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import InformerFactory
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.commands.explain import Explainer, pod_lines
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import gates, lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalCluster, LocalControlPlane, async_wait_for, condition
from resourceconsist.webhook import ControlledServiceAdapter, EmployerRef, pod_mutation
from resourceconsist.webhook.adapter import spec_options
from resourceconsist.webhook.admission import spec_mutation
from resourceconsist.webhook.options import WebhookOptions
from resourceconsist.webhook.server import AdmissionDecision, WebhookServer
from resourceconsist.wire import GateReason

#: Kubernetes' qualified name: an optional DNS-subdomain prefix, ``/``, a name of <= 63 characters.
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LONG_NAMES = [
    "web",
    "a" * 63,
    "a" * 64,
    "b" * 253,
    "orders.v2.payments.example.com",
    "x" * 40 + "." + "y" * 100,
    ("very-long-crd-employer." * 11)[:253].strip("."),
    "-.-" * 30,
]


def _qualified(name: str) -> bool:
    prefix, sep, part = name.rpartition("/")
    return (
        bool(sep)
        and len(prefix) <= 253
        and bool(_DNS_SUBDOMAIN.match(prefix))
        and (len(part) <= 63 and bool(_NAME_PART.match(part)))
    )


@pytest.mark.parametrize("name", LONG_NAMES)
def test_a_gate_is_a_qualified_name_of_our_domain_whatever_the_employer_name(name: str) -> None:
    gate = lifecycle.readiness_gate(name)
    assert _qualified(gate), gate
    assert gate.startswith(wire.READINESS_GATE_DOMAIN + "/")
    assert lifecycle.is_readiness_gate(gate)


def test_short_names_stay_readable_and_long_names_never_share_a_gate() -> None:
    assert lifecycle.readiness_gate("web") == "readiness.resource-consist.kusionstack.io/web"
    assert lifecycle.readiness_gate("a" * 63) == f"{wire.READINESS_GATE_DOMAIN}/{'a' * 63}"
    # Same first characters, different names: different gates (the hash of the whole name).
    one, two = "c" * 70 + "-one", "c" * 70 + "-two"
    assert lifecycle.readiness_gate(one) != lifecycle.readiness_gate(two)
    assert lifecycle.readiness_gate(one) == lifecycle.readiness_gate(one)
    assert len({lifecycle.readiness_gate(n) for n in LONG_NAMES}) == len(LONG_NAMES)


def gate_writes(records: list[logging.LogRecord], pod: str, gate: str = "") -> list[str]:
    """The reasons of the gate conditions written on ``pod`` (of ``gate``, or any), from the
    line readiness logs for each write (resourceconsist/reconcile/readiness.py)."""
    return [
        r.getMessage().rsplit("(", 1)[1].rstrip(")")
        for r in records
        if f"pod {pod}: readiness gate {gate}" in r.getMessage()
    ]


async def test_the_api_server_accepts_every_gate_as_a_readiness_gate(
    control_plane: LocalControlPlane, namespace: str
) -> None:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    try:
        body = {
            "metadata": {"name": "gated"},
            "spec": {
                "containers": [{"name": "c", "image": "x"}],
                "readinessGates": [{"conditionType": lifecycle.readiness_gate(n)} for n in LONG_NAMES],
            },
        }
        created = await asyncio.to_thread(client.create, kube.POD, namespace, body)
        assert lifecycle.readiness_gates(created) == [lifecycle.readiness_gate(n) for n in LONG_NAMES]
    finally:
        client.close()


# -- lifecycle-ready for a gated pod: the circle --------------------------------------------------------

GATE = lifecycle.readiness_gate("web")


def _pod(
    conditions: dict[str, str], gates_: list[str] | None = None, *, deleting: bool = False
) -> KubeObject:
    meta: dict[str, Any] = {"name": "p", "uid": "u-1", "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"readinessGates": [{"conditionType": g} for g in gates_ or []]},
        "status": {
            "conditions": [
                {"type": t, "status": s, "lastTransitionTime": "2026-01-01T00:00:10Z"}
                for t, s in conditions.items()
            ]
        },
    }


def test_a_gated_pod_is_lifecycle_ready_on_containers_ready_and_its_other_gates() -> None:
    other = "example.com/other"
    # Ready is False (our gate waits), yet the pod is ready to be served.
    assert lifecycle.is_lifecycle_ready(_pod({"Ready": "False", "ContainersReady": "True"}, [GATE]))
    # Another employer's gate of ours does not count either: two gated Services never wait on each other.
    two = [GATE, lifecycle.readiness_gate("api")]
    assert lifecycle.is_lifecycle_ready(_pod({"Ready": "False", "ContainersReady": "True"}, two))
    # Other gates must be True, missing counts as not True.
    assert not lifecycle.is_lifecycle_ready(_pod({"ContainersReady": "True"}, [GATE, other]))
    assert lifecycle.is_lifecycle_ready(_pod({"ContainersReady": "True", other: "True"}, [GATE, other]))
    assert not lifecycle.is_lifecycle_ready(_pod({"ContainersReady": "False"}, [GATE]))
    # PodOpsLifecycle's service-ready still takes the pod out.
    sr = wire.SERVICE_READY_CONDITION
    assert not lifecycle.is_lifecycle_ready(_pod({"ContainersReady": "True", sr: "False"}, [GATE, sr]))
    assert not lifecycle.is_lifecycle_ready(_pod({"ContainersReady": "True"}, [GATE], deleting=True))
    # A pod without our gate: Ready, as before.
    assert not lifecycle.is_lifecycle_ready(_pod({"Ready": "False", "ContainersReady": "True"}, [other]))
    assert lifecycle.is_lifecycle_ready(_pod({"Ready": "True"}))


NOW = datetime.datetime(2026, 1, 1, 0, 1, 0, tzinfo=datetime.UTC)  # 50 s after ContainersReady


def _decide(pod: KubeObject, **facts: Any) -> gates.Decision:
    base: dict[str, Any] = {
        "employer": "Service ns/web",
        "employer_deleting": False,
        "employed": True,
        "serving": False,
        "timeout": None,
        "now": NOW,
    }
    return gates.decide(pod, GATE, **{**base, **facts})


def test_the_gate_follows_what_the_provider_confirmed() -> None:
    ready = _pod({"ContainersReady": "True", "Ready": "False"}, [GATE])
    served = _decide(ready, serving=True).want
    assert served is not None and served.status and served.reason is GateReason.SERVING
    waiting = _decide(ready).want
    assert waiting is not None and not waiting.status and waiting.reason is GateReason.NOT_SERVING
    # Unknown (a call failed): the gate stays as it is; a pod without the condition gets False.
    said = _pod({"ContainersReady": "True", GATE: "True"}, [GATE])
    assert _decide(said, serving=None).want is None
    first = _decide(ready, serving=None).want
    assert first is not None and not first.status and first.reason is GateReason.NOT_SERVING
    gone = _decide(ready, employer_deleting=True).want
    assert gone is not None and gone.status and gone.reason is GateReason.EMPLOYER_DELETED
    left = _decide(ready, employed=False).want
    assert left is not None and left.status and left.reason is GateReason.NOT_SELECTED


def test_a_gate_that_is_not_true_says_whether_the_pod_the_provider_or_its_refusal_holds_it() -> None:
    ready = _pod({"ContainersReady": "True", "Ready": "False"}, [GATE])
    stopped = _pod({"ContainersReady": "False", "Ready": "False"}, [GATE])
    for serving in (False, None):
        state = _decide(stopped, serving=serving).want
        assert state is not None and not state.status and state.reason is GateReason.CONTAINERS_NOT_READY
    waiting = _decide(ready, serving=None).want
    assert waiting is not None and waiting.reason is GateReason.NOT_SERVING
    assert "waiting for the provider of Service ns/web to register the pod" in waiting.message
    busy = "ServiceUnavailable: AddVServerGroupBackendServers: busy"
    refused = _decide(ready, serving=None, refused=busy).want
    assert refused is not None and not refused.status and refused.reason is GateReason.PROVIDER_REFUSED
    assert refused.message.endswith(busy)
    # A stale reason is rewritten while the outcome is unknown; a True gate is left alone.
    stale = _pod({"ContainersReady": "True", GATE: "False"}, [GATE])
    assert _decide(stale, serving=None).want == waiting
    served = _pod({"ContainersReady": "True", GATE: "True"}, [GATE])
    assert _decide(served, serving=None, refused="busy").want is None


def test_the_fail_safe_is_off_by_default_and_flips_the_gate_after_its_timeout() -> None:
    ready = _pod({"ContainersReady": "True", "Ready": "False"}, [GATE])
    assert gates.gate_timeout({"metadata": {}}) is None
    early = _decide(ready, timeout=120)
    assert early.want is not None and not early.want.status
    assert early.recheck_after == pytest.approx(70)
    late = _decide(ready, timeout=30, serving=None).want
    assert late is not None and late.status and late.reason is GateReason.TIMEOUT
    # Once let go, it stays so while the provider does not serve the pod.
    flipped = _pod({"ContainersReady": "True", GATE: "True"}, [GATE])
    flipped["status"]["conditions"][1]["reason"] = GateReason.TIMEOUT
    assert _decide(flipped, timeout=30).want is None
    # A pod that is not ready to be served gets no timeout.
    assert _decide(_pod({"ContainersReady": "False"}, [GATE]), timeout=1).recheck_after is None


@pytest.mark.parametrize(("value", "seconds"), [("90", 90.0), ("90s", 90.0), ("2m", 120.0), (" 1.5 ", 1.5)])
def test_durations_read(value: str, seconds: float) -> None:
    employer = {"metadata": {"annotations": {wire.READINESS_GATE_TIMEOUT_ANNOTATION: value}}}
    assert gates.gate_timeout(employer) == seconds


def test_a_bad_duration_says_what_to_write() -> None:
    employer = {"metadata": {"annotations": {wire.READINESS_GATE_TIMEOUT_ANNOTATION: "soon"}}}
    with pytest.raises(gates.InvalidAnnotation, match=r'e\.g\. "90", "90s" or "5m"'):
        gates.gate_timeout(employer)


@pytest.mark.parametrize("value", ["9" * 400, "99999999999999999999", "3601", "61m", "2h"])
def test_a_drain_too_long_or_beyond_a_float_is_refused_naming_the_limit(value: str) -> None:
    # A drain becomes a preStop sleep and a longer grace period: "9" * 400 seconds is infinite
    # as a float, and 10**20 does not fit the int64 the API server stores.
    employer = {"metadata": {"annotations": {wire.DRAIN_SECONDS_ANNOTATION: value}}}
    with pytest.raises(gates.InvalidAnnotation, match="longer than the 3600 seconds allowed"):
        gates.drain_seconds(employer)
    assert gates.drain_seconds({"metadata": {"annotations": {wire.DRAIN_SECONDS_ANNOTATION: "1h"}}}) == 3600


def test_a_gate_timeout_longer_than_a_day_is_refused() -> None:
    employer = {"metadata": {"annotations": {wire.READINESS_GATE_TIMEOUT_ANNOTATION: "25h"}}}
    with pytest.raises(gates.InvalidAnnotation, match="longer than the 86400 seconds allowed"):
        gates.gate_timeout(employer)


def test_the_webhook_admits_a_pod_whose_service_asks_an_impossible_drain() -> None:
    # docs/zero-downtime.md: an unreadable drain time is ignored with a warning, never a refusal.
    service = {
        "metadata": {
            "name": "web",
            "namespace": "ns",
            "annotations": {wire.READINESS_GATE_ANNOTATION: "true", wire.DRAIN_SECONDS_ANNOTATION: "9" * 400},
        }
    }
    assert spec_options(service) == (True, None)


# -- the webhook's spec mutation ----------------------------------------------------------------------


def _spec_pod(containers: list[dict[str, Any]], **spec: Any) -> KubeObject:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers, **spec}}


def test_the_webhook_adds_gates_and_a_prestop_sleep_where_none_is() -> None:
    web = EmployerRef("Service", "ns", "web", readiness_gate=True, drain_seconds=5)
    api = EmployerRef("Service", "ns", "api", readiness_gate=True, drain_seconds=8)
    plain = EmployerRef("Service", "ns", "plain")
    own = {"preStop": {"exec": {"command": ["drain.sh"]}}}
    pod = _spec_pod(
        [{"name": "a"}, {"name": "b", "lifecycle": own}, {"name": "c", "lifecycle": {}}],
        readinessGates=[{"conditionType": "example.com/x"}, {"conditionType": web.gate}],
        terminationGracePeriodSeconds=10,
    )
    ops = spec_mutation(pod, [web, api, plain])
    assert {"op": "add", "path": "/spec/readinessGates/-", "value": {"conditionType": api.gate}} in ops
    assert not any(op.get("value") == {"conditionType": web.gate} for op in ops)  # already there
    sleep = {"sleep": {"seconds": 8}}  # the longest drain time
    assert {"op": "add", "path": "/spec/containers/0/lifecycle", "value": {"preStop": sleep}} in ops
    assert {"op": "add", "path": "/spec/containers/2/lifecycle/preStop", "value": sleep} in ops
    assert not any(op["path"].startswith("/spec/containers/1") for op in ops)  # its own hook stays
    assert {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": 18} in ops
    # Nothing asked, nothing changed; an employer that is not the pod's gives no spec change.
    assert spec_mutation(_spec_pod([{"name": "a"}]), [plain]) == []
    fresh = _spec_pod([{"name": "a"}])
    ops = spec_mutation(fresh, [web])
    assert {"op": "add", "path": "/spec/readinessGates", "value": [{"conditionType": web.gate}]} in ops
    assert {"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": 35} in ops
    # The whole mutation keeps the entry patch first and the spec after it.
    full = pod_mutation(fresh, [web])
    assert full[0]["path"].startswith("/metadata/annotations") and full[1:] == ops


# -- on the working local cluster -----------------------------------------------------------------------

CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
POD_CREATE = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]


@pytest.fixture
def lc(local_cluster: LocalCluster, local_cluster_namespace: str) -> Iterator[Cluster]:
    client = KubeClient.from_kubeconfig(str(local_cluster.kubeconfig))
    yield Cluster(client, local_cluster_namespace)
    client.close()


@contextlib.asynccontextmanager
async def _manager(lc: Cluster, *adapters: Any) -> AsyncIterator[Manager]:
    manager = Manager(lc.client, ManagerOptions(namespace=lc.namespace))
    for adapter in adapters:
        await manager.add(adapter)
    await manager.start()
    try:
        yield manager
    finally:
        await manager.stop(timeout=5)


@contextlib.asynccontextmanager
async def _webhook(
    cluster: LocalCluster, lc: Cluster, tmp_path: Path, decisions: list[AdmissionDecision] | None = None
) -> AsyncIterator[WebhookServer]:
    """The real webhook (``ControlledServiceAdapter``), called by the real API server for the
    controlled pods of the test's namespace; ``decisions`` collects its answers."""
    cert, key = cluster.webhook_certificate()
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(cert, cert_file)
    shutil.copy(key, key_file)
    server = WebhookServer(
        [ControlledServiceAdapter("generic")],
        WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path, bootstrap=None),
        informers=InformerFactory(lc.client),
        own_informers=True,
        observer=None if decisions is None else decisions.append,
    )
    await server.start()
    name = f"rc-gates-{lc.namespace}"
    try:
        await server.wait_ready(timeout=30)
        await asyncio.to_thread(
            cluster.install_webhook,
            name,
            port=server.port,
            path="/mutating-generic",
            rules=POD_CREATE,
            object_selector={"matchLabels": CONTROLLED},
            namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": lc.namespace}},
        )
        yield server
    finally:
        with contextlib.suppress(kube.NotFound):
            await asyncio.to_thread(lc.client.delete, kube.MUTATING_WEBHOOK_CONFIGURATION, None, name)
        await server.stop()


def _stopped(pod: KubeObject) -> bool:
    """The pod's containers have stopped (kwok: after the preStop time of a deletion)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any("terminated" in (c.get("state") or {}) for c in status.get("containerStatuses") or [])


class ProviderWatch:
    """Looks at the provider's serving backends at every instant it can: on every pod event of
    the namespace (from a watch on the real API server) and every 10 ms. Records the fewest
    serving backends seen, and every backend seen serving a pod whose containers had stopped or
    that was gone."""

    def __init__(self, client: KubeClient, namespace: str, provider: FakeProvider, key: str) -> None:
        self.provider, self.key = provider, key
        self.pods: dict[str, KubeObject] = {}
        self.gone: set[str] = set()
        self.fewest: int | None = None
        self.samples = 0
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        listing = client.list(kube.POD, namespace)
        for pod in listing.get("items") or []:
            self.pods[pod["metadata"]["name"]] = pod
        self._stream = client.watch(kube.POD, namespace, listing["metadata"]["resourceVersion"])
        self._threads = [
            threading.Thread(target=self._watch, daemon=True),
            threading.Thread(target=self._tick, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _watch(self) -> None:
        with contextlib.suppress(Exception):  # the stream is closed at the end
            for event in self._stream:
                pod = event.get("object") or {}
                name = pod.get("metadata", {}).get("name")
                if not name:
                    continue
                with self._lock:
                    if event.get("type") == "DELETED":
                        self.pods.pop(name, None)
                        self.gone.add(name)
                    else:
                        self.pods[name] = pod
                self.sample()

    def _tick(self) -> None:
        while not self._stop.wait(0.01):
            self.sample()

    def sample(self) -> None:
        serving = self.provider.serving(self.key)
        with self._lock:
            self.samples += 1
            self.fewest = len(serving) if self.fewest is None else min(self.fewest, len(serving))
            for name in serving:
                pod = self.pods.get(name)
                if name in self.gone or (pod is not None and _stopped(pod)):
                    self.violations.append(name)

    def close(self) -> None:
        self._stop.set()
        self._stream.close()
        for thread in self._threads:
            thread.join(timeout=10)


def _live(pods: list[KubeObject]) -> list[KubeObject]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def _opt_in(lc: Cluster, service_annotations: dict[str, str]) -> None:
    await _label_namespace(lc)
    await lc.service("web", {"app": "web"}, annotations=service_annotations)


async def _webhook_sees(server: WebhookServer, lc: Cluster) -> None:
    """Wait until the webhook's caches hold the namespace label and the Service annotations."""

    def seen() -> bool:
        ns = server.reader.get(kube.NAMESPACE, None, lc.namespace)
        svc = server.reader.get(kube.SERVICE, lc.namespace, "web")
        return bool(svc) and gates.gates_enabled(svc) and _labelled(ns)

    await async_wait_for(seen, timeout=30, message="the webhook's caches to see the opt-in")


async def test_the_webhook_gates_only_in_opted_in_namespaces_for_opted_in_employers(
    local_cluster: LocalCluster, lc: Cluster, tmp_path: Path
) -> None:
    await lc.service("gated", {"role": "probe"}, annotations={wire.READINESS_GATE_ANNOTATION: "true"})
    await lc.service("drained", {"role": "probe"}, annotations={wire.DRAIN_SECONDS_ANNOTATION: "7"})
    await lc.service("plain", {"role": "probe"})
    decisions: list[AdmissionDecision] = []
    probes = iter(range(1000))

    async def admitted() -> KubeObject | None:
        """A pod created through the webhook (the API server reads new configurations late)."""
        name = f"probe-{next(probes)}"
        body = {
            "metadata": {"name": name, "labels": {"role": "probe", **CONTROLLED}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        pod = await lc.call(lc.client.create, kube.POD, lc.namespace, body)
        return pod if any(d.name == name for d in decisions) else None

    async with _webhook(local_cluster, lc, tmp_path, decisions) as server:
        await async_wait_for(
            lambda: len(server.reader.list(kube.SERVICE, lc.namespace)) == 3, timeout=30, message="Services"
        )
        before = await async_wait_for(admitted, timeout=30, interval=0.2, message="the webhook called")
        # Entries, but no spec change: the namespace has not opted in.
        assert len(lifecycle.expected_finalizers(before)) == 3
        assert lifecycle.readiness_gates(before) == []
        assert "lifecycle" not in before["spec"]["containers"][0]
        await _label_namespace(lc)
        await async_wait_for(
            lambda: _labelled(server.reader.get(kube.NAMESPACE, None, lc.namespace)),
            timeout=30,
            message="the webhook's cache to see the label",
        )
        after = await async_wait_for(admitted, timeout=30, interval=0.2, message="the webhook called")
        # Only the employer that asked for a gate gave one; only the one that named a drain time a hook.
        assert lifecycle.readiness_gates(after) == [lifecycle.readiness_gate("gated")]
        assert after["spec"]["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 7}}}
        assert after["spec"]["terminationGracePeriodSeconds"] == 30 + 7


def _labelled(namespace: KubeObject | None) -> bool:
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(wire.READINESS_GATE_INJECT_LABEL) == wire.READINESS_GATE_INJECT_VALUE


async def _label_namespace(lc: Cluster) -> None:
    await lc.call(
        lc.client.patch,
        kube.NAMESPACE,
        None,
        lc.namespace,
        {"metadata": {"labels": {wire.READINESS_GATE_INJECT_LABEL: wire.READINESS_GATE_INJECT_VALUE}}},
    )


REPLICAS = 4


async def test_a_gated_rollout_never_serves_fewer_than_replicas_nor_routes_to_a_stopped_pod(
    local_cluster: LocalCluster, lc: Cluster, tmp_path: Path
) -> None:
    provider = FakeProvider(latency=0.5)  # a load balancer takes time to apply a change
    key = f"{lc.namespace}/web"
    gate = lifecycle.readiness_gate("web")
    await _opt_in(lc, {wire.READINESS_GATE_ANNOTATION: "true", wire.DRAIN_SECONDS_ANNOTATION: "3"})
    async with _webhook(local_cluster, lc, tmp_path) as server:
        await _webhook_sees(server, lc)
        # The template names no gate and no preStop: the webhook adds both.
        await lc.deployment(
            "web", REPLICAS, labels={"app": "web", **CONTROLLED}, max_surge="25%", max_unavailable=0
        )
        async with _manager(lc, DemoAdapter(provider)):
            await lc.wait_rollout("web", timeout=90)
            first = _live(await lc.pods({"app": "web"}))
            assert len(first) == REPLICAS
            for pod in first:
                assert lifecycle.readiness_gates(pod) == [gate]
                container = pod["spec"]["containers"][0]
                assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 3}}
                assert pod["spec"]["terminationGracePeriodSeconds"] == 33
                gate_condition = lifecycle.pod_condition(pod, gate)
                assert gate_condition is not None and gate_condition["reason"] == GateReason.SERVING
            assert provider.serving(key) == {p["metadata"]["name"] for p in first}

            watch = ProviderWatch(lc.client, lc.namespace, provider, key)
            try:
                await lc.roll("web", "2")

                async def rolled_and_served() -> bool:
                    if not await lc.rollout_done("web"):
                        return False
                    pods = await lc.pods({"app": "web"})
                    return len(pods) == REPLICAS and provider.serving(key) == {
                        p["metadata"]["name"] for p in pods
                    }

                await async_wait_for(rolled_and_served, timeout=120, interval=0.2, message="the rollout")
                old = {p["metadata"]["name"] for p in first}
                # Every old pod went through the drain and is gone; the watch saw each step of it.
                await async_wait_for(lambda: old <= watch.gone, timeout=10, message="the deletions seen")
            finally:
                watch.close()
            second = {p["metadata"]["name"] for p in await lc.pods({"app": "web"})}
            assert not second & {p["metadata"]["name"] for p in first}
            assert watch.samples > 100
            assert watch.fewest is not None and watch.fewest >= REPLICAS - 0  # maxUnavailable 0
            assert watch.violations == []


async def test_the_fail_safe_lets_a_pod_become_ready_after_its_timeout_with_an_event(lc: Cluster) -> None:
    provider = FakeProvider()
    provider.fail_next("create_rs", times=10_000, message="the load balancer is down")
    gate = lifecycle.readiness_gate("web")
    await lc.service("web", {"app": "web"}, annotations={wire.READINESS_GATE_TIMEOUT_ANNOTATION: "3s"})
    await lc.deployment("web", 1, readiness_gates=(gate,))
    async with _manager(lc, DemoAdapter(provider)):

        async def let_go() -> KubeObject | None:
            pods = await lc.pods({"app": "web"})
            if pods and (lifecycle.pod_condition(pods[0], gate) or {}).get("reason") == GateReason.TIMEOUT:
                return pods[0]
            return None

        pod = await async_wait_for(let_go, timeout=60, interval=0.2, message="the fail-safe")
        assert pod is not None
        name = pod["metadata"]["name"]
        flipped = lifecycle.pod_condition(pod, gate)
        containers = lifecycle.pod_condition(pod, "ContainersReady")
        assert flipped is not None and containers is not None and flipped["status"] == "True"
        waited = datetime.datetime.fromisoformat(
            flipped["lastTransitionTime"]
        ) - datetime.datetime.fromisoformat(containers["lastTransitionTime"])
        assert waited.total_seconds() >= 3 - 1  # stamps have whole seconds
        assert provider.serving(f"{lc.namespace}/web") == set()  # the provider never served it

        async def warned() -> bool:
            return any(t == "Warning" and r == GateReason.TIMEOUT for t, r, _ in await lc.events(name))

        await async_wait_for(warned, timeout=20, message="the Warning Event on the pod")
        await async_wait_for(lambda: _ready_pod(lc, name), timeout=20, message="the pod Ready")


async def test_slow_provider_calls_show_on_the_gate_with_one_write_each_and_explain_names_them(
    control_plane: LocalControlPlane, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 33: a gated pod's containers turn ready while the provider's calls are slow. The
    gate said ContainersNotReady; within the call that turns its traffic on it says
    ProviderNotServing, with one status write (not one per pass), then ProviderServing with one
    more; while the registration of a new ready pod is in flight its gate says it waits for the
    registration, and explain names the registration as what the gate waits for."""
    provider = FakeProvider(latency=4.0)  # each real-server call takes 4 s to answer
    adapter = DemoAdapter(provider)
    gate = lifecycle.readiness_gate("web")
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    lc = Cluster(client, namespace)
    caplog.set_level(logging.INFO, logger="resourceconsist.reconcile")

    await lc.service("web", {"app": "web"})

    async def gated_pod(name: str) -> None:
        await lc.pod(name, {"app": "web"}, gated_by=["web"])

    async def kubelet(name: str, containers_ready: bool) -> None:
        """Set the pod's IP and ContainersReady as a kubelet would (Ready follows the gate)."""
        ip = lc.ip_of(name)
        conditions = [{"type": "ContainersReady", "status": str(containers_ready)}]
        body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": conditions}}
        await lc.call(
            client.patch, kube.POD, namespace, name, body, patch_type="strategic", subresource="status"
        )

    async def gate_of(name: str) -> tuple[str, str]:
        condition = lifecycle.pod_condition(await lc.get(kube.POD, name) or {}, gate) or {}
        return str(condition.get("reason", "")), str(condition.get("message", ""))

    async def reason_is(name: str, want: str, seen: list[str]) -> bool:
        reason, _ = await gate_of(name)
        if reason and (not seen or seen[-1] != reason):
            seen.append(reason)
        return reason == want

    manager = Manager(client, ManagerOptions(namespace=namespace))
    await manager.add(adapter)
    await manager.start()
    try:
        # 1. A pod whose containers are not ready: registered with traffic off, gate closed.
        seen: list[str] = []
        await gated_pod("web-0")
        await kubelet("web-0", containers_ready=False)
        await async_wait_for(
            lambda: reason_is("web-0", GateReason.CONTAINERS_NOT_READY, seen), timeout=60, message="not ready"
        )
        await async_wait_for(
            lambda: "web-0" in provider.snapshot().get(f"{namespace}/web", {}),
            timeout=60,
            message="registered",
        )
        writes = len(gate_writes(caplog.records, "web-0", gate))
        # 2. Its containers turn ready: the call that turns traffic on takes 4 s.
        await kubelet("web-0", containers_ready=True)
        await async_wait_for(
            lambda: reason_is("web-0", GateReason.NOT_SERVING, seen),
            timeout=30,
            interval=0.1,
            message="pending",
        )
        assert provider.serving(f"{namespace}/web") == set()  # the change is still in flight
        assert (await gate_of("web-0"))[1].endswith("does not serve the pod yet")
        await async_wait_for(
            lambda: reason_is("web-0", GateReason.SERVING, seen), timeout=30, interval=0.1, message="served"
        )
        assert seen == [GateReason.CONTAINERS_NOT_READY, GateReason.NOT_SERVING, GateReason.SERVING]
        # One write to say it waits for the provider, one to open the gate: none per pass.
        written = gate_writes(caplog.records, "web-0", gate)[writes:]
        assert written == [GateReason.NOT_SERVING, GateReason.SERVING]

        # 3. A new pod ready at once: while its registration is in flight, the gate and explain say so.
        await gated_pod("web-1")
        await kubelet("web-1", containers_ready=True)

        async def registering() -> bool:
            reason, message = await gate_of("web-1")
            return reason == GateReason.NOT_SERVING and message.endswith("to register the pod")

        await async_wait_for(
            registering, timeout=30, interval=0.1, message="web-1 waiting for its registration"
        )
        assert "web-1" not in provider.snapshot().get(f"{namespace}/web", {})
        explained = await Explainer(client, [adapter]).pod(namespace, "web-1")
        (waiting,) = [g for g in explained.not_ready if g.gate == gate]
        assert waiting.pending.startswith("the registration"), waiting.pending
        assert any("waits for the registration" in line for line in pod_lines(explained))
        await async_wait_for(
            lambda: reason_is("web-1", GateReason.SERVING, []), timeout=30, message="web-1 served"
        )
    finally:
        await manager.stop(timeout=5)
        client.close()


async def _ready_pod(lc: Cluster, name: str) -> bool:
    return condition(await lc.get(kube.POD, name), "Ready") == "True"


async def test_an_employer_that_stops_selecting_or_is_deleted_lets_its_gate_go(lc: Cluster) -> None:
    provider = FakeProvider()
    provider.fail_next("create_rs", times=10_000, message="the load balancer is down")
    await lc.service("web", {"app": "web"})
    await lc.service("api", {"app": "web"})
    web, api = lifecycle.readiness_gate("web"), lifecycle.readiness_gate("api")
    await lc.deployment("web", 1, readiness_gates=(web, api))
    async with _manager(lc, DemoAdapter(provider)):

        async def gate_is(gate: str, status: str, reason: str) -> bool:
            pods = await lc.pods({"app": "web"})
            found = lifecycle.pod_condition(pods[0], gate) if pods else None
            return found is not None and found.get("status") == status and found.get("reason") == reason

        await async_wait_for(lambda: gate_is(web, "False", GateReason.NOT_SERVING), timeout=60)
        # "web" now selects nothing: the pod keeps its gate, the frame lets it go.
        await lc.patch(kube.SERVICE, "web", {"spec": {"selector": {"app": "other"}}})
        await async_wait_for(lambda: gate_is(web, "True", GateReason.NOT_SELECTED), timeout=30)
        assert await gate_is(api, "False", GateReason.NOT_SERVING)
        # "api" is deleted: its gate goes True too, and the pod becomes Ready.
        await lc.delete(kube.SERVICE, "api")
        await async_wait_for(lambda: gate_is(api, "True", GateReason.EMPLOYER_DELETED), timeout=30)
        pod = (await lc.pods({"app": "web"}))[0]
        await async_wait_for(lambda: _ready_pod(lc, pod["metadata"]["name"]), timeout=20)


async def test_a_deleted_pod_is_drained_before_its_containers_stop_and_kept_until_released(
    lc: Cluster,
) -> None:
    provider = FakeProvider(latency=0.5)
    key = f"{lc.namespace}/web"
    gate = lifecycle.readiness_gate("web")
    await lc.service("web", {"app": "web"})
    await lc.deployment("web", 2, readiness_gates=(gate,), pre_stop_seconds=3)
    async with _manager(lc, DemoAdapter(provider)):
        await lc.wait_rollout("web", timeout=60)
        await async_wait_for(lambda: len(provider.serving(key)) == 2, timeout=30)
        victim = sorted(provider.serving(key))[0]
        watch = ProviderWatch(lc.client, lc.namespace, provider, key)
        try:
            await lc.delete(kube.POD, victim)
            # The provider lets go while the containers still run out their preStop time ...
            await async_wait_for(lambda: victim not in provider.serving(key), timeout=10)
            pod = await lc.get(kube.POD, victim)
            assert pod is not None and not _stopped(pod), "drained before the containers stopped"
            # ... and the pod goes only once the provider holds nothing for it.
            await async_wait_for(lambda: _gone(lc, victim), timeout=30, message="the pod released")
            assert victim not in provider.snapshot().get(key, {})
            await async_wait_for(lambda: victim in watch.gone, timeout=10, message="the deletion seen")
        finally:
            watch.close()
        assert watch.violations == []


async def _gone(lc: Cluster, name: str) -> bool:
    return await lc.get(kube.POD, name) is None


class NoLifecycleDemo(DemoAdapter):
    """The demo adapter without PodOpsLifecycle: no finalizers, no entries; gates still work."""

    def follow_pod_ops_lifecycle(self) -> bool:
        return False


async def test_gates_work_without_pod_ops_lifecycle(lc: Cluster) -> None:
    provider = FakeProvider()
    gate = lifecycle.readiness_gate("web")
    await lc.service("web", {"app": "web"})
    await lc.deployment("web", 2, readiness_gates=(gate,))
    async with _manager(lc, NoLifecycleDemo(provider)):
        await lc.wait_rollout("web", timeout=60)
        pods = await lc.pods({"app": "web"})
        assert provider.serving(f"{lc.namespace}/web") == {p["metadata"]["name"] for p in pods}
        for pod in pods:
            assert (lifecycle.pod_condition(pod, gate) or {}).get("reason") == GateReason.SERVING
            assert not pod["metadata"].get("finalizers")


async def test_the_tutorial_adapter_serves_gated_pods_and_their_rollout_completes(
    lc: Cluster, tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    backends = tutorial["BackendsDir"](tmp_path / "backends")
    gate = lifecycle.readiness_gate("web")
    await lc.service("web", {"app": "web"})
    await lc.deployment("web", 2, readiness_gates=(gate,))
    async with _manager(lc, tutorial["FileAdapter"](backends)):
        # Ready waits on the gate, the gate on the file: only weight before Ready ends the rollout.
        await lc.wait_rollout("web", timeout=60)
        pods = await lc.pods({"app": "web"})
        content = backends.read(lc.namespace, "web")
        assert {n: line["weight"] for n, line in content["pods"].items()} == {
            p["metadata"]["name"]: 100 for p in pods
        }
        for pod in pods:
            assert (lifecycle.pod_condition(pod, gate) or {}).get("reason") == GateReason.SERVING
