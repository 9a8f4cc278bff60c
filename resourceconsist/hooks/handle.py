"""What runs beside a controller may see of it and do with it: ``ControllerHandle``.

The garbage pass (resourceconsist/hooks/orphans.py) and the sub-resources step
(resourceconsist/hooks/subresources.py) run beside one controller. They get this handle, never the
``Controller``: what they may read (the adapter, the employer kind, the cache, the client, the
Event recorder), a way to claim an employer and run a pass of it, and the ``ReconcileContext``
of an employer, built in one place (the reconciler's). So they cannot reach into the
controller's insides, and the package has no import circle: the controller imports them, they
import this module (as controller-runtime's runnables see a ``cluster.Cluster``).
"""

from __future__ import annotations

from typing import Protocol

from resourceconsist.adapter import ReconcileAdapter, ReconcileContext
from resourceconsist.cluster.cache import CacheReader
from resourceconsist.cluster.interfaces import EventSink
from resourceconsist.cluster.kube import KubeClient, KubeObject, Resource
from resourceconsist.reconcile import Result
from resourceconsist.reconcile.profile import AdapterProfile


class ControllerHandle(Protocol):
    """One controller, as what runs beside it sees it."""

    @property
    def name(self) -> str:
        """The controller's name (``get_controller_name``)."""

    @property
    def adapter(self) -> ReconcileAdapter: ...

    @property
    def profile(self) -> AdapterProfile:
        """The adapter as the frame reads it: its watch options and optional protocols."""

    @property
    def employer(self) -> Resource:
        """The employer kind the controller watches."""

    @property
    def client(self) -> KubeClient:
        """The (main) cluster's API server."""

    @property
    def reader(self) -> CacheReader:
        """The (main) cluster's informer cache."""

    @property
    def recorder(self) -> EventSink: ...

    @property
    def synced(self) -> bool:
        """The controller's caches have synced (an empty cache would make every owner look gone)."""

    @property
    def namespaces(self) -> tuple[str, ...] | None:
        """The namespaces the manager watches; None: all of them."""

    @property
    def follows_lifecycle(self) -> bool:
        """The employers' pods carry their marks (entries, guard and lifecycle finalizers)."""

    @property
    def employees_in_members(self) -> bool:
        """The employees live in member clusters (not in this cache)."""

    def watches(self, key: str) -> bool:
        """The employer ``key`` is in what the manager watches (a namespace-bound manager sees
        its namespaces only: elsewhere its cache cannot see the pods to release, and its
        ServiceAccount may not even look)."""

    def peers(self) -> list[str]:
        """The other controllers of the same manager that employ the same kind: a gone employer
        that nothing listed ties to this controller may be one of theirs."""

    def claim(self, key: str) -> bool:
        """Hold the employer ``key`` as if a pass of it ran (False: one is queued or running);
        its own events wait in the queue until ``done``."""

    def done(self, key: str) -> None:
        """Let go of a claimed employer."""

    def context(self, key: str) -> ReconcileContext:
        """The ``ReconcileContext`` adapter calls get for the employer ``key`` ("": none)."""

    async def run_pass(self, key: str, *, stand_in: KubeObject | None = None) -> Result:
        """Run one reconcile pass of ``key`` (over ``stand_in``, a deleting copy of a gone
        employer, when given), cancelled like the controller's own when it stops."""

    def count_collected(self) -> None:
        """Count one item collected for a gone owner (``resourceconsist_orphans_collected_total``)."""

    def report_held(self, pods: int) -> None:
        """How many pods gone employers hold now (``resourceconsist_pods_held_by_gone_employers``)."""
