"""Default event handlers and predicates: which watch events enqueue which employers.

Defaults mirror the Go frame: employer (Service) events enqueue the employer itself, filtered
by the ``kusionstack.io/control: "true"`` label; pod events enqueue every controlled Service in
the pod's namespace whose selector selects the pod, before or after the change (so a pod
relabelled out of a selector still reaches the Service that must release it), and every
controlled Service whose guard or lifecycle finalizer the pod still holds (a pod no selector
selects any more is released only by the pass of the Service that guards it). The Service
lookup is an index lookup in the informer cache, never a LIST.

Handlers run on the event loop and read caches that may not have synced yet (a pod event can
come before the Service cache's first list): such a read raises ``CacheNotSynced``, and the
controller keeps the event until that cache has synced (resourceconsist/runtime/parking.py),
then hands it back to be mapped again (docs/concepts.md, "Events before the caches sync").
"""

from __future__ import annotations

from collections.abc import Callable

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, WatchEvent
from resourceconsist.cluster.kube import KubeObject, object_key
from resourceconsist.rules import lifecycle

_OUR_PREFIXES = (wire.LIFECYCLE_FINALIZER_PREFIX + "/", wire.GUARD_FINALIZER_PREFIX + "/")


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


def services_of_pod(
    event: WatchEvent, reader: CacheReader, accept: Callable[[KubeObject], bool]
) -> list[str]:
    """Keys of the accepted Services that select the pod before or after the change, or whose
    guard or lifecycle finalizer the pod holds."""
    keys: set[str] = set()
    for pod in _copies_to_look_at(event):
        found = [svc for svc in reader.services_selecting(pod) if accept(svc)]
        keys.update(object_key(svc) for svc in found)
        held = {f.split("/", 1)[1] for f in lifecycle.get_finalizers(pod) if f.startswith(_OUR_PREFIXES)}
        held -= {lifecycle.lifecycle_finalizer(svc["metadata"]["name"]).split("/", 1)[1] for svc in found}
        if not held:
            continue
        # Rare (a pod no selector selects still guarded): a scan of the namespace's Services.
        namespace = str(pod.get("metadata", {}).get("namespace") or "")
        for svc in reader.list(kube.SERVICE, namespace):
            digest = lifecycle.lifecycle_finalizer(svc["metadata"]["name"]).split("/", 1)[1]
            if digest in held and accept(svc):
                keys.add(object_key(svc))
    return sorted(keys)


def _copies_to_look_at(event: WatchEvent) -> tuple[KubeObject, ...]:
    """The pod's copies whose Services count: the old and the new, or only the new when the
    change left its labels and finalizers alone (most pod events: a status, a condition), as
    the answer reads nothing else of the pod and would come out the same twice."""
    new, old = event.obj, event.old
    if old is None:
        return (new,)
    new_meta, old_meta = new.get("metadata") or {}, old.get("metadata") or {}
    if new_meta.get("labels") == old_meta.get("labels") and new_meta.get("finalizers") == old_meta.get(
        "finalizers"
    ):
        return (new,)
    return (old, new)


def enqueue_services_by_pod(event: WatchEvent, reader: CacheReader) -> list[str]:
    """Default employee handler: controlled Services selecting the pod before or after, or
    guarding it."""
    return services_of_pod(event, reader, is_controlled)
