"""The provider API budget end to end (docs/concepts.md, "The provider budget"): the SLB adapter's
controller on a real kube-apiserver + etcd, the real Alibaba Cloud SDK, and the SLB emulator
throttling the account at a low rate with SLB's own ``Throttling.User`` answer.

Two Services roll out (new pods to register) while three Services each lose a pod (a drain to
weight 0, then a removal), all at once and on one account: the drains go before the first
registration, the registrations wait, every change lands exactly once, and no leaving pod is
gone while its backend is still in the group (the guard).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist.adapter import ReconcileContext
from resourceconsist.adapters.alibabacloudslb import (
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SLBAdapter,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import BackendServer, RetryPolicy, SLBClient
from resourceconsist.cluster import kube
from resourceconsist.flow import budget
from resourceconsist.flow.budget import Priority, ProviderBudget
from resourceconsist.options import ProviderBudgetOptions
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, async_wait_for, finalizers

ADD = "AddVServerGroupBackendServers"
SET = "SetVServerGroupAttribute"
REMOVE = "RemoveVServerGroupBackendServers"
#: Services whose rollout registers new pods, and Services each losing one pod.
ROLLING = ("shop", "cart")
LEAVING = ("api", "auth", "search")
RETRY = RetryPolicy(max_attempts=8, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=10)


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(seed=24) as emulator:
        yield emulator


@pytest.fixture
def adapter(slb: SLBEmulator) -> Iterator[SLBAdapter]:
    client = SLBClient(slb.credentials(), retry=RETRY)
    yield SLBAdapter(client, cluster_name="budget-tests")
    client.close()


@pytest.fixture(autouse=True)
def default_budget() -> Iterator[None]:
    yield
    budget.configure(ProviderBudgetOptions())  # the rest of the process runs without a rate


async def _ready_pod(cluster: Cluster, service: str, name: str) -> None:
    await cluster.pod(
        name, {"app": service}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: "eni-1"}
    )
    await cluster.set_status(name, ready=True, service_ready=True)


def _writes(slb: SLBEmulator, action: str, ips: set[str], weight: int | None = None) -> list[int]:
    """Positions in the emulator's call record of executed ``action`` calls touching ``ips``."""
    return [
        index
        for index, call in enumerate(slb.calls)
        if call.executed
        and call.action == action
        and any(
            s.get("ServerIp") in ips and (weight is None or s.get("Weight") == weight)
            for s in call.backend_servers
        )
    ]


async def test_under_a_throttled_account_drains_go_first_and_no_change_is_lost(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    services = (*ROLLING, *LEAVING)
    for service in services:
        await cluster.service(
            service, labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"}
        )
    await asyncio.gather(*(_ready_pod(cluster, s, f"{s}-old-{i}") for s in services for i in range(2)))
    groups: dict[str, str] = {}
    spent = adapter.client.budget
    settings = ProviderBudgetOptions(rate=25.0, burst=5)

    async with run_manager(adapter, provider_budget=settings):
        assert spent.settings == settings, "the manager's options reach the adapter's budget"

        def all_groups_full() -> bool:
            for service in services:
                name = vserver_group_name({"metadata": {"namespace": cluster.namespace, "name": service}})
                found = next((g.id for g in slb.vserver_groups(lb) if g.name == name), None)
                if found is None or len(slb.backends(found)) != 2:
                    return False
                groups[service] = found
            return True

        await async_wait_for(all_groups_full, timeout=60, message="every Service's group with its 2 backends")

        async def all_guarded() -> bool:
            for service in services:
                for i in range(2):
                    pod = await cluster.get(kube.POD, f"{service}-old-{i}")
                    if pod is None or lifecycle.lifecycle_finalizer(service) not in finalizers(pod):
                        return False
            return True

        await async_wait_for(all_guarded, timeout=60, message="every pod guarded")
        # Then the passes those writes bring have ended: no call for a while, nothing queued.
        seen = [len(slb.calls), time.monotonic()]

        def quiet() -> bool:
            if len(slb.calls) != seen[0]:
                seen[:] = [len(slb.calls), time.monotonic()]
            return time.monotonic() - seen[1] > 2.0 and not any(spent.queued().values())

        await async_wait_for(quiet, timeout=60, message="no provider call for 2 s")

        # The account is now throttled below what the budget spends: SLB answers Throttling.User,
        # and the budget pauses the account and retries.
        slb.rate_limit(1.5, burst=1)
        budget.configure(ProviderBudgetOptions(rate=2.0, burst=1))
        before = spent.snapshot()
        marker = len(slb.calls)
        leaving = {s: f"{s}-old-0" for s in LEAVING}
        new = {s: [f"{s}-new-{i}" for i in range(3)] for s in ROLLING}
        leaving_ips = {cluster.ip_of(p) for p in leaving.values()}
        new_ips = {cluster.ip_of(p) for pods in new.values() for p in pods}

        violations: list[str] = []
        watching = True

        async def guard_watch() -> None:
            """A leaving pod gone while its backend is still in the group breaks the promise."""
            while watching:
                for service, pod in leaving.items():
                    if await cluster.get(kube.POD, pod) is None:
                        ip = cluster.ip_of(pod)
                        if any(b.server_ip == ip for b in slb.backends(groups[service])):
                            violations.append(f"{pod} gone while {ip} is still a backend")
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(guard_watch())
        try:
            # A rollout's new pods and the leaving pods' deletions, at once.
            await asyncio.gather(
                *(cluster.delete(kube.POD, pod) for pod in leaving.values()),
                *(_ready_pod(cluster, s, p) for s, pods in new.items() for p in pods),
            )

            async def leaving_gone() -> bool:
                return all([await cluster.get(kube.POD, p) is None for p in leaving.values()])

            await async_wait_for(leaving_gone, timeout=120, message="the leaving pods removed and gone")

            def registered() -> bool:
                return all(
                    {b.server_ip for b in slb.backends(groups[s])} >= {cluster.ip_of(p) for p in pods}
                    for s, pods in new.items()
                )

            await async_wait_for(registered, timeout=120, message="the rollout's pods registered")
        finally:
            watching = False
            await watcher
        after = spent.snapshot()

    assert violations == []
    calls = slb.calls[marker:]
    assert any(c.code == "Throttling.User" for c in calls), "the throttle did bite"
    drains = _writes(slb, SET, leaving_ips, weight=0)
    removals = _writes(slb, REMOVE, leaving_ips)
    adds = _writes(slb, ADD, new_ips)
    assert len(drains) == len(LEAVING) and len(removals) == len(LEAVING)
    assert max(drains) < min(adds), "every drain went before the first registration"
    assert min(removals) < max(adds), "removals were not left behind the whole rollout"
    # Nothing lost, nothing twice: each new backend added once, each leaving one gone.
    for service in ROLLING:
        counts = slb.add_counts(groups[service])
        assert sorted(ip for (_, _, ip), n in counts.items() if n == 1 and ip in new_ips) == sorted(
            cluster.ip_of(p) for p in new[service]
        )
        assert all(n == 1 for n in counts.values())
    for service, pod in leaving.items():
        assert cluster.ip_of(pod) not in {b.server_ip for b in slb.backends(groups[service])}
    assert slb.rejected_duplicate_adds == []
    # The registrations waited; the removals waited less.
    waited = {p: after.wait_seconds[p] - before.wait_seconds[p] for p in Priority}
    waits = {p: after.waits[p] - before.waits[p] for p in Priority}
    assert waits[Priority.REGISTER] + waits[Priority.READ] > 0
    assert sum(after.throttles.values()) > sum(before.throttles.values()), "the budget saw the throttles"

    def mean(priority: Priority) -> float:
        return waited[priority] / max(1, waits[priority])

    assert mean(Priority.REMOVE_TRAFFIC) < max(mean(Priority.READ), mean(Priority.REGISTER))


class _NoServices:
    """The frame's cache as the garbage search reads it, with no Service in it."""

    def list(self, resource: kube.Resource, *_: Any) -> list[kube.KubeObject]:
        return []


def _backend(n: int, weight: int) -> BackendServer:
    return BackendServer(
        server_id=f"eni-{n}", port=80, weight=weight, server_type="eni", server_ip=f"10.9.0.{n}"
    )


def _granted(spent: ProviderBudget) -> dict[Priority, int]:
    return dict(spent.snapshot().granted)


def test_each_slb_write_spends_at_its_own_priority_and_drains_go_out_first(slb: SLBEmulator) -> None:
    spent = ProviderBudget("test:slb-writes", ProviderBudgetOptions(rate=1000.0, burst=1000))
    lb = slb.add_load_balancer()
    with SLBClient(slb.credentials(), retry=RETRY, budget=spent) as client:
        group = client.create_vserver_group(lb, "resourceconsist/ns/writes")
        client.add_backend_servers(group, [_backend(1, 100), _backend(2, 100)], load_balancer_id=lb)
        after_adds = _granted(spent)
        assert after_adds[Priority.REGISTER] == 3  # the create's read, the create, the add
        assert after_adds[Priority.REMOVE_TRAFFIC] == after_adds[Priority.DELETE] == 0
        # One call asked to drain one backend and raise another: the drain is sent first, alone.
        marker = len(slb.calls)
        client.set_backend_weights(group, [_backend(2, 50), _backend(1, 0)], load_balancer_id=lb)
        sets = [c.backend_servers for c in slb.calls[marker:] if c.action == SET]
        assert [[s["Weight"] for s in servers] for servers in sets] == [[0], [50]]
        client.remove_backend_servers(group, [_backend(1, 0)], load_balancer_id=lb)
        client.delete_vserver_group(group, load_balancer_id=lb)
    final = _granted(spent)
    assert final[Priority.REMOVE_TRAFFIC] == 2  # the drain and the removal
    assert final[Priority.REGISTER] == after_adds[Priority.REGISTER] + 1  # the raised weight
    assert final[Priority.DELETE] == 1
    assert sum(final.values()) == len(slb.calls), "every request spent one token"


async def test_the_garbage_search_spends_the_accounts_budget_as_reads(slb: SLBEmulator) -> None:
    spent = ProviderBudget("test:garbage-search", ProviderBudgetOptions(rate=1000.0, burst=1000))
    for _ in range(3):
        slb.add_load_balancer()
    with SLBClient(slb.credentials(), retry=RETRY, budget=spent) as client:
        adapter = SLBAdapter(client, cluster_name="budget-tests")
        ctx = ReconcileContext(reader=_NoServices(), controller="c", employer_key="")  # type: ignore[arg-type]
        assert await adapter.list_owned(ctx) == []
    granted = _granted(spent)
    assert granted[Priority.READ] == len(slb.calls) >= 4  # a page of load balancers, then each one's groups
    assert sum(granted.values()) == granted[Priority.READ]
