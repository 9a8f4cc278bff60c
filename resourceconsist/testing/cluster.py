"""``Cluster``: a namespace on a real API server, with helpers that act as kubectl and kubelet.

For tests of controllers and adapters: create controlled Services and pods, set pod status
(IP, Ready, ``pod.kusionstack.io/service-ready``) through the status subresource as a kubelet
would (no kubelet runs beside ``LocalControlPlane``), read objects and the Events about them.
On a ``LocalCluster``, where controllers run and kwok plays the kubelet, create Deployments,
roll them to a new template and wait for the rollout (docs/testing.md).
Every call runs in a worker thread, so a controller on the test's event loop keeps running.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle
from resourceconsist.testing.wait import async_wait_for

T = TypeVar("T")
_ips = itertools.count(10)

DEPLOYMENT = kube.Resource("apps", "v1", "Deployment", "deployments")
REPLICA_SET = kube.Resource("apps", "v1", "ReplicaSet", "replicasets")
ENDPOINT_SLICE = kube.Resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices")


@dataclass
class Cluster:
    """A namespace on the real API server, with helpers that act as kubectl and kubelet."""

    client: KubeClient
    namespace: str
    _ip: dict[str, str] = field(default_factory=dict)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking client call in a worker thread: ``await cluster.call(client.get, ...)``."""
        result: T = await call_adapter(functools.partial(fn, *args, **kwargs))
        return result

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
        gated_by: Iterable[str] = (),
        annotations: dict[str, str] | None = None,
    ) -> KubeObject:
        """Create a pod with ``labels``; ``readiness_gate`` adds PodOpsLifecycle's service-ready gate,
        ``gated_by`` the frame's readiness gate of each employer named: the gate the webhook gives
        on plain Kubernetes to the pods of a Service annotated
        ``resource-consist.kusionstack.io/readiness-gate: "true"`` (docs/zero-downtime.md), whose
        condition the frame sets. It has no IP and no conditions until ``set_status``."""
        spec: dict[str, Any] = {"containers": [{"name": "app", "image": "nginx"}]}
        gates = [wire.SERVICE_READY_CONDITION] if readiness_gate else []
        gates += [lifecycle.readiness_gate(employer) for employer in gated_by]
        if gates:
            spec["readinessGates"] = [{"conditionType": gate} for gate in gates]
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}, "spec": spec}
        return await self.call(self.client.create, kube.POD, self.namespace, body)

    def ip_of(self, pod: str) -> str:
        """The IP ``set_status`` gives ``pod`` (unique in the process, stable per pod)."""
        if pod not in self._ip:
            n = next(_ips)
            self._ip[pod] = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
        return self._ip[pod]

    async def set_status(
        self, pod: str, *, ready: bool = True, service_ready: bool | None = None, ip: str | None = None
    ) -> KubeObject:
        """Set the pod's IP and conditions through the status subresource, as a kubelet would;
        ``ip`` gives the pod that IP (e.g. one on loopback where a real server listens, for a
        real load balancer), kept for the pod from then on."""
        if ip is not None:
            self._ip[pod] = ip
        conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
        if service_ready is not None:
            conditions.append(
                {"type": wire.SERVICE_READY_CONDITION, "status": "True" if service_ready else "False"}
            )
        ip = self.ip_of(pod)
        body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": conditions}}
        return await self.call(self.client.patch, kube.POD, self.namespace, pod, body, subresource="status")

    # -- Deployments (on a LocalCluster, where controllers and kwok run) ------------------------

    async def deployment(
        self,
        name: str,
        replicas: int,
        *,
        labels: dict[str, str] | None = None,
        readiness_gates: tuple[str, ...] = (),
        max_surge: int | str = "25%",
        max_unavailable: int | str = 0,
        pre_stop_seconds: int | None = None,
        termination_grace_seconds: int = 30,
        pod_finalizers: list[str] | None = None,
        pod_spec: dict[str, Any] | None = None,
    ) -> KubeObject:
        """Create a Deployment whose pods carry ``labels`` (default ``app=<name>``), the given
        readiness gates and finalizers, and a preStop ``sleep`` (what kwok waits for on
        deletion, docs/testing.md), rolling with ``maxSurge``/``maxUnavailable``. ``pod_spec``
        is the pods' spec to start from (on a real node: a real image, e.g.
        ``realnode.http_server_pod_spec()``); by default one container whose image kwok never
        pulls."""
        pod_labels = labels or {"app": name}
        default_spec: dict[str, Any] = {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
        pod_spec = copy.deepcopy(pod_spec or default_spec)
        if pre_stop_seconds is not None:
            lifecycle = pod_spec["containers"][0].setdefault("lifecycle", {})
            lifecycle["preStop"] = {"sleep": {"seconds": pre_stop_seconds}}
        pod_spec["terminationGracePeriodSeconds"] = termination_grace_seconds
        if readiness_gates:
            pod_spec["readinessGates"] = [{"conditionType": t} for t in readiness_gates]
        body = {
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": pod_labels},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
                },
                "template": {
                    "metadata": {"labels": pod_labels, "finalizers": pod_finalizers or []},
                    "spec": pod_spec,
                },
            },
        }
        return await self.call(self.client.create, DEPLOYMENT, self.namespace, body)

    async def roll(self, name: str, revision: str) -> KubeObject:
        """Change the Deployment's pod template (annotation ``resourceconsist.test/revision``),
        which starts a rollout; returns the Deployment with its new ``metadata.generation``."""
        body = {
            "spec": {"template": {"metadata": {"annotations": {"resourceconsist.test/revision": revision}}}}
        }
        return await self.patch(DEPLOYMENT, name, body)

    async def rollout_done(self, name: str) -> bool:
        """Whether the Deployment's latest template is fully rolled out (``rolled_out``)."""
        return rolled_out(await self.get(DEPLOYMENT, name))

    async def wait_rollout(self, name: str, timeout: float = 120.0) -> KubeObject:
        """Wait until the Deployment is ``rolled_out``; returns it."""

        async def done() -> KubeObject | None:
            deployment = await self.get(DEPLOYMENT, name)
            return deployment if rolled_out(deployment) else None

        found = await async_wait_for(done, timeout=timeout, interval=0.2, message=f"rollout of {name}")
        assert found is not None  # async_wait_for returns only a truthy value
        return found

    async def pods(self, selector: dict[str, str] | None = None) -> list[KubeObject]:
        """The namespace's pods, those matching the label ``selector`` if given."""
        label_selector = ",".join(f"{k}={v}" for k, v in (selector or {}).items()) or None
        listing = await self.call(self.client.list, kube.POD, self.namespace, label_selector=label_selector)
        return list(listing.get("items") or [])

    async def set_condition(self, pod: str, condition_type: str, status: bool) -> KubeObject:
        """Set one pod condition (a readiness gate's) through the status subresource, as the
        controller owning the gate would; conditions of other types stay."""
        body = {"status": {"conditions": [{"type": condition_type, "status": "True" if status else "False"}]}}
        return await self.call(
            self.client.patch,
            kube.POD,
            self.namespace,
            pod,
            body,
            patch_type="strategic",
            subresource="status",
        )

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


def rolled_out(deployment: KubeObject | None) -> bool:
    """Whether a Deployment's latest template is fully rolled out, as ``kubectl rollout status``
    judges it: observed, every replica updated and available, no old one left."""
    if deployment is None:
        return False
    want = deployment["spec"].get("replicas", 1)
    status = deployment.get("status") or {}
    return bool(
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("updatedReplicas", 0) == want
        and status.get("replicas", 0) == want
        and status.get("availableReplicas", 0) == want
    )


def condition(obj: KubeObject | None, condition_type: str) -> str | None:
    """The status ("True", "False", ...) of a pod's condition of that type, None without one."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == condition_type:
            return str(cond.get("status"))
    return None


def finalizers(obj: KubeObject | None) -> list[str]:
    """The object's finalizers (none for None)."""
    return list((obj or {}).get("metadata", {}).get("finalizers") or [])


def annotation(obj: KubeObject | None, key: str) -> str | None:
    """One annotation of the object, None when absent (or for None)."""
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(key)


def schemaless_crd(group: str, kind: str, plural: str) -> KubeObject:
    """A namespaced CustomResourceDefinition of ``kind`` in ``group``, version v1, that stores
    any spec: for tests needing a kind to exist (a CRD employer, another project's kinds a
    chart renders), not its validation."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
