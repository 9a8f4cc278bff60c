"""``resourceconsist handover`` (docs/wire-contract.md, "Switching back to the Go original"): after
it, every pod carries only what the Go original manages, and no pod the provider holds was ever
without one of the employer's two finalizers.

The demo controller runs on the real control plane and brings the pods into each state; it is
stopped (its Lease released); the hand-over then runs in the same process against the same
in-memory provider, whose state outlives the controller as a real load balancer's would. A watch
on the API server checks every pod version written meanwhile against the provider's state.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import MODE_ANNOTATION, SERVER_ID_ANNOTATION, SLBAdapter
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import RetryPolicy, SLBClient
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.commands.handover import (
    ControllerRunning,
    Handover,
    HandoverError,
    HandoverReport,
    _Employer,
    _share_finalizers,
    hand_over,
)
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider, ProviderError, RealServer
from resourceconsist.options import LeaderElectionOptions
from resourceconsist.reconcile.podwriter import EmployerEntry
from resourceconsist.rules import lifecycle
from resourceconsist.testing import (
    Cluster,
    LocalControlPlane,
    annotation,
    async_wait_for,
    condition,
    finalizers,
    run_cli,
)


@dataclass
class PartlyUnreachableProvider(FakeProvider):
    """The fake provider, except that reads of the employers in ``unreachable`` fail (a network
    fault: their state is unknown)."""

    unreachable: set[str] = field(default_factory=set)

    def query_rs(self, employer: str) -> dict[str, RealServer]:
        if employer in self.unreachable:
            raise ProviderError(f"query_rs {employer}: connection reset, state unknown")
        return super().query_rs(employer)


class FinalizerWatch:
    """Watches the namespace's pods; for every version the API server sends, asks the provider
    which employers hold the pod at that moment and records the versions that lack both of such
    an employer's finalizers (a moment the guard invariant was broken)."""

    def __init__(self, client: KubeClient, namespace: str, provider: FakeProvider) -> None:
        self.namespace, self.provider = namespace, provider
        self.seen: list[tuple[str, list[str]]] = []
        self.unguarded: list[tuple[str, str, list[str]]] = []
        listing = client.list(kube.POD, namespace)
        self.last_version = {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in listing["items"]
        }
        self._stream = client.watch(kube.POD, namespace, listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                pod = event.get("object") or {}
                meta = pod.get("metadata") or {}
                name, held_finalizers = meta.get("name", ""), finalizers(pod)
                self.last_version[name] = str(meta.get("resourceVersion", ""))
                if event.get("type") == "DELETED":
                    held_finalizers = []
                self.seen.append((name, held_finalizers))
                for key, servers in self.provider.snapshot().items():
                    employer = key.rpartition("/")[2]
                    ours = {lifecycle.guard_finalizer(employer), lifecycle.lifecycle_finalizer(employer)}
                    if name in servers and not ours & set(held_finalizers):
                        self.unguarded.append((name, key, held_finalizers))
        except Exception:  # the stream is closed at the end of the test
            return

    async def caught_up(self, client: KubeClient) -> None:
        """Wait until the watch has seen the current version of every pod of the namespace."""

        def done() -> bool:
            pods = client.list(kube.POD, self.namespace)["items"]
            return all(
                self.last_version.get(p["metadata"]["name"]) == p["metadata"]["resourceVersion"] for p in pods
            )

        await async_wait_for(
            lambda: asyncio.to_thread(done), interval=0.5, message="the watch to see every pod write"
        )

    def close(self) -> None:
        self._stream.close()
        self._thread.join(timeout=10)


def _lease(namespace: str) -> LeaderElectionOptions:
    return LeaderElectionOptions(name="handover-test", namespace=namespace)


async def _pod(cluster: Cluster, name: str) -> KubeObject:
    pod = await cluster.get(kube.POD, name)
    assert pod is not None, f"pod {name} is gone"
    return pod


def _kept(report: HandoverReport) -> dict[str, str]:
    return {k.pod.rpartition("/")[2]: k.why for k in report.kept}


async def test_the_hand_over_leaves_only_what_the_go_original_manages_and_never_a_held_pod_unguarded(
    cluster: Cluster, run_manager: Any, kube_client: KubeClient
) -> None:
    ns = cluster.namespace
    provider = PartlyUnreachableProvider()
    web, api = f"{ns}/web", f"{ns}/api"
    guard, served_by = lifecycle.guard_finalizer("web"), lifecycle.lifecycle_finalizer("web")
    entry_key = f"Service/{ns}/web"
    await cluster.service("web")
    await cluster.service("api")
    # web-served: registered and ready; web-held: registered, not ready (gated, its gate False);
    # web-dropped: registered, not ready, then deleted from the provider behind our back;
    # web-leaving: registered, then deleted while the controller is down; api-0: unknown.
    for name in ("web-served", "web-dropped", "web-leaving"):
        await cluster.pod(name, {"app": "web"})
    await cluster.pod("web-held", {"app": "web"}, gated_by=["web"])  # as the webhook would have
    await cluster.pod("api-0", {"app": "api"})
    await cluster.set_status("web-served", ready=True)
    for name in ("web-held", "web-dropped", "web-leaving", "api-0"):
        await cluster.set_status(name, ready=False)

    # Record mode: the Go original finds the pods that carry the lifecycle finalizer in the record.
    adapter = functools.partial(DemoAdapter, provider, record_lifecycle_finalizers=True)
    async with run_manager(adapter(), leader_election=_lease(ns)):

        async def states_reached() -> bool:
            want = {
                "web-served": [served_by],
                "web-held": [guard],
                "web-dropped": [guard],
                "web-leaving": [guard],
                "api-0": [lifecycle.guard_finalizer("api")],
            }
            for name, fins in want.items():
                if finalizers(await cluster.get(kube.POD, name)) != fins:
                    return False
            return condition(await _pod(cluster, "web-held"), lifecycle.readiness_gate("web")) == "False"

        await async_wait_for(states_reached, timeout=60, message="the controller to guard and serve the pods")
        assert provider.serving(web) == {"web-served"}
        assert set(provider.snapshot()[web]) == {"web-served", "web-held", "web-dropped", "web-leaving"}

        with pytest.raises(ControllerRunning, match="stop it first"):
            await hand_over(kube_client, [adapter()], _lease(ns))

    # The controller is stopped. Behind its back: web-dropped loses its backend, web-leaving is
    # deleted (its guard holds it), and api's provider stops answering.
    provider.drop_real_server(web, "web-dropped")
    await cluster.call(kube_client.delete, kube.POD, ns, "web-leaving")
    provider.unreachable.add(api)
    watch = FinalizerWatch(kube_client, ns, provider)
    try:
        report = await hand_over(kube_client, [adapter()], _lease(ns), namespaces=[ns])
        await watch.caught_up(kube_client)
        assert watch.unguarded == [], "a pod the provider holds was without both finalizers"

        for name in ("web-served", "web-held"):
            pod = await _pod(cluster, name)
            assert finalizers(pod) == [served_by], name
            assert lifecycle.expected_finalizers(pod)[entry_key] == served_by, name
        assert finalizers(await _pod(cluster, "web-dropped")) == []
        assert finalizers(await _pod(cluster, "web-leaving")) == [guard], (
            "nothing can be added to a deleting pod"
        )
        assert finalizers(await _pod(cluster, "api-0")) == [lifecycle.guard_finalizer("api")]
        kept = _kept(report)
        assert set(kept) == {"web-leaving", "api-0"}
        assert "provider lookup failed" in kept["api-0"]
        assert "deleting" in kept["web-leaving"]
        assert not report.complete
        service = await cluster.get(kube.SERVICE, "web")
        assert annotation(service, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION) == "web-held,web-served"
        gate = lifecycle.pod_condition(await _pod(cluster, "web-held"), lifecycle.readiness_gate("web"))
        assert gate is not None
        assert (gate["status"], gate["reason"]) == ("True", wire.GateReason.HANDED_OVER)
        # Nothing asked the provider to change: the hand-over only reads it.
        assert set(provider.snapshot()[web]) == {"web-served", "web-held", "web-leaving"}

        # The Go original deregisters the deleting pod (it never removes our guard) and api's
        # provider answers again: a second run finishes the job.
        provider.drop_real_server(web, "web-leaving")
        provider.unreachable.clear()
        again = await hand_over(kube_client, [adapter()], _lease(ns), namespaces=[ns])
        assert again.complete, again.lines()
        assert finalizers(await _pod(cluster, "api-0")) == [lifecycle.lifecycle_finalizer("api")]

        async def leaving_gone() -> bool:
            return await cluster.get(kube.POD, "web-leaving") is None

        await async_wait_for(leaving_gone, message="web-leaving to complete its deletion")
        await cluster.call(kube_client.delete, kube.POD, ns, "web-dropped")

        async def dropped_gone() -> bool:
            return await cluster.get(kube.POD, "web-dropped") is None

        await async_wait_for(dropped_gone, message="web-dropped to be deleted: nothing of ours holds it")
        await watch.caught_up(kube_client)
    finally:
        watch.close()
    assert watch.unguarded == [], watch.unguarded
    # The watch saw the swaps it judged (it cannot pass by seeing nothing).
    assert ("web-held", [served_by]) in watch.seen
    assert ("api-0", [lifecycle.lifecycle_finalizer("api")]) in watch.seen


async def test_a_dry_run_reports_what_the_run_then_does(cluster: Cluster, kube_client: KubeClient) -> None:
    """Four pods the provider may or may not hold: the dry run reports each outcome and writes
    nothing; the run then does exactly that. A lone lifecycle finalizer stays on a live pod the
    Service selects (the Go original registers it and keeps or releases it by readiness), and
    goes from one it does not select (the Go original would never look at it again)."""
    ns = cluster.namespace
    provider = FakeProvider()
    guard, served_by = lifecycle.guard_finalizer("web"), lifecycle.lifecycle_finalizer("web")
    await cluster.service("web")
    pods = {
        "held": ("web", [guard]),
        "gone": ("web", [guard]),
        "lone-selected": ("web", [served_by]),
        "lone-unselected": ("other", [served_by]),
    }
    for name, (app, fins) in pods.items():
        body = {
            "metadata": {"name": name, "labels": {"app": app}, "finalizers": fins},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        }
        await cluster.call(kube_client.create, kube.POD, ns, body)
    provider.real_servers[f"{ns}/web"] = {"held": RealServer(cluster.ip_of("held"), False, 0)}
    outcome = {
        "held": "lifecycle finalizer",
        "gone": "released",
        "lone-selected": "lifecycle finalizer",
        "lone-unselected": "released",
    }

    dry = await hand_over(kube_client, [DemoAdapter(provider)], _lease(ns), namespaces=[ns], dry_run=True)

    assert {d.pod.rpartition("/")[2]: d.action for d in dry.done} == outcome
    for name, (_, fins) in pods.items():
        assert finalizers(await _pod(cluster, name)) == fins, "a dry run writes nothing"

    done = await hand_over(kube_client, [DemoAdapter(provider)], _lease(ns), namespaces=[ns])

    assert {d.pod.rpartition("/")[2]: d.action for d in done.done} == outcome
    assert done.complete
    assert finalizers(await _pod(cluster, "held")) == [served_by]
    assert finalizers(await _pod(cluster, "gone")) == []
    assert finalizers(await _pod(cluster, "lone-selected")) == [served_by]
    assert finalizers(await _pod(cluster, "lone-unselected")) == []


async def test_the_command_refuses_while_the_lease_is_renewed_then_releases_a_pod_the_provider_lost(
    cluster: Cluster, kube_client: KubeClient, control_plane: LocalControlPlane
) -> None:
    """Through the command line, with a fresh demo provider (it holds nothing): a guarded pod is
    released; while a holder renews the Lease, nothing is done and the command says why."""
    ns = cluster.namespace
    guard = lifecycle.guard_finalizer("web")
    await cluster.service("web")
    body = {
        "metadata": {"name": "p", "labels": {"app": "web"}, "finalizers": [guard]},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    }
    await cluster.call(kube_client.create, kube.POD, ns, body)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "metadata": {"name": "handover-test", "namespace": ns},
        "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 600, "renewTime": now},
    }
    await cluster.call(kube_client.create, kube.LEASE, ns, lease)
    args = ("handover", "--adapter", "demo", "--kubeconfig", str(control_plane.kubeconfig), "--namespace", ns)
    args += ("--leader-election-namespace", ns, "--leader-election-id", "handover-test")

    refused = await asyncio.to_thread(run_cli, *args)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "held by controller-0" in refused.stderr
    assert finalizers(await _pod(cluster, "p")) == [guard]

    await cluster.call(kube_client.delete, kube.LEASE, ns, "handover-test")
    done = await asyncio.to_thread(run_cli, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"released: pod {ns}/p (Service {ns}/web)" in done.stdout
    assert finalizers(await _pod(cluster, "p")) == []


async def test_the_command_hands_over_the_namespaces_given_as_run_takes_them(
    cluster: Cluster, kube_client: KubeClient, control_plane: LocalControlPlane
) -> None:
    """``--namespace a,b`` (as ``run`` takes it): the guarded pods of both namespaces are released
    (a fresh demo provider holds nothing), a third namespace's pod is not touched; a list with an
    empty name is refused with what to give instead, and nothing is written."""
    guard = lifecycle.guard_finalizer("web")
    second, third = (Cluster(kube_client, f"t-{uuid.uuid4().hex[:10]}") for _ in range(2))
    for where in (second, third):
        await where.call(kube_client.create, kube.NAMESPACE, None, {"metadata": {"name": where.namespace}})
    for where in (cluster, second, third):
        await where.service("web")
        body = {
            "metadata": {"name": "p", "labels": {"app": "web"}, "finalizers": [guard]},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        }
        await where.call(kube_client.create, kube.POD, where.namespace, body)
    args = ("handover", "--adapter", "demo", "--kubeconfig", str(control_plane.kubeconfig))
    args += ("--leader-election-namespace", cluster.namespace, "--leader-election-id", "handover-test")

    refused = await asyncio.to_thread(
        run_cli, *args, "--namespace", f"{cluster.namespace},,{second.namespace}"
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "holds an empty namespace name" in refused.stderr
    assert finalizers(await _pod(second, "p")) == [guard]

    done = await asyncio.to_thread(run_cli, *args, "--namespace", f"{cluster.namespace},{second.namespace}")
    assert done.returncode == 0, done.stdout + done.stderr
    for where in (cluster, second):
        assert f"released: pod {where.namespace}/p (Service {where.namespace}/web)" in done.stdout
        assert finalizers(await _pod(where, "p")) == []
    assert third.namespace not in done.stdout
    assert finalizers(await _pod(third, "p")) == [guard], "a namespace not given is not touched"


def test_employers_sharing_a_name_share_what_the_provider_holds() -> None:
    """A Service and a custom employer named alike in one namespace share their finalizers: a
    pod either provider holds is held for both, and one unknown answer leaves both unknown."""

    def employer(kind: str, held: set[str] | None) -> _Employer:
        entry = EmployerEntry(
            key=f"{kind}/ns/web",
            lifecycle_finalizer=lifecycle.lifecycle_finalizer("web"),
            guard_finalizer=lifecycle.guard_finalizer("web"),
        )
        resource = kube.Resource("example.com", "v1", kind, kind.lower() + "s")
        obj = {"metadata": {"name": "web", "namespace": "ns"}}
        return _Employer(
            obj, resource, [], entry, held=held, error="" if held is not None else "lookup failed"
        )

    service, custom = employer("Service", {"a"}), employer("Web", {"b"})
    _share_finalizers([service, custom])
    assert service.held == custom.held == {"a", "b"}

    service, custom = employer("Service", {"a"}), employer("Web", None)
    _share_finalizers([service, custom])
    assert service.held is None
    assert custom.held is None
    assert service.error == "lookup failed"


async def test_the_slb_adapter_hands_over_through_the_real_sdk(cluster: Cluster, run_manager: Any) -> None:
    """The SLB adapter in manage mode, on the real SDK answered by the SLB emulator, whose state
    outlives the controller: the pod it holds at weight 0 trades its guard for the lifecycle
    finalizer; while the load balancer cannot be read, nothing changes."""
    ns = cluster.namespace
    guard, served_by = lifecycle.guard_finalizer("web"), lifecycle.lifecycle_finalizer("web")
    retry = RetryPolicy(max_attempts=2, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=5)
    with SLBEmulator(
        access_key_id="LTAI5tHandoverKey9", access_key_secret="Handover/Secret=1", seed=5
    ) as slb:
        lb = slb.add_load_balancer()
        labels = {LOAD_BALANCER_ID_LABEL: lb}
        await cluster.service("web", labels=labels, annotations={MODE_ANNOTATION: "manage"})
        for index, name in enumerate(("web-0", "web-1")):
            annotations = {SERVER_ID_ANNOTATION: f"eni-node{index}"}
            await cluster.pod(name, {"app": "web"}, readiness_gate=True, annotations=annotations)
            await cluster.set_status(name, ready=True, service_ready=True)

        def adapter() -> SLBAdapter:
            return SLBAdapter(SLBClient(slb.credentials(), retry=retry), cluster_name="handover-test")

        async def finalizers_are(name: str, want: list[str]) -> bool:
            return finalizers(await cluster.get(kube.POD, name)) == want

        async with run_manager(adapter()):
            for name in ("web-0", "web-1"):
                await async_wait_for(lambda n=name: finalizers_are(n, [served_by]), timeout=45, message=name)
            # PodOpsLifecycle takes web-1 out of traffic: its backend goes to weight 0, guarded.
            await cluster.set_status("web-1", ready=True, service_ready=False)
            await async_wait_for(lambda: finalizers_are("web-1", [guard]), timeout=45, message="web-1 held")

        mutating = len(slb.mutating_calls())
        slb.fail_next("DescribeVServerGroupAttribute", times=10, code="ServiceUnavailable", status=503)
        unknown = await hand_over(cluster.client, [adapter()], _lease(ns), namespaces=[ns])
        assert set(_kept(unknown)) == {"web-1"}
        assert finalizers(await cluster.get(kube.POD, "web-1")) == [guard]

        slb.clear_faults()
        report = await hand_over(cluster.client, [adapter()], _lease(ns), namespaces=[ns])
        assert report.complete, report.lines()
        for name in ("web-0", "web-1"):
            assert finalizers(await cluster.get(kube.POD, name)) == [served_by], name
        assert len(slb.mutating_calls()) == mutating, "the hand-over only reads the load balancer"


def test_an_adapter_whose_pods_live_in_member_clusters_is_refused_with_the_reason() -> None:
    class InMembers(DemoAdapter):
        def employee_fed(self) -> bool:
            return False

    with pytest.raises(HandoverError, match="member clusters; the hand-over covers one cluster's pods"):
        Handover(cast(KubeClient, None), [InMembers()])
