"""``Cluster``: a namespace on a real API server, with helpers that act as kubectl and kubelet.

For tests of controllers and adapters: create controlled Services and pods, set pod status
(IP, Ready, ``pod.kusionstack.io/service-ready``) through the status subresource as a kubelet
would (no kubelet runs beside ``LocalControlPlane``), read objects and the Events about them.
Every call runs in a worker thread, so a controller on the test's event loop keeps running.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from resourceconsist import kube, wire
from resourceconsist.kube import KubeClient, KubeObject

T = TypeVar("T")
_ips = itertools.count(10)


@dataclass
class Cluster:
    """A namespace on the real API server, with helpers that act as kubectl and kubelet."""

    client: KubeClient
    namespace: str
    _ip: dict[str, str] = field(default_factory=dict)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking client call in a worker thread: ``await cluster.call(client.get, ...)``."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def service(
        self,
        name: str,
        selector: dict[str, str] | None = None,
        *,
        controlled: bool = True,
        labels: dict[str, str] | None = None,
        finalizers: list[str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> KubeObject:
        """Create a Service on port 80 selecting ``selector`` (default ``app: <name>``), labelled
        ``kusionstack.io/control: "true"`` unless ``controlled`` is False."""
        all_labels = dict(labels or {})
        if controlled:
            all_labels[wire.CONTROL_LABEL] = wire.CONTROL_LABEL_VALUE
        body = {
            "metadata": {
                "name": name,
                "labels": all_labels,
                "finalizers": finalizers or [],
                "annotations": annotations or {},
            },
            "spec": {
                "selector": selector if selector is not None else {"app": name},
                "ports": [{"port": 80}],
            },
        }
        return await self.call(self.client.create, kube.SERVICE, self.namespace, body)

    async def pod(
        self,
        name: str,
        labels: dict[str, str],
        *,
        readiness_gate: bool = False,
        annotations: dict[str, str] | None = None,
    ) -> KubeObject:
        """Create a pod with ``labels``; ``readiness_gate`` adds PodOpsLifecycle's service-ready gate.
        It has no IP and no conditions until ``set_status``."""
        spec: dict[str, Any] = {"containers": [{"name": "app", "image": "nginx"}]}
        if readiness_gate:
            spec["readinessGates"] = [{"conditionType": wire.SERVICE_READY_CONDITION}]
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}, "spec": spec}
        return await self.call(self.client.create, kube.POD, self.namespace, body)

    def ip_of(self, pod: str) -> str:
        """The IP ``set_status`` gives ``pod`` (unique in the process, stable per pod)."""
        if pod not in self._ip:
            n = next(_ips)
            self._ip[pod] = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
        return self._ip[pod]

    async def set_status(
        self, pod: str, *, ready: bool = True, service_ready: bool | None = None
    ) -> KubeObject:
        """Set the pod's IP and conditions through the status subresource, as a kubelet would."""
        conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
        if service_ready is not None:
            conditions.append(
                {"type": wire.SERVICE_READY_CONDITION, "status": "True" if service_ready else "False"}
            )
        ip = self.ip_of(pod)
        body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": conditions}}
        return await self.call(self.client.patch, kube.POD, self.namespace, pod, body, subresource="status")

    async def get(self, resource: kube.Resource, name: str) -> KubeObject | None:
        """The object from the API server (not a cache), None when it does not exist."""
        return await self.call(self.client.get_or_none, resource, self.namespace, name)

    async def patch(self, resource: kube.Resource, name: str, body: Any) -> KubeObject:
        """Merge-patch the object."""
        return await self.call(self.client.patch, resource, self.namespace, name, body)

    async def delete(self, resource: kube.Resource, name: str) -> None:
        """Delete the object; it stays (deleting) while it has finalizers."""
        await self.call(self.client.delete, resource, self.namespace, name)

    async def events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the Events about the object ``name``."""
        listing = await self.call(
            self.client.list, kube.EVENT, self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [(e["type"], e["reason"], e["message"]) for e in listing.get("items", [])]


def finalizers(obj: KubeObject | None) -> list[str]:
    """The object's finalizers (none for None)."""
    return list((obj or {}).get("metadata", {}).get("finalizers") or [])


def annotation(obj: KubeObject | None, key: str) -> str | None:
    """One annotation of the object, None when absent (or for None)."""
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(key)
