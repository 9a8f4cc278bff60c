"""Any kind can be employer and employee: a CRD ``Pool`` employs CRD ``Backend`` objects.

The adapter brings its own watch options (kinds, handlers, predicates); the frame keeps a fake
provider's pool members equal to the Backends, with the clean finalizer guarding the Pool.
PodOpsLifecycle does not apply (employees are not pods), so no pod is touched.
"""

from __future__ import annotations

import threading
from typing import Any

from resourceconsist import wire
from resourceconsist.adapter import (
    Employee,
    Employer,
    EventHandler,
    Outcome,
    Predicate,
    ReconcileAdapter,
    ReconcileContext,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, WatchEvent
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.testing import Cluster, async_wait_for, finalizers, schemaless_crd

GROUP = "test.resourceconsist.io"


class PoolAdapter(ReconcileAdapter):
    """Keeps ``members[pool]`` equal to the addresses of the Backends naming that pool."""

    def __init__(self, pool: Resource, backend: Resource) -> None:
        self.pool, self.backend = pool, backend
        self.members: dict[str, dict[str, str]] = {}
        self.pools: set[str] = set()
        self._lock = threading.Lock()

    def get_controller_name(self) -> str:
        return "pool-controller"

    # watch options
    def new_employer(self) -> Resource:
        return self.pool

    def new_employee(self) -> Resource:
        return self.backend

    def employer_event_handler(self) -> EventHandler:
        return lambda event, reader: [kube.object_key(event.obj)]

    def employee_event_handler(self) -> EventHandler:
        def by_pool(event: WatchEvent, reader: CacheReader) -> list[str]:
            pools = {o["spec"]["pool"] for o in (event.obj, event.old) if o is not None}
            return [f"{event.obj['metadata']['namespace']}/{p}" for p in sorted(pools)]

        return by_pool

    def employer_predicates(self) -> Predicate:
        return lambda event: True

    def employee_predicates(self) -> Predicate:
        return lambda event: True

    # employer: the pool itself
    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        return (
            [] if employer["metadata"].get("deletionTimestamp") else [Employer(id=kube.object_key(employer))]
        )

    def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        key = kube.object_key(employer)
        return [Employer(id=key)] if key in self.pools else []

    def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employer]
    ) -> Outcome[Employer]:
        self.pools.update(i.id for i in items)
        return items, []

    def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employer]
    ) -> Outcome[Employer]:
        return items, []

    def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employer]
    ) -> Outcome[Employer]:
        self.pools.difference_update(i.id for i in items)
        return items, []

    # employees: pool members
    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        if employer["metadata"].get("deletionTimestamp"):
            return []
        name = employer["metadata"]["name"]
        backends = ctx.reader.list(self.backend, employer["metadata"]["namespace"])
        return [
            Employee(id=b["metadata"]["name"], name=b["metadata"]["name"], statuses=b["spec"]["address"])
            for b in backends
            if b["spec"]["pool"] == name
        ]

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        with self._lock:
            current = dict(self.members.get(kube.object_key(employer), {}))
        return [Employee(id=k, name=k, statuses=v) for k, v in current.items()]

    def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employee]
    ) -> Outcome[Employee]:
        with self._lock:
            self.members.setdefault(kube.object_key(employer), {}).update({i.id: i.statuses for i in items})
        return items, []

    update_employees = create_employees

    def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employee]
    ) -> Outcome[Employee]:
        with self._lock:
            group = self.members.get(kube.object_key(employer), {})
            for item in items:
                group.pop(item.id, None)
        return items, []


async def test_a_crd_employer_with_crd_employees_converges(cluster: Cluster, run_manager: Any) -> None:
    client = cluster.client
    crd = await cluster.call(client.resource, "apiextensions.k8s.io/v1", "CustomResourceDefinition")
    for kind, plural in (("Pool", "pools"), ("Backend", "backends")):
        if await cluster.call(client.get_or_none, crd, None, f"{plural}.{GROUP}") is None:
            await cluster.call(client.create, crd, None, schemaless_crd(GROUP, kind, plural))

    async def established() -> bool:
        for plural in ("pools", "backends"):
            found = await cluster.call(client.get_or_none, crd, None, f"{plural}.{GROUP}")
            conditions = {
                c["type"]: c["status"] for c in ((found or {}).get("status") or {}).get("conditions") or []
            }
            if conditions.get("Established") != "True":
                return False
        return True

    await async_wait_for(established, timeout=30, message="CRDs established")
    pool = await cluster.call(client.resource, f"{GROUP}/v1", "Pool")
    backend = await cluster.call(client.resource, f"{GROUP}/v1", "Backend")
    ns = cluster.namespace

    async def create(res: Resource, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": f"{GROUP}/v1", "kind": res.kind, "metadata": {"name": name}, "spec": spec}
        await cluster.call(client.create, res, ns, body)

    adapter = PoolAdapter(pool, backend)
    await create(pool, "blue", {})
    for i in range(3):
        await create(backend, f"b{i}", {"pool": "blue", "address": f"10.9.0.{i}"})
    await create(backend, "other", {"pool": "green", "address": "10.9.9.9"})
    async with run_manager(adapter):
        members = lambda: adapter.members.get(f"{ns}/blue", {})  # noqa: E731
        await async_wait_for(
            lambda: members() == {"b0": "10.9.0.0", "b1": "10.9.0.1", "b2": "10.9.0.2"},
            timeout=20,
            message="pool members equal the Backends",
        )

        async def guarded() -> bool:
            return finalizers(await cluster.get(pool, "blue")) == [wire.CLEAN_FINALIZER]

        await async_wait_for(guarded, timeout=20, message="clean finalizer on the Pool")

        await cluster.call(client.patch, backend, ns, "b1", {"spec": {"address": "10.9.1.1"}})
        await cluster.call(client.delete, backend, ns, "b2")
        await async_wait_for(lambda: members() == {"b0": "10.9.0.0", "b1": "10.9.1.1"}, timeout=20)

        await cluster.call(client.delete, pool, ns, "blue")

        async def gone() -> bool:
            return await cluster.get(pool, "blue") is None

        await async_wait_for(gone, timeout=20, message="Pool released and deleted")
        assert members() == {}
        assert f"{ns}/blue" not in adapter.pools
