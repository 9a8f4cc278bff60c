"""Employer-owned Kubernetes sub-resources: created and kept up to date after each pass, and the
stray collector for the cluster-scoped ones (docs/lifecycle-hooks.md, "Sub-resources").

A namespaced sub-resource lives in its employer's namespace with an owner reference to it, so
Kubernetes' garbage collector deletes it with the employer. Owner references cannot point from
a cluster-scoped object to a namespaced one, so a cluster-scoped sub-resource carries labels
naming its controller and its owner's uid (and an annotation with the owner's key) instead, and
the garbage pass (resourceconsist/hooks/orphans.py) deletes those whose owner is gone.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import re
from typing import Any, Final

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import EmployerKey, KubeClient, KubeObject, Resource
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.hooks.handle import ControllerHandle
from resourceconsist.reconcile import ReconcileError
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.rules import lifecycle

log = logging.getLogger(__name__)

OWNER_CONTROLLER_LABEL: Final = "resource-consist.kusionstack.io/owner-controller"
OWNER_UID_LABEL: Final = "resource-consist.kusionstack.io/owner-uid"
#: ``namespace/name`` of the owner employer (a label value could not hold every key).
OWNER_ANNOTATION: Final = "resource-consist.kusionstack.io/owner"

#: The reason of the Warning event on an employer whose sub-resources could not be written.
SYNC_FAILED_REASON: Final = "SyncSubResourcesFailed"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class SubResourceError(ResourceConsistError):
    """A declared sub-resource the frame cannot create as declared; the message says why."""


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a stable hash of it."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def cluster_scoped_kinds(profile: AdapterProfile) -> list[tuple[str, str]]:
    """The cluster-scoped kinds of the adapter's sub-resources (none without ``SubResourceOptions``)."""
    return list(profile.sub_resources.sub_resource_kinds()) if profile.sub_resources is not None else []


async def sync_sub_resources(controller: ControllerHandle, key: EmployerKey) -> int:
    """Create or update the sub-resources of the live employer ``key``; how many were written."""
    adapter = controller.profile.sub_resources
    if adapter is None:
        return 0
    employer = controller.reader.get(controller.employer, key.namespace_or_none, key.name)
    if employer is None or lifecycle.is_deleting(employer):
        return 0  # namespaced ones go with it (owner references), cluster-scoped ones are collected
    ctx = controller.context(key)
    written = 0
    try:
        desired: list[KubeObject] = list(await call_adapter(adapter.sub_resources, ctx, employer))
        for obj in desired:
            if await asyncio.to_thread(
                ensure, controller.client, controller.name, controller.employer, employer, obj
            ):
                written += 1
    except Exception as err:
        message = f"sync sub-resources failed: {err}"
        log.warning("%s %s: %s", controller.name, key, message)
        await controller.recorder.event(employer, "Warning", SYNC_FAILED_REASON, message)
        # Retried with the controller's backoff, like any failed pass.
        raise ReconcileError(None, message) from err
    return written


def ensure(
    client: KubeClient, controller: str, resource: Resource, employer: KubeObject, desired: KubeObject
) -> bool:
    """Create ``desired`` owned by ``employer``, or merge-patch it where it differs; True when written."""
    meta_in = desired.get("metadata") or {}
    api_version, kind, name = desired.get("apiVersion"), desired.get("kind"), meta_in.get("name")
    if not (api_version and kind and name):
        raise SubResourceError(
            f"a sub-resource of {kube.object_key(employer)} lacks apiVersion, kind or metadata.name "
            f"({api_version!r}, {kind!r}, {name!r}): give every object returned by sub_resources all three"
        )
    res = client.resource(str(api_version), str(kind))
    body = copy.deepcopy(dict(desired))
    meta: dict[str, Any] = body.setdefault("metadata", {})
    owner = employer["metadata"]
    owner_ns = owner.get("namespace")
    uid = str(owner.get("uid", ""))
    meta.setdefault("labels", {})[OWNER_CONTROLLER_LABEL] = label_value(controller)
    meta["labels"][OWNER_UID_LABEL] = label_value(uid)
    meta.setdefault("annotations", {})[OWNER_ANNOTATION] = kube.object_key(employer)
    namespace: str | None = None
    if res.namespaced:
        namespace = meta.get("namespace") or owner_ns
        if namespace != owner_ns:
            raise SubResourceError(
                f"sub-resource {kind} {namespace}/{name} of {kube.object_key(employer)}: a namespaced "
                f"sub-resource must live in its employer's namespace {owner_ns!r} (owner references "
                "cannot cross namespaces); drop metadata.namespace"
            )
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    current = client.get_or_none(res, namespace, str(name))
    if res.namespaced:
        others = [
            r for r in (current or {}).get("metadata", {}).get("ownerReferences") or [] if r.get("uid") != uid
        ]
        ours = {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "name": owner["name"],
            "uid": uid,
            "controller": not any(r.get("controller") for r in others),
        }
        meta["ownerReferences"] = [*others, ours]
    if current is None:
        client.create(res, namespace, body)
        log.info("%s %s: created %s %s", controller, kube.object_key(employer), kind, name)
        return True
    if _contains(current, body):
        return False
    client.patch(res, namespace, str(name), body)
    log.info("%s %s: updated %s %s", controller, kube.object_key(employer), kind, name)
    return True


def _contains(actual: Any, wanted: Any) -> bool:
    """Everything ``wanted`` says, ``actual`` says too (defaults the API server added are fine)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)
