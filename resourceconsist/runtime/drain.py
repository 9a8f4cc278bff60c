"""The drain endpoint: whether any provider still routes to a pod, for the drain waiters of the
pods whose employer asks for the ``wait`` drain (docs/zero-downtime.md, "A drain that waits for
the provider"; ``ManagerOptions.drain_address``, ``resourceconsist run --drain-bind-address``).

``GET /drain/v1/released?namespace=NS&pod=NAME&uid=UID&wait=S`` answers 200 with the JSON
``{"released": true|false, "holding": [finalizers]}``. The pod is released once it carries none of
the guard and lifecycle finalizers of any employer (the guard invariant: while a provider may route
an employer's traffic to the pod, the pod carries one of them, and they come off only after the
provider confirmed it let go), or once it is gone (no pod of that name, or one of another uid).
The answer waits up to ``wait`` seconds (at most ``MAX_WAIT``) for the pod to be released, so a
waiter asks once per wait instead of in a tight loop.

It reads the manager's pod cache, which every replica fills, the leader and the standbys alike:
any replica answers, and a leader that is down or frozen leaves the others to answer. A pod the
cache does not hold (a namespace watched in part, a selector that keeps it out) is read from the
API server before it is called gone; a namespace this manager does not watch is answered 404
(another manager's), and 503 while the cache has not filled yet: the waiter asks elsewhere or
again, and falls back to the drain time as its bound.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from typing import Final

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import InformerFactory
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.rules import marks
from resourceconsist.runtime.endpoints import Reply, Route

#: The longest an answer waits for the pod to be released (seconds).
MAX_WAIT: Final = 10.0
#: How often a waiting answer looks at the cache again, and at the API server when it reads from there.
CACHE_LOOK: Final = 0.1
API_LOOK: Final = 1.0
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def released_answer(pod: KubeObject | None, uid: str) -> tuple[bool, list[str]]:
    """(released, the employer finalizers holding it) for ``pod`` as read (None: no pod of the
    name) when the waiter's pod has ``uid`` (empty: any)."""
    if pod is None or (uid and pod.get("metadata", {}).get("uid") != uid):
        return True, []
    holding = marks.employer_finalizers(pod)
    return not holding, holding


class DrainEndpoint:
    """Answers the drain waiters from a manager's informers (the module doc)."""

    def __init__(self, informers: InformerFactory, client: KubeClient) -> None:
        self.informers = informers
        self.client = client

    def routes(self) -> dict[str, Route]:
        """The endpoint's one path, for the manager's endpoint server (runtime/endpoints.py)."""
        return {wire.DRAIN_RELEASED_PATH: self._handle}

    async def _handle(self, query: Mapping[str, str]) -> Reply:
        namespace, name, uid = query.get("namespace", ""), query.get("pod", ""), query.get("uid", "")
        try:
            wait = min(max(float(query.get("wait", "0")), 0.0), MAX_WAIT)
        except ValueError:
            wait = -1.0
        if not _NAME.match(namespace) or not _NAME.match(name) or wait < 0:
            return Reply.text(
                f"give ?namespace=<namespace>&pod=<pod name>[&uid=<uid>][&wait=<0..{MAX_WAIT:g} s>]\n", 400
            )
        if not self.informers.watches(namespace):
            return Reply.text(f"this manager does not watch namespace {namespace}\n", 404)
        informer = self.informers.informer(kube.POD)
        if not informer.has_synced:
            return Reply.text("the pod cache has not filled yet\n", 503)
        released, holding = await self.released(namespace, name, uid, wait)
        body = {"released": released, "holding": holding}
        return Reply(200, json.dumps(body).encode(), "application/json; charset=utf-8")

    async def released(self, namespace: str, name: str, uid: str, wait: float) -> tuple[bool, list[str]]:
        """Whether the pod is released, waiting up to ``wait`` seconds for it to be."""
        deadline = time.monotonic() + wait
        store = self.informers.informer(kube.POD).store
        from_api = False
        while True:
            pod = None if from_api else store.get(f"{namespace}/{name}")
            if pod is None:
                # Not cached: the API server says whether it is gone, and is asked from then on.
                from_api = True
                pod = await asyncio.to_thread(self.client.get_or_none, kube.POD, namespace, name)
            released, holding = released_answer(pod, uid)
            left = deadline - time.monotonic()
            if released or left <= 0:
                return released, holding
            await asyncio.sleep(min(left, API_LOOK if from_api else CACHE_LOOK))
