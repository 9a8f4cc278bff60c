"""The ``haproxy`` controller adapter: a Service's pods as servers of an HAProxy backend, kept in
step on every instance through HAProxy's runtime API.

Employer: a Service labelled ``kusionstack.io/control: "true"`` and annotated
``resource-consist.kusionstack.io/haproxy-backend: <backend>``. Employees: its pods, with
PodOpsLifecycle followed. The backend is HAProxy's configuration, not ours: there is no employer
item, and nothing of the backend but its servers named ``rc:...`` (config.py) is ever changed.
``HAProxyAdapter`` holds the watches, the lifecycle options and the requeue; each pass is one
``ServicePass`` (manage.py), kept in the frame's per-pass ``ctx.scratch``, which reads every
instance once. Every pass asks to be looked at again within ``resync_seconds``: nothing in
Kubernetes announces a reloaded HAProxy that lost its runtime servers, so the adapter looks.
docs/haproxy.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

from resourceconsist.adapter import (
    Employee,
    Employer,
    Outcome,
    OwnedItem,
    ProviderView,
    ReconcileAdapter,
    ReconcileContext,
)
from resourceconsist.cluster.kube import KubeObject

from ..servicewatch import ServiceWatch
from . import config
from .items import provider_backend
from .manage import HEALTH_POLL_SECONDS, ServicePass, Tools, read_instances
from .runtime import RuntimeAPI, RuntimeAPIError, Stat

log = logging.getLogger("resourceconsist.adapters.haproxy")

#: The controller's name (Events are reported by it).
CONTROLLER_NAME: Final = "haproxy-controller"
#: Seconds within which every Service is looked at again when nothing else brings a pass.
DEFAULT_RESYNC_SECONDS: Final = 10.0
#: How often an observe-mode Service waiting for HAProxy's servers to follow its pods looks again.
OBSERVE_POLL_SECONDS: Final = 2.0
#: The longest a Service whose items keep failing waits before the next try.
MAX_REQUEUE_SECONDS: Final = 10.0

#: Where a pass lives in the frame's ``ctx.scratch``, and a Service's failing streak in ``ctx.memo``.
_SCRATCH_KEY: Final = "haproxy.pass"
_STREAK_KEY: Final = "haproxy.failing"


class HAProxyAdapter(ServiceWatch, ReconcileAdapter):
    """The ``haproxy`` adapter: one or several HAProxy instances (an HA pair) kept in step. Its
    Services: controlled and naming a backend (``ServiceWatch``)."""

    accepts = staticmethod(config.is_haproxy_service)

    def __init__(
        self,
        instances: Iterable[RuntimeAPI],
        *,
        name: str = CONTROLLER_NAME,
        resync_seconds: float = DEFAULT_RESYNC_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instances = tuple(instances)
        if not self.instances:
            raise config.HAProxyConfigError(
                "the haproxy adapter needs at least one HAProxy runtime API address"
            )
        names = [api.name for api in self.instances]
        if len(set(names)) != len(names):
            raise config.HAProxyConfigError(f"an HAProxy instance is named twice: {', '.join(names)}")
        if not resync_seconds > 0:
            raise config.HAProxyConfigError(f"resync seconds {resync_seconds!r} must be above 0")
        self.name = name
        self.resync_seconds = resync_seconds
        self._clock = clock

    def __repr__(self) -> str:
        return f"HAProxyAdapter(name={self.name!r}, instances={[api.name for api in self.instances]!r})"

    def get_controller_name(self) -> str:
        return self.name

    def service_pass(self, ctx: ReconcileContext, employer: KubeObject) -> ServicePass:
        """This pass of ``employer``: made at the pass's first call, then the same for the rest of
        it. A bad annotation is kept in it and raised by the calls that need the settings."""
        found = ctx.scratch.get(_SCRATCH_KEY)
        if isinstance(found, ServicePass):
            return found
        made = ServicePass(Tools(self.instances, self.name, self._clock), ctx, employer)
        ctx.scratch[_SCRATCH_KEY] = made
        # A reloaded HAProxy lost its runtime servers, and no watch event says so.
        ctx.look_again_in(self.resync_seconds)
        return made

    def _checked(self, ctx: ReconcileContext, employer: KubeObject) -> ServicePass:
        return self.service_pass(ctx, employer).checked()

    # -- lifecycle options -----------------------------------------------------------------------------

    def follow_pod_ops_lifecycle(self) -> bool:
        return True

    def need_record_lifecycle_finalizer_condition(self) -> bool:
        return False

    async def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
        return [str(p["metadata"]["name"]) for p in ctx.reader.pods_selected_by(employer)]

    # -- requeue: short while waiting on HAProxy, growing while an item keeps failing -----------------

    def employer_requeue_interval(self, ctx: ReconcileContext, employer: KubeObject) -> float:
        """Items not done yet (a drain, a health check) are looked at again soon (the pass has
        asked for the exact time, ``look_again_in``); items HAProxy refused or an instance that
        does not answer, after 0.5 s doubling per failing pass, up to ``MAX_REQUEUE_SECONDS``."""
        if not ctx.failures:
            ctx.memo.pop(_STREAK_KEY, None)
            found = ctx.scratch.get(_SCRATCH_KEY)
            # Observe mode waits for someone else's change, at its own pace.
            return (
                OBSERVE_POLL_SECONDS
                if isinstance(found, ServicePass) and found.observe
                else HEALTH_POLL_SECONDS
            )
        streak = int(ctx.memo.get(_STREAK_KEY, 0)) + 1
        ctx.memo[_STREAK_KEY] = streak
        return float(min(MAX_REQUEUE_SECONDS, HEALTH_POLL_SECONDS * 2 ** min(streak, 10)))

    # -- orphans: servers of ours whose Service is gone ------------------------------------------------

    async def list_owned(self, ctx: ReconcileContext) -> list[OwnedItem]:
        """Every server named ``rc:<namespace>:<service>:<pod>`` on every instance, owned by that
        Service. An instance that cannot be read fails the listing: unknown releases nothing."""
        stats = await read_instances(self.instances)
        owned: list[OwnedItem] = []
        for instance, stat in stats.items():
            if isinstance(stat, RuntimeAPIError):
                raise stat
            for server in stat.servers:
                owner = config.owner_of(server.name)
                if owner is None:
                    continue
                owned.append(
                    OwnedItem(
                        owner=f"{owner.namespace}/{owner.service}",
                        id=f"server {server.backend}/{server.name} on {instance}",
                        annotations={config.BACKEND_ANNOTATION: server.backend},
                    )
                )
        return owned

    def lists_everything_owned(self) -> bool:
        """Every server this adapter writes is named for its Service, and ``list_owned`` reads every
        instance whole: a gone Service it does not name holds no server."""
        return True

    # -- explain -----------------------------------------------------------------------------------------

    async def describe_provider(self, ctx: ReconcileContext, employer: KubeObject) -> ProviderView:
        """The backend on each instance (its balance algorithm, or that it is missing) and each
        pod's servers there in HAProxy's words: status, weight, sessions, health check. Reads only."""
        run = self._checked(ctx, employer)
        stats = await run.read()
        await run.plan()
        backends: dict[str, object] = {}
        for instance, stat in stats.items():
            if isinstance(stat, Stat):
                algo = stat.backends.get(run.backend)
                backends[instance] = {
                    "backend": run.backend,
                    "balance": algo if algo is not None else "missing",
                }
            else:
                backends[instance] = {"backend": run.backend, "error": stat.message}
        return ProviderView(
            employer=backends,
            backends=[b for b in map(provider_backend, run.current or []) if b is not None],
        )

    # -- employer: none (the backend is HAProxy's configuration) ----------------------------------------

    async def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        self._checked(ctx, employer)
        return []

    async def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        return []

    async def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]
    ) -> Outcome[Employer]:
        return [], []

    async def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employer]
    ) -> Outcome[Employer]:
        return [], []

    async def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employer]
    ) -> Outcome[Employer]:
        return [], []

    # -- employees ---------------------------------------------------------------------------------------

    async def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        run = self._checked(ctx, employer)
        await run.plan()
        return list(run.expected or [])

    async def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        run = self._checked(ctx, employer)
        await run.plan()
        return list(run.current or [])

    async def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> Outcome[Employee]:
        return await self._checked(ctx, employer).converge(to_create, leaving=False)

    async def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> Outcome[Employee]:
        return await self._checked(ctx, employer).converge(to_update, leaving=False)

    async def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> Outcome[Employee]:
        return await self._checked(ctx, employer).converge(to_delete, leaving=True)
