"""The watch options of a built-in adapter whose employers are the controlled Services one
predicate accepts (``ServiceWatch``): Service employers, pod employees, the Services' events
filtered by the predicate (an update that makes a Service leave it passes once, for a last
look), and each pod event mapped to the accepted Services that select the pod before or after
the change or whose finalizer it still holds. Pods keep their container ports in the cache: a
named ``targetPort`` is found there.
"""

from __future__ import annotations

from collections.abc import Callable

from resourceconsist.adapter import EventHandler, Predicate
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, WatchEvent
from resourceconsist.cluster.kube import KubeObject, Resource, object_key
from resourceconsist.watch import handler


class ServiceWatch:
    """Mixed into an adapter class that sets ``accepts``, the predicate on a Service object."""

    #: Whether a Service (or None) is this adapter's employer.
    accepts: Callable[[KubeObject | None], bool]

    def new_employer(self) -> Resource:
        return kube.SERVICE

    def new_employee(self) -> Resource:
        return kube.POD

    def employer_predicates(self) -> Predicate:
        accepts = type(self).accepts

        def predicate(event: WatchEvent) -> bool:
            if event.type == "MODIFIED":
                return accepts(event.obj) or accepts(event.old)
            return accepts(event.obj)

        return predicate

    def employee_predicates(self) -> Predicate:
        return _any_event

    def employer_event_handler(self) -> EventHandler:
        return _enqueue_self

    def employee_event_handler(self) -> EventHandler:
        accepts = type(self).accepts

        def services_of_pod(event: WatchEvent, reader: CacheReader) -> list[str]:
            return handler.services_of_pod(event, reader, accepts)

        return services_of_pod

    def get_cached_pod_fields(self) -> list[str]:
        return ["spec.containers.ports"]


def _any_event(event: WatchEvent) -> bool:
    return True


def _enqueue_self(event: WatchEvent, reader: CacheReader) -> list[str]:
    return [object_key(event.obj)]
