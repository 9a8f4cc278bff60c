"""The event recorder: Kubernetes Events on employers, where users look (``kubectl describe``).

Repeats of the same (object, type, reason, message) within a short window are folded into one
Event whose ``count`` grows, as client-go's correlator does, so a failing employer retried with
backoff does not flood the API server. Recording never raises: a lost Event is logged.
An Event may carry annotations (the provider failure of docs/concepts.md, "When a failure
becomes a Warning"), set when it is created; a fold moves its count and last time and, when the
recorder was given ``annotate`` (a controller's: the pass's ``reconcileID``), writes those
annotations again, so the Event names the last pass that recorded it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from resourceconsist.cluster import kube
from resourceconsist.cluster.interfaces import EventType
from resourceconsist.cluster.kube import KubeClient, KubeObject

log = logging.getLogger(__name__)

#: What one Event message holds; the rest is cut.
MAX_MESSAGE = 1024
_FOLD_WINDOW = 600.0
_REMEMBERED = 4096


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records Events for one component (the controller name is the Event's source)."""

    def __init__(
        self,
        client: KubeClient,
        component: str,
        *,
        annotate: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """``annotate``: annotations every Event gets, read where it is recorded (a pass's
        ``reconcileID``), and written again when a repeat is folded into it."""
        self.client = client
        self.component = component
        self._annotate = annotate
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()
        # (uid, type, reason, message) -> (event name, namespace, count, first seen)
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, str, int, float]] = OrderedDict()

    async def event(
        self,
        obj: KubeObject,
        type_: EventType,
        reason: str,
        message: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Record an Event about ``obj``; failures are logged, never raised."""
        current = dict(self._annotate()) if self._annotate is not None else {}
        try:
            await asyncio.to_thread(
                self._record,
                obj,
                type_,
                reason,
                message[:MAX_MESSAGE],
                {**current, **(annotations or {})},
                current,
            )
        except Exception as err:
            # While the API server is unreachable, the client has said so once already.
            quiet = kube.is_unreachable(err) or self.client.reachability.down
            level = logging.DEBUG if quiet else logging.WARNING
            log.log(level, "could not record event %s on %s: %s", reason, kube.object_key(obj), err)

    def _record(
        self,
        obj: KubeObject,
        type_: EventType,
        reason: str,
        message: str,
        annotations: dict[str, str],
        refreshed: dict[str, str],
    ) -> None:
        """Create the Event, or fold a repeat into it (``refreshed``: the annotations a fold
        writes again)."""
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        key = (str(meta.get("uid", kube.object_key(obj))), type_, reason, message)
        seen = self._seen.get(key)
        now = time.monotonic()
        if seen is not None and now - seen[3] < _FOLD_WINDOW:
            name, ns, count, first = seen
            try:
                fold: dict[str, object] = {"count": count + 1, "lastTimestamp": _now()}
                if refreshed:
                    fold["metadata"] = {"annotations": refreshed}
                self.client.patch(kube.EVENT, ns, name, fold)
                self._seen[key] = (name, ns, count + 1, first)
                self._seen.move_to_end(key)
                return
            except kube.NotFound:
                pass  # the folded Event expired: record a new one
        stamp = _now()
        body = {
            "metadata": {
                "generateName": f"{meta.get('name', 'object')}.",
                "namespace": namespace,
                **({"annotations": annotations} if annotations else {}),
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", ""),
                "kind": obj.get("kind", ""),
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        created = self.client.create(kube.EVENT, namespace, body)
        self._seen[key] = (created["metadata"]["name"], namespace, 1, now)
        while len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
