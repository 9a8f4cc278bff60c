"""A shard's share of the pods (docs/scaling.md, "What a shard's employers need of pods"): the pod
cache of a replica keeps the pods its own employers select, and the pods whose marks name an
employer that is its own or that the ring places on it; every other pod is let go as it is
decoded (``InformerFactory.restrict_pods``), so pod memory divides among the replicas with no
write to any pod.

A mark that names no employer it can resolve (a guard or lifecycle finalizer whose employer no
entry or gate names, a hashed gate) keeps the pod: a pod an employer may hold is never missing
from its owner's cache on a guess. When the shard's employers change (one arrives, or its
selector changes), the pod cache lists again with the new share (``Informer.relist``), unless
a list that started after the employer was in its cache is in already (``Informer.listed_since``);
a pass waits until that list is in (``Controller``, before each pass): a moved employer's first
pass sees every pod it selects. The pod cache's first list waits for the shard's Service cache,
so it keeps the shard's share rather than every pod (then listed again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, WatchEvent
from resourceconsist.cluster.kube import EmployerKey, KubeObject
from resourceconsist.rules import lifecycle, marks
from resourceconsist.runtime.sharding.shard import ShardGate


class ShardPods:
    """Which pods one shard keeps in its cache, for controllers of Services and their pods."""

    def __init__(self, gate: ShardGate, reader: CacheReader, services_ready: Callable[[], bool]) -> None:
        self.gate = gate
        #: The replica's caches: its Service cache holds its own share (label-selected).
        self.reader = reader
        #: The shard's Service cache has synced; before, every pod is kept.
        self.services_ready = services_ready
        self._lock = threading.Lock()
        self._kept_unjudged = False

    def kept_unjudged(self) -> bool:
        """A pod was kept before the Service cache had synced, without a judgement: once it has,
        the pods must be listed again to let go of the others."""
        with self._lock:
            return self._kept_unjudged

    def keeps(self, pod: KubeObject) -> bool:
        """The pod is selected by one of this shard's Services, or carries a mark of one of them
        (or of a gone employer the ring places here, or of one it cannot name)."""
        if not self.services_ready():
            with self._lock:
                # Read again under the lock: a reader of kept_unjudged after the sync sees this
                # keep, or this call sees the sync.
                if not self.services_ready():
                    self._kept_unjudged = True
                    return True
        if self.reader.services_selecting(pod):
            return True
        namespace = str(pod.get("metadata", {}).get("namespace") or "")
        names = {*marks.entry_names(pod, kube.SERVICE.kind), *marks.gate_names(pod)}
        for name in names:
            if self.reader.get(kube.SERVICE, namespace, name) is not None:
                return True
            if self.gate.ring_owns(kube.SERVICE, EmployerKey.named(namespace, name)):
                return True  # a gone Service's garbage pass runs here (docs/scaling.md)
        # Marks whose employer nothing above names keep the pod.
        named = {marks.digest_of(v) for v in marks.entries_of(pod).values()}
        named |= {marks.name_digest(n) for n in names}
        finalizers = pod.get("metadata", {}).get("finalizers") or ()
        if any(d is not None and d not in named for d in map(marks.digest_of, finalizers)):
            return True
        gates = [g for g in lifecycle.readiness_gates(pod) if lifecycle.is_readiness_gate(g)]
        return len(gates) > len(marks.gate_names(pod))


def changes_share(event: WatchEvent) -> bool:
    """A Service event after which the shard's pods must be listed again: one arrived, or its
    selector changed (pods it did not select before may be let go of)."""
    if event.type == "ADDED":
        return True
    if event.type != "MODIFIED" or event.old is None:
        return False
    return bool(event.obj.get("spec", {}).get("selector") != event.old.get("spec", {}).get("selector"))
