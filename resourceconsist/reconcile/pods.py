"""Where one adapter's pod employees live, and what the pass reads of them: the main cluster's
pods, or, named ``pod#cluster``, those of member clusters; each pod's freshest copy (the cache,
with this reconciler's own recent writes: podwriter.RecentWrites).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from resourceconsist import wire
from resourceconsist.cluster.interfaces import ObjectReader, ObjectWriter
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.reconcile import readiness
from resourceconsist.reconcile.podwriter import PodLocation, RecentWrites


class PodPlaces:
    """The clusters one reconciler's pod employees live in."""

    def __init__(
        self,
        client: ObjectWriter,
        reader: ObjectReader,
        clusters: Mapping[str, tuple[ObjectWriter, ObjectReader]],
        in_members: Callable[[], bool],
        recent: RecentWrites,
    ) -> None:
        self._client = client
        self._reader = reader
        #: The member clusters by name (the controller adds and removes them while it runs).
        self._clusters = clusters
        #: Pod employees live in member clusters (named ``pod#cluster``).
        self.in_members = in_members
        self._recent = recent

    def locate(self, employee_name: str) -> PodLocation:
        """Where a pod employee lives: ``pod#cluster`` in a member cluster, else the main one."""
        if self.in_members():
            pod, sep, cluster = employee_name.rpartition(wire.MULTI_CLUSTER_SEPARATOR)
            if not sep or not pod:
                raise ValueError(f"employee name {employee_name!r} is not <pod>#<cluster>")
            if cluster not in self._clusters:
                raise LookupError(f"employee {employee_name!r}: cluster {cluster!r} is not registered")
            client, reader = self._clusters[cluster]
            return PodLocation(client, reader, pod)
        return PodLocation(self._client, self._reader, employee_name)

    def get(self, name: str, namespace: str) -> KubeObject | None:
        """The pod employee's freshest copy; None: not cached."""
        if not self.in_members():  # the common case, asked for every pod of every pass
            return self._recent.get(self._reader, namespace, name)
        where = self.locate(name)
        return self._recent.get(where.reader, namespace, where.name)

    def carrying(self, namespace: str, finalizers: Sequence[str]) -> set[str]:
        """Pods (``pod`` or ``pod#cluster``) whose cached copy carries one of ``finalizers``:
        an index lookup, not a scan."""
        if self.in_members():
            return {
                f"{pod['metadata']['name']}{wire.MULTI_CLUSTER_SEPARATOR}{cluster}"
                for cluster, (_, reader) in self._clusters.items()
                for finalizer in finalizers
                for pod in reader.pods_with_finalizer(namespace, finalizer)
            }
        return {
            pod["metadata"]["name"]
            for f in finalizers
            for pod in self._reader.pods_with_finalizer(namespace, f)
        }

    def gated(self, namespace: str, gate: str) -> list[tuple[str, KubeObject]]:
        """(employee name, freshest copy) of the cached pods that carry the readiness gate
        ``gate``: a gate this reconciler wrote a moment ago is seen written, whether or not its
        watch event reached the cache (podwriter.RecentWrites)."""
        members = {c: reader for c, (_, reader) in self._clusters.items()} if self.in_members() else None
        found = readiness.gated_pods(namespace, gate, self._reader, members)
        if not self._recent:
            return found
        fresh: list[tuple[str, KubeObject]] = []
        for name, cached in found:
            reader, pod_name = self._reader, name
            if members is not None:
                where = self.locate(name)
                reader, pod_name = where.reader, where.name
            pod = self._recent.fresher(reader, namespace, pod_name, cached)
            fresh.append((name, pod if pod is not None else cached))
        return fresh
