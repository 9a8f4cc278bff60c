"""The ``alibabacloudslb`` adapter end to end: a real kube-apiserver + etcd, the real Alibaba Cloud
SDK on its real HTTP path, answered by the stateful SLB emulator.

Observe mode: the test plays Alibaba's CCM (it changes the load balancer's backends and health);
lifecycle finalizers follow what the load balancer lists, the adapter backs off while it waits and
never calls a mutating API. Manage mode: 45 ready pods become 45 backends in batches of at most
20; leaving pods are set to weight 0 before removal and keep their finalizer until removed;
foreign groups and backends stay untouched; throttling and ambiguous failures still converge
without a double add; a group still attached to a listener blocks the Service's deletion with a
Warning event. A mode annotation that is neither is a Warning event and no write, until fixed:
the next pass reads the mode again. Every test checks that no log record (captured at DEBUG) and
no Event shows the access key id or secret.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import (
    DRAIN_ANNOTATION,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    WEIGHT_ANNOTATION,
    SLBAdapter,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import (
    MUTATING_ACTIONS,
    BackendServer,
    RetryPolicy,
    SLBClient,
)
from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, annotation, async_wait_for, finalizers

KEY_ID = "LTAI5tAdapterKeyId7Q2"
SECRET = "Adapter/Secret+Value=9Zq"
#: The cluster name the adapter tags its VServer groups with.
CLUSTER = "slb-tests"
ADD = "AddVServerGroupBackendServers"
SET = "SetVServerGroupAttribute"
REMOVE = "RemoveVServerGroupBackendServers"
HEALTH = "DescribeHealthStatus"
FLZ = lifecycle.lifecycle_finalizer("web")


# ---- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_credentials_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture every log record at DEBUG; none may show the key id or the secret."""
    caplog.set_level(logging.DEBUG)
    yield
    texts = [caplog.text]
    for record in caplog.records:
        texts.append(record.getMessage())
        if record.exc_text:
            texts.append(record.exc_text)
    _assert_no_credentials("\n".join(texts), "captured logs")


def _assert_no_credentials(text: str, where: str) -> None:
    for secret in (KEY_ID, SECRET, quote(SECRET, safe=""), quote(quote(SECRET, safe=""), safe="")):
        assert secret not in text, f"a credential shows in the {where}"


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(access_key_id=KEY_ID, access_key_secret=SECRET, seed=11) as emulator:
        yield emulator


#: Retries as in production, only with short waits so that the tests stay fast.
RETRY = RetryPolicy(max_attempts=8, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=10)


@pytest.fixture
def adapter(slb: SLBEmulator) -> Iterator[SLBAdapter]:
    client = SLBClient(slb.credentials(), retry=RETRY)
    yield SLBAdapter(client, cluster_name=CLUSTER)
    client.close()


# ---- helpers ------------------------------------------------------------------------------------


async def _slb_service(cluster: Cluster, lb: str, *, manage: bool, **annotations: str) -> None:
    if manage:
        annotations[MODE_ANNOTATION] = "manage"
    await cluster.service("web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations=dict(annotations))


async def _ready_pods(cluster: Cluster, names: list[str], *, eni: bool = True) -> None:
    """Pods with the service-ready gate, Ready and service-ready (ENI id annotated when ``eni``)."""

    async def one(index: int, name: str) -> None:
        annotations = {SERVER_ID_ANNOTATION: f"eni-node{index % 3}"} if eni else {}
        await cluster.pod(name, {"app": "web"}, readiness_gate=True, annotations=annotations)
        await cluster.set_status(name, ready=True, service_ready=True)

    await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))


def _eni(cluster: Cluster, pod: str, *, weight: int = 100, port: int = 80) -> BackendServer:
    """The backend CCM would put into its group for ``pod`` in a terway cluster."""
    return BackendServer(
        server_id="eni-ccm", port=port, weight=weight, server_type="eni", server_ip=cluster.ip_of(pod)
    )


async def _pod_finalizers(cluster: Cluster, name: str) -> list[str] | None:
    pod = await cluster.get(kube.POD, name)
    return None if pod is None else finalizers(pod)


async def _guarded(cluster: Cluster, names: list[str]) -> bool:
    for name in names:
        if FLZ not in (await _pod_finalizers(cluster, name) or []):
            return False
    return True


async def _released(cluster: Cluster, name: str) -> bool:
    """The pod exists and no longer carries the lifecycle finalizer."""
    held = await _pod_finalizers(cluster, name)
    return held is not None and FLZ not in held


async def _gone(cluster: Cluster, resource: kube.Resource, name: str) -> bool:
    return await cluster.get(resource, name) is None


def _member(slb: SLBEmulator, group: str, ip: str) -> BackendServer | None:
    return next((b for b in slb.backends(group) if b.server_ip == ip), None)


def _ops(slb: SLBEmulator, group: str) -> list[tuple[str, str, int | None]]:
    """(action, server ip, weight) of every executed backend write to ``group``, in order."""
    found = []
    for call in slb.calls:
        if call.executed and call.action in (ADD, SET, REMOVE) and call.params.get("VServerGroupId") == group:
            found.extend((call.action, str(s.get("ServerIp")), s.get("Weight")) for s in call.backend_servers)
    return found


async def _events_text(cluster: Cluster, name: str) -> str:
    text = "\n".join(f"{t} {r} {m}" for t, r, m in await cluster.events(name))
    _assert_no_credentials(text, "Events")
    return text


# ---- observe mode -----------------------------------------------------------------------------------


async def test_observe_mode_finalizers_follow_what_ccm_put_in_the_load_balancer(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    key = f"{cluster.namespace}/web"
    pods = ["web-0", "web-1", "web-2"]
    await _slb_service(cluster, lb, manage=False)
    await _ready_pods(cluster, pods, eni=False)
    # A Service without the load balancer label is not this adapter's business.
    await cluster.service("plain", selector={"app": "web"})
    async with run_manager(adapter):
        # CCM has not caught up: no pod is guarded yet, and the adapter looks again with a
        # growing interval instead of every 100 ms.
        await async_wait_for(
            lambda: adapter.backoff.waiting().get(key, 0) >= 1.6, timeout=20, message="backoff >= 1.6s"
        )
        waited_calls = len(slb.calls_of(HEALTH))
        assert waited_calls <= 14, f"{waited_calls} DescribeHealthStatus calls while waiting ~2s"
        for name in pods:
            assert FLZ not in (await _pod_finalizers(cluster, name) or [])

        # CCM adds the pods (its own group, named as CCM names them).
        ccm = slb.add_vserver_group(
            lb,
            f"k8s/80/web/{cluster.namespace}/c0ffee",
            listener_ports=[80],
            backends=[_eni(cluster, p) for p in pods],
        )
        await async_wait_for(lambda: _guarded(cluster, pods), timeout=45, message="finalizers after CCM")

        async def recorded() -> bool:
            # Written right after the pods, in the same pass.
            svc = await cluster.get(kube.SERVICE, "web")
            return annotation(svc, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION) == "web-0,web-1,web-2"

        await async_wait_for(recorded, timeout=10, message="the Service records the guarded pods")
        await async_wait_for(
            lambda: key not in adapter.backoff.waiting(), timeout=10, message="backoff reset"
        )

        # web-0 leaves service; CCM still lists it (even unhealthy): the finalizer stays.
        await cluster.set_status("web-0", ready=True, service_ready=False)
        slb.set_health(lb, "eni-ccm", 80, "abnormal")
        before = len(slb.calls_of(HEALTH))
        await async_wait_for(
            lambda: len(slb.calls_of(HEALTH)) >= before + 3, timeout=20, message="3 more looks"
        )
        assert FLZ in (await _pod_finalizers(cluster, "web-0") or [])
        # CCM removes it: released.
        slb.set_backends(ccm, [_eni(cluster, p) for p in ("web-1", "web-2")])

        await async_wait_for(
            lambda: _released(cluster, "web-0"), timeout=45, message="web-0 released after CCM removed it"
        )

        # web-1 is deleted: held while CCM lists it, gone once CCM drops it.
        await cluster.delete(kube.POD, "web-1")
        before = len(slb.calls_of(HEALTH))
        await async_wait_for(
            lambda: len(slb.calls_of(HEALTH)) >= before + 2, timeout=20, message="2 more looks"
        )
        pod = await cluster.get(kube.POD, "web-1")
        assert pod is not None and pod["metadata"].get("deletionTimestamp") and FLZ in finalizers(pod)
        slb.set_backends(ccm, [_eni(cluster, "web-2")])
        await async_wait_for(lambda: _gone(cluster, kube.POD, "web-1"), timeout=45, message="web-1 gone")

        # The Service is deleted: web-2 is released once CCM has taken it out too.
        await cluster.delete(kube.SERVICE, "web")
        slb.set_backends(ccm, [])
        await async_wait_for(lambda: _gone(cluster, kube.SERVICE, "web"), timeout=45, message="Service gone")
        assert FLZ not in (await _pod_finalizers(cluster, "web-2") or [])

    assert slb.mutating_calls() == [], "observe mode never changes the load balancer"
    assert await cluster.get(kube.SERVICE, "plain") is not None
    assert not finalizers(await cluster.get(kube.SERVICE, "plain")), "unlabelled Service untouched"
    await _events_text(cluster, "web")


async def test_observe_mode_reports_a_missing_load_balancer_as_a_warning(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    await _slb_service(cluster, "lb-doesnotexist", manage=False)
    await _ready_pods(cluster, ["web-0"], eni=False)
    async with run_manager(adapter):

        async def warned() -> bool:
            return "InvalidLoadBalancerId.NotFound" in await _events_text(cluster, "web")

        await async_wait_for(warned, timeout=30, message="a Warning event with the provider's code")
    text = await _events_text(cluster, "web")
    assert "Warning GetCurrentEmployeesFailed" in text
    assert "The specified load balancer does not exist." in text


async def test_a_bad_mode_is_a_warning_event_and_the_next_pass_reads_the_fixed_mode(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    await _slb_service(cluster, lb, manage=False, **{MODE_ANNOTATION: "own"})
    await _ready_pods(cluster, ["web-0"])
    async with run_manager(adapter):

        async def warned() -> str:
            text = await _events_text(cluster, "web")
            return text if "slb-mode" in text else ""

        text = await async_wait_for(warned, timeout=30, message="a Warning event naming the annotation")
        assert (
            f"Warning GetExpectedEmployerFailed get expect employer failed: Service {cluster.namespace}/web: "
            "annotation resource-consist.kusionstack.io/slb-mode='own' is neither 'observe' nor 'manage'"
        ) in text
        assert not slb.mutating_calls()
        assert FLZ not in (await _pod_finalizers(cluster, "web-0") or [])

        # Fixed: a later pass of the same Service reads the mode again and manages the pod.
        await cluster.patch(kube.SERVICE, "web", {"metadata": {"annotations": {MODE_ANNOTATION: "manage"}}})
        await async_wait_for(lambda: _guarded(cluster, ["web-0"]), timeout=30, message="web-0 guarded")
    group_name = vserver_group_name(await cluster.get(kube.SERVICE, "web") or {})
    group = next(g.id for g in slb.vserver_groups(lb) if g.name == group_name)
    assert _member(slb, group, cluster.ip_of("web-0")) is not None


# ---- manage mode ------------------------------------------------------------------------------------


async def test_manage_mode_batches_drains_releases_and_leaves_foreign_backends_alone(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    ns = cluster.namespace
    lb = slb.add_load_balancer()
    names = [f"web-{i:02d}" for i in range(45)]
    # CCM's group for the same Service and pods, and a group of someone else's: never ours.
    ccm = slb.add_vserver_group(
        lb, f"k8s/80/web/{ns}/c0ffee", listener_ports=[80], backends=[_eni(cluster, n) for n in names[:5]]
    )
    user = slb.add_vserver_group(
        lb, "user-group", backends=[BackendServer(server_id="i-user", port=8080, weight=50)]
    )
    foreign_before = {g: slb.backends(g) for g in (ccm, user)}
    await _slb_service(cluster, lb, manage=True, **{DRAIN_ANNOTATION: "1.5"})
    await _ready_pods(cluster, names)

    async with run_manager(adapter):
        group_name = vserver_group_name({"metadata": {"namespace": ns, "name": "web"}})

        def our_group() -> str | None:
            return next((g.id for g in slb.vserver_groups(lb) if g.name == group_name), None)

        group = await async_wait_for(our_group, timeout=30, message="our VServer group")
        await async_wait_for(lambda: len(slb.backends(group)) == 45, timeout=45, message="45 backends")
        await async_wait_for(lambda: _guarded(cluster, names), timeout=45, message="45 pods guarded")

        adds = [c for c in slb.calls_of(ADD) if c.executed]
        assert len(adds) >= 3
        assert all(len(c.backend_servers) <= 20 for c in adds)
        assert sum(len(c.backend_servers) for c in adds) == 45
        by_ip = {b.server_ip: b for b in slb.backends(group)}
        for index, name in enumerate(names):
            backend = by_ip[cluster.ip_of(name)]
            assert (backend.server_id, backend.server_type, backend.port, backend.weight) == (
                f"eni-node{index % 3}",
                "eni",
                80,
                100,
            )
            assert backend.description == f"resourceconsist/{name}"
        recorded = annotation(
            await cluster.get(kube.SERVICE, "web"), wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION
        )
        assert sorted((recorded or "").split(",")) == names

        # Steady state: another pass (the Service is touched) reads, and writes nothing.
        writes, reads = len(slb.mutating_calls()), len(slb.calls_of("DescribeVServerGroupAttribute"))
        await cluster.patch(kube.SERVICE, "web", {"metadata": {"annotations": {"touch": "1"}}})
        await async_wait_for(
            lambda: len(slb.calls_of("DescribeVServerGroupAttribute")) > reads, timeout=20, message="a pass"
        )
        assert len(slb.mutating_calls()) == writes

        # A pod's weight annotation is followed.
        ip3 = cluster.ip_of("web-03")
        await cluster.patch(kube.POD, "web-03", {"metadata": {"annotations": {WEIGHT_ANNOTATION: "30"}}})
        await async_wait_for(
            lambda: (m := _member(slb, group, ip3)) is not None and m.weight == 30,
            timeout=20,
            message="weight 30",
        )
        assert await _guarded(cluster, ["web-03"])

        # Someone adds a backend of their own to our group: it is never touched.
        handmade = BackendServer(server_id="i-handmade", port=80, weight=10)
        slb.set_backends(group, [*slb.backends(group), handmade])

        # 1. web-00 loses readiness: weight 0, finalizer released, backend kept.
        ip0 = cluster.ip_of("web-00")
        await cluster.set_status("web-00", ready=True, service_ready=False)

        async def idle() -> bool:
            member = _member(slb, group, ip0)
            return bool(member and member.weight == 0) and await _released(cluster, "web-00")

        await async_wait_for(idle, timeout=30, message="web-00 at weight 0 and released")
        assert _member(slb, group, ip0) is not None
        # ... then it is deleted: gone at once (nothing guards it), its backend removed after the drain.
        await cluster.delete(kube.POD, "web-00")
        await async_wait_for(lambda: _gone(cluster, kube.POD, "web-00"), timeout=20, message="web-00 gone")
        await async_wait_for(lambda: _member(slb, group, ip0) is None, timeout=30, message="web-00 removed")

        # 2. web-01, ready, is deleted: weight 0 while the pod waits with its finalizer; then
        # removal, release, and the pod is gone.
        ip1 = cluster.ip_of("web-01")
        await cluster.delete(kube.POD, "web-01")
        await async_wait_for(
            lambda: (m := _member(slb, group, ip1)) is not None and m.weight == 0, timeout=30, message="drain"
        )
        pod = await cluster.get(kube.POD, "web-01")
        assert pod is not None and pod["metadata"].get("deletionTimestamp")
        assert FLZ in finalizers(pod), "held while its backend is still in the group"
        await async_wait_for(lambda: _gone(cluster, kube.POD, "web-01"), timeout=30, message="web-01 gone")
        assert _member(slb, group, ip1) is None

        # 3. web-02 is relabelled out of the selector: drained, removed, then released; it stays.
        ip2 = cluster.ip_of("web-02")
        await cluster.patch(kube.POD, "web-02", {"metadata": {"labels": {"app": "elsewhere"}}})
        await async_wait_for(
            lambda: (m := _member(slb, group, ip2)) is not None and m.weight == 0, timeout=30, message="drain"
        )
        assert FLZ in (await _pod_finalizers(cluster, "web-02") or []), "held until removed"

        async def unselected_released() -> bool:
            return _member(slb, group, ip2) is None and await _released(cluster, "web-02")

        await async_wait_for(unselected_released, timeout=30, message="web-02 removed, then released")

        ops = _ops(slb, group)
        for ip in (ip0, ip1, ip2):
            assert ops.index((SET, ip, 0)) < ops.index((REMOVE, ip, None)), f"{ip}: weight 0 before removal"
        assert sum(1 for op in ops if op[0] == ADD) == 45, "no backend added twice"
        assert len(slb.backends(group)) == 42 + 1
        assert handmade in slb.backends(group)

    for g, before in foreign_before.items():
        assert slb.backends(g) == before
    touched = {c.params.get("VServerGroupId") for c in slb.mutating_calls()}
    assert touched in ({group, None}, {group}), "only our group was written"
    assert all(c.params.get("VServerGroupName") in (None, group_name) for c in slb.mutating_calls())
    await _events_text(cluster, "web")


async def test_manage_mode_converges_through_throttling_without_adding_a_backend_twice(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    names = [f"web-{i:02d}" for i in range(24)]
    await _slb_service(cluster, lb, manage=True)
    await _ready_pods(cluster, names)
    slb.throttle(0.3)
    # Two adds are carried out but answered with an error: a retry must not add them again.
    slb.fail_after_executing(ADD, times=2)
    async with run_manager(adapter):
        group_name = vserver_group_name({"metadata": {"namespace": cluster.namespace, "name": "web"}})

        def our_group() -> str | None:
            return next((g.id for g in slb.vserver_groups(lb) if g.name == group_name), None)

        group = await async_wait_for(our_group, timeout=30, message="our VServer group")
        await async_wait_for(lambda: len(slb.backends(group)) == 24, timeout=60, message="24 backends")
        await async_wait_for(lambda: _guarded(cluster, names), timeout=60, message="24 pods guarded")

        for name in names[:6]:
            await cluster.delete(kube.POD, name)
        for name in names[:6]:
            await async_wait_for(
                lambda n=name: _gone(cluster, kube.POD, n), timeout=60, message=f"{name} gone"
            )
        assert len(slb.backends(group)) == 18

    assert any(c.code == "Throttling" for c in slb.calls), "the throttle did bite"
    assert len([g for g in slb.vserver_groups(lb) if g.name == group_name]) == 1, "one group, not two"
    assert all(n == 1 for n in slb.add_counts(group).values())
    assert slb.rejected_duplicate_adds == []
    await _events_text(cluster, "web")


async def test_manage_mode_errors_become_warning_events_then_the_service_is_cleaned_up(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    names = ["web-0", "web-1", "web-2"]
    await _slb_service(cluster, lb, manage=True)
    await _ready_pods(cluster, names)
    # A non-transient provider error: a Warning event with the provider's code and message.
    slb.fail_next(ADD, code="InvalidParameter", message="The specified BackendServers is invalid.")
    # A dropped connection (its error text quotes the signed URL): retried, never shown.
    slb.drop_connection(ADD, times=1)
    async with run_manager(adapter):

        async def warned() -> bool:
            return "InvalidParameter" in await _events_text(cluster, "web")

        await async_wait_for(warned, timeout=30, message="SyncEmployeesFailed event")
        text = await _events_text(cluster, "web")
        assert "Warning SyncEmployeesFailed sync employees failed: syncUpdate failed, err: SLB " in text
        assert "InvalidParameter: The specified BackendServers is invalid." in text
        await async_wait_for(
            lambda: _guarded(cluster, names), timeout=45, message="converged after the error"
        )

        group = next(g.id for g in slb.vserver_groups(lb) if g.name.startswith("resourceconsist/"))
        # Someone attaches our group to a listener: deleting it now would cut traffic, so SLB
        # refuses (RspoolVipExist) and the Service's deletion waits, its pods still guarded.
        slb.add_vserver_group(
            lb,
            vserver_group_name(await cluster.get(kube.SERVICE, "web") or {}),
            backends=slb.backends(group),
            listener_ports=[80],
            vserver_group_id=group,
        )
        await cluster.delete(kube.SERVICE, "web")

        async def refused() -> bool:
            return "RspoolVipExist" in await _events_text(cluster, "web")

        await async_wait_for(refused, timeout=30, message="deletion refused by SLB")
        assert (
            "Warning SyncEmployerFailed sync employer failed: syncDelete failed, err: SLB DeleteVServerGroup"
            in (await _events_text(cluster, "web"))
        )
        # The group was asked to go only once its backends were drained and removed, so the
        # listener routes to none of them, and the pods are released meanwhile (issue 33).
        assert slb.backends(group) == []
        for name in names:
            assert FLZ not in (await _pod_finalizers(cluster, name) or [])
        changes = [c for c in slb.backend_changes() if c.vserver_group_id == group]
        assert {c.backend.server_ip for c in changes if c.change == "removed"} == {
            c.backend.server_ip for c in changes if c.change == "weight" and c.backend.weight == 0
        }
        assert all(c.old_weight == 0 for c in changes if c.change == "removed")

        # Detached again: the group goes, the pods are released, the Service is gone.
        slb.add_vserver_group(
            lb, slb.vserver_groups(lb)[0].name, backends=slb.backends(group), vserver_group_id=group
        )
        await async_wait_for(lambda: _gone(cluster, kube.SERVICE, "web"), timeout=45, message="Service gone")
        assert not slb.vserver_groups(lb)
        for name in names:
            assert FLZ not in (await _pod_finalizers(cluster, name) or [])
    assert {c.action for c in slb.mutating_calls()} <= MUTATING_ACTIONS


async def test_rejected_credentials_surface_as_a_warning_without_the_credentials(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wrong/Secret+Value=0000"
    lb = slb.add_load_balancer()
    await _slb_service(cluster, lb, manage=False)
    await _ready_pods(cluster, ["web-0"], eni=False)
    with SLBClient(slb.credentials(access_key_secret=wrong)) as client:
        async with run_manager(SLBAdapter(client, cluster_name=CLUSTER)):

            async def warned() -> str:
                text = await _events_text(cluster, "web")
                return text if "GetCurrentEmployeesFailed" in text else ""

            text = await async_wait_for(warned, timeout=30, message="a Warning event about the credentials")
    assert "InvalidAccessKeySecret" in text or "SignatureDoesNotMatch" in text
    for shown in (text, caplog.text):
        assert wrong not in shown and quote(wrong, safe="") not in shown


# ---- restarts ---------------------------------------------------------------------------------------


async def test_a_restart_under_pod_churn_logs_no_error_and_leaves_every_pod_served(
    cluster: Cluster,
    run_manager: Any,
    slb: SLBEmulator,
    adapter: SLBAdapter,
    caplog: pytest.LogCaptureFixture,
    late_service_lists: Any,
) -> None:
    # A pod event that came before the Service cache had synced used to be logged as an ERROR
    # with a traceback, one per event, at every start; it now waits for that cache and is mapped
    # then (docs/concepts.md, "Events before the caches sync"). Which cache syncs first is luck;
    # the restarted manager's API answers its Service list late, so that every start meets it.
    ns = cluster.namespace
    lb = slb.add_load_balancer()
    names = [f"web-{i:02d}" for i in range(12)]
    await _slb_service(cluster, lb, manage=True)
    await _ready_pods(cluster, names)
    group_name = vserver_group_name({"metadata": {"namespace": ns, "name": "web"}})

    def our_group() -> str | None:
        return next((g.id for g in slb.vserver_groups(lb) if g.name == group_name), None)

    async with run_manager(adapter):
        group = await async_wait_for(our_group, timeout=30, message="our VServer group")
        await async_wait_for(lambda: len(slb.backends(group)) == 12, timeout=45, message="12 backends")
        await async_wait_for(lambda: _guarded(cluster, names), timeout=45, message="12 pods guarded")

    # While the controller is down and while it starts again, pods keep changing: a label on
    # each in turn, and web-00's readiness back and forth.
    patches = 0
    stop = asyncio.Event()

    async def churn() -> None:
        nonlocal patches
        while not stop.is_set():
            if patches % 5 == 0:
                await cluster.set_status("web-00", ready=True, service_ready=patches % 10 != 0)
            else:
                name = names[patches % len(names)]
                await cluster.patch(kube.POD, name, {"metadata": {"labels": {"tick": str(patches)}}})
            patches += 1

    entry = lifecycle.expected_finalizer_key("Service", ns, "web")

    async def every_pod_served() -> bool:
        weights = {b.server_ip: b.weight for b in slb.backends(group)}
        if weights != {cluster.ip_of(n): 100 for n in names}:
            return False
        pods = await cluster.pods({"app": "web"})
        return len(pods) == 12 and all(
            FLZ in finalizers(p) and lifecycle.expected_finalizers(p).get(entry) == FLZ for p in pods
        )

    def pods_wait() -> bool:
        return any("events wait for the services cache" in r.getMessage() for r in caplog.records)

    async def release_once_pods_wait() -> None:
        await async_wait_for(pods_wait, timeout=30, message="pod events waiting for the Service cache")
        started_at = patches
        await async_wait_for(lambda: patches >= started_at + 5, timeout=30, message="more pod changes")
        late_service_lists.release.set()

    caplog.clear()
    churning = asyncio.create_task(churn())
    releasing = asyncio.create_task(release_once_pods_wait())
    try:
        await async_wait_for(lambda: patches >= 5, timeout=30, message="pods changing before the start")
        with SLBClient(slb.credentials(), retry=RETRY) as client:
            async with run_manager(
                SLBAdapter(client, cluster_name=CLUSTER), client=late_service_lists.client
            ):
                await releasing
                started_at = patches
                await async_wait_for(
                    lambda: patches >= started_at + 30, timeout=60, message="pods changing after the start"
                )
                stop.set()
                await churning
                await cluster.set_status("web-00", ready=True, service_ready=True)
                await async_wait_for(
                    every_pod_served, timeout=60, interval=0.5, message="12 backends at weight 100, guarded"
                )
    finally:
        stop.set()
        late_service_lists.release.set()
        await asyncio.gather(churning, releasing, return_exceptions=True)

    # What an operator sees (INFO and above): no ERROR, no traceback.
    seen = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [f"{r.levelname} {r.name}: {r.getMessage()}" for r in seen if r.levelno >= logging.ERROR] == []
    assert [r.getMessage() for r in seen if r.exc_info] == [], "a traceback was logged"
    assert sum(1 for op in _ops(slb, group) if op[0] == ADD) == 12, "no backend added twice"
