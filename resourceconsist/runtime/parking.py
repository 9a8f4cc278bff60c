"""Events a controller's handlers could not map yet: ``ParkedEvents`` keeps each until the cache it
waits for has synced, then hands it back to be mapped again (docs/concepts.md, "Events before the
caches sync"). A pod event can come before the Service cache's first list; the default handlers
(resourceconsist/watch/handler.py) then raise ``CacheNotSynced``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from resourceconsist.cluster.cache import CacheNotSynced, InformerFactory, WatchEvent
from resourceconsist.cluster.kube import Resource, object_key

log = logging.getLogger(__name__)


class ParkedEvents:
    """Events a handler could not map because a cache it reads had not synced, kept until that
    cache has synced and then handed to ``remap`` (on the event loop, in the order they came).

    Per object, the first and the latest event are kept: the first carries the object as it was
    before (``old``), the latest as it is, so a handler mapping both sides (``services_of_pod``)
    still finds the employers of either; the memory is bounded by the objects, not the events.
    Nothing waits on a thread: the cache's informer calls back once its first list is in
    (``Informer.when_synced``).
    """

    def __init__(self, name: str, informers: InformerFactory, remap: Callable[[WatchEvent], None]) -> None:
        #: What the log lines name: the controller and the kind of events kept.
        self.name = name
        self._informers = informers
        self._remap = remap
        self._waiting: dict[Resource, dict[str, list[WatchEvent]]] = {}
        self._withdraw: dict[Resource, Callable[[], None]] = {}

    def park(self, event: WatchEvent, err: CacheNotSynced, *, again: bool = False) -> bool:
        """Keep ``event`` until the cache ``err`` names has synced. False when there is nothing
        to wait for: ``err`` names no kind, or this is a re-map (``again``) and that cache has
        synced in this factory yet the handler still finds it unsynced (it reads another
        factory's cache); the caller then treats the event as a failed mapping."""
        resource = err.resource
        if resource is None:
            return False
        informer = self._informers.informer(resource)
        if again and informer.has_synced:
            return False
        kept = self._waiting.get(resource)
        if kept is None:
            kept = self._waiting[resource] = {}
            self._withdraw[resource] = informer.when_synced(lambda: self._synced(resource))
            log.debug("%s: events wait for the %s cache to sync", self.name, resource.plural)
        events = kept.setdefault(object_key(event.obj), [])
        if len(events) < 2:
            events.append(event)
        else:
            events[1] = event
        return True

    def _synced(self, resource: Resource) -> None:
        self._withdraw.pop(resource, None)
        kept = self._waiting.pop(resource, {})
        log.debug(
            "%s: the %s cache synced; mapping the events of %d object(s) again",
            self.name,
            resource.plural,
            len(kept),
        )
        for events in kept.values():
            for event in events:
                self._remap(event)

    def waiting_for(self) -> dict[str, int]:
        """The number of objects whose events wait, by the plural of the cache they wait for."""
        return {resource.plural: len(kept) for resource, kept in self._waiting.items()}

    def clear(self) -> None:
        """Drop what waits (the controller stops; a new subscription gets the caches' replay)."""
        for withdraw in self._withdraw.values():
            withdraw()
        self._withdraw.clear()
        self._waiting.clear()
