"""Default event handlers and predicates: which watch events enqueue which employers.

Defaults mirror the Go frame: employer (Service) events enqueue the employer itself, filtered
by the ``kusionstack.io/control: "true"`` label; pod events enqueue every controlled Service in
the pod's namespace whose selector selects the pod, before or after the change (so a pod
relabelled out of a selector still reaches the Service that must release it). The Service
lookup is an index lookup in the informer cache, never a LIST.
"""

from __future__ import annotations

from resourceconsist import wire
from resourceconsist.cache import CacheReader, WatchEvent
from resourceconsist.kube import KubeObject, object_key


def is_controlled(obj: KubeObject | None) -> bool:
    """The object carries ``kusionstack.io/control: "true"``."""
    if obj is None:
        return False
    labels = obj.get("metadata", {}).get("labels") or {}
    return bool(labels.get(wire.CONTROL_LABEL) == wire.CONTROL_LABEL_VALUE)


def control_predicate(event: WatchEvent) -> bool:
    """Default employer predicate: the (new) object is controlled; deletes judge the last state.

    An update that removes the label still passes when the old object was controlled, so the
    employer gets one last reconcile."""
    if event.type == "MODIFIED":
        return is_controlled(event.obj) or is_controlled(event.old)
    return is_controlled(event.obj)


def accept_all(event: WatchEvent) -> bool:
    """Default employee predicate: every pod event counts."""
    return True


def enqueue_self(event: WatchEvent, reader: CacheReader) -> list[str]:
    """Default employer handler: the object's own key."""
    return [object_key(event.obj)]


def enqueue_services_by_pod(event: WatchEvent, reader: CacheReader) -> list[str]:
    """Default employee handler: controlled Services selecting the pod before or after."""
    keys: set[str] = set()
    for pod in (event.old, event.obj):
        if pod is None:
            continue
        keys.update(object_key(svc) for svc in reader.services_selecting(pod) if is_controlled(svc))
    return sorted(keys)
