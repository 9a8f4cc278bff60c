"""The multi-cluster registry: member clusters added and removed at runtime.

The employer lives in the main (federation) cluster; a multi-cluster adapter's employees may
live in member clusters, named ``<pod>#<cluster>``. Each member has its own client and
informer caches; adding a member starts them and tells every controller, removing it stops
them. ``with_client`` gives the client of one member.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from resourceconsist.cluster.cache import InformerFactory
from resourceconsist.cluster.kube import KubeClient

log = logging.getLogger(__name__)


@dataclass
class MemberCluster:
    name: str
    client: KubeClient
    informers: InformerFactory


Listener = Callable[[str, MemberCluster | None], None]


class ClusterRegistry:
    """Member clusters by name; listeners hear of each addition (member) and removal (None)."""

    def __init__(self) -> None:
        self._members: dict[str, MemberCluster] = {}
        self._listeners: list[Listener] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def names(self) -> list[str]:
        return sorted(self._members)

    def members(self) -> dict[str, MemberCluster]:
        return dict(self._members)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for member in self._members.values():
            member.informers.start(loop)

    def spawn(self, name: str, client: KubeClient) -> MemberCluster:
        """Add (or replace) a member cluster and start its caches."""
        if "#" in name or not name:
            raise ValueError(f"cluster name {name!r} must be non-empty and hold no '#'")
        if name in self._members:
            self.stop(name)
        member = MemberCluster(name, client, InformerFactory(client))
        self._members[name] = member
        if self._loop is not None:
            member.informers.start(self._loop)
        for listener in self._listeners:
            listener(name, member)
        log.info("member cluster %s added", name)
        return member

    def stop(self, name: str) -> None:
        """Remove a member cluster and stop its caches."""
        member = self._members.pop(name, None)
        if member is None:
            return
        member.informers.stop()
        for listener in self._listeners:
            listener(name, None)
        log.info("member cluster %s removed", name)

    def with_client(self, name: str) -> KubeClient:
        member = self._members.get(name)
        if member is None:
            raise LookupError(
                f"cluster {name!r} is not registered (known: {', '.join(self.names()) or 'none'})"
            )
        return member.client

    def stop_all(self) -> None:
        for name in list(self._members):
            self.stop(name)
