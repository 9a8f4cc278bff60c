"""Batched, conflict-safe writes of the PodOpsLifecycle fields of pods.

During one reconcile the steps only *plan* pod changes (expected-finalizer entries in the
shared ``available-conditions`` annotation, lifecycle finalizers); ``flush`` then writes each
pod at most once, annotation and finalizers in one merge patch carrying the pod's
resourceVersion as a precondition (``KubeClient.patch_optimistic``). On 409 Conflict the pod is
read again and the same intent re-applied to the fresh copy, so another employer's entry or
finalizer is never lost; an unchanged pod is never written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from resourceconsist import kube, lifecycle, wire
from resourceconsist.cache import CacheReader
from resourceconsist.kube import KubeClient, KubeObject

log = logging.getLogger(__name__)

_PARALLEL_WRITES = 8


@dataclass
class PodIntent:
    """What this reconcile wants changed on one pod."""

    add_entries: dict[str, str] = field(default_factory=dict)
    remove_entries: set[str] = field(default_factory=set)
    add_finalizers: list[str] = field(default_factory=list)
    remove_finalizers: set[str] = field(default_factory=set)


@dataclass
class PodWriteResult:
    """Per pod name: done (written, already so, or pod gone) or the error that stopped it."""

    done: set[str] = field(default_factory=set)
    failed: dict[str, BaseException] = field(default_factory=dict)
    writes: int = 0


@dataclass(frozen=True)
class PodLocation:
    """Where an employee pod lives: the client and cache of its cluster, and its real name."""

    client: KubeClient
    reader: CacheReader
    name: str


#: Resolves an employee name (``pod`` or ``pod#cluster``) to where the pod lives.
PodResolver = Callable[[str], PodLocation]


class PodWriter:
    """Collects pod intents for one employer's namespace and writes them once each."""

    def __init__(self, namespace: str, resolve: PodResolver) -> None:
        self.namespace = namespace
        self._resolve = resolve
        self._intents: dict[str, PodIntent] = {}

    def _intent(self, name: str) -> PodIntent:
        return self._intents.setdefault(name, PodIntent())

    def add_entry(self, name: str, key: str, value: str) -> None:
        intent = self._intent(name)
        intent.remove_entries.discard(key)
        intent.add_entries[key] = value

    def remove_entry(self, name: str, key: str) -> None:
        intent = self._intent(name)
        intent.add_entries.pop(key, None)
        intent.remove_entries.add(key)

    def add_finalizer(self, name: str, finalizer: str) -> None:
        intent = self._intent(name)
        intent.remove_finalizers.discard(finalizer)
        if finalizer not in intent.add_finalizers:
            intent.add_finalizers.append(finalizer)

    def remove_finalizer(self, name: str, finalizer: str) -> None:
        intent = self._intent(name)
        if finalizer in intent.add_finalizers:
            intent.add_finalizers.remove(finalizer)
        intent.remove_finalizers.add(finalizer)

    @property
    def pending(self) -> bool:
        return bool(self._intents)

    async def flush(self) -> PodWriteResult:
        """Write every planned pod once (in parallel, bounded); forget the plans."""
        intents, self._intents = self._intents, {}
        result = PodWriteResult()
        gate = asyncio.Semaphore(_PARALLEL_WRITES)

        async def one(name: str, intent: PodIntent) -> None:
            async with gate:
                try:
                    if await asyncio.to_thread(self._apply, name, intent):
                        result.writes += 1
                    result.done.add(name)
                except Exception as err:
                    result.failed[name] = err

        await asyncio.gather(*(one(n, i) for n, i in intents.items()))
        return result

    def _apply(self, name: str, intent: PodIntent) -> bool:
        """Bring one pod to the intent; True when it was written."""
        where = self._resolve(name)
        # Start from the cache; it may lag behind a pod created a moment ago, so fall back to a GET.
        pod = where.reader.get(kube.POD, self.namespace, where.name)
        _, wrote = where.client.patch_optimistic(
            kube.POD, self.namespace, where.name, lambda fresh: self._patch_for(fresh, intent), current=pod
        )
        return wrote

    @staticmethod
    def _patch_for(pod: KubeObject, intent: PodIntent) -> dict[str, Any] | None:
        deleting = lifecycle.is_deleting(pod)
        # A deleting pod gets no new entry (Go does the same), and the API server forbids
        # new finalizers on it.
        adds = {} if deleting else intent.add_entries
        annotation = lifecycle.updated_available_conditions(pod, add=adds, remove=intent.remove_entries)
        finalizers = lifecycle.updated_finalizers(
            pod, add=() if deleting else intent.add_finalizers, remove=intent.remove_finalizers
        )
        if annotation is None and finalizers is None:
            return None
        meta: dict[str, Any] = {}
        if annotation is not None:
            meta["annotations"] = {wire.AVAILABLE_CONDITIONS_ANNOTATION: annotation}
        if finalizers is not None:
            meta["finalizers"] = finalizers
        return {"metadata": meta}
