"""The ``alibabacloudslb`` controller adapter: a Service's pods and an Alibaba Cloud SLB (CLB).

Employer: a Service labelled ``kusionstack.io/control: "true"`` and
``service.k8s.alibaba/loadbalancer-id: <lb id>``. Employees: its pods, with PodOpsLifecycle
followed and lifecycle finalizers recorded on the Service (as the Go adapter does).

Two modes, chosen per Service by the ``resource-consist.kusionstack.io/slb-mode`` annotation:
``observe`` (default, the Go adapter's behaviour: CCM owns the load balancer, we only read it;
observe.py) and ``manage`` (we own one VServer group and keep its backends equal to the ready
pods; manage.py). ``SLBAdapter`` holds what is the same in both (watches, lifecycle options, the
per-Service requeue backoff) and, at the first call of each pass, reads the mode once and makes
that pass's strategy (strategy.py), kept in the frame's per-pass ``ctx.scratch``; every other
method delegates to it. All methods are coroutines: the blocking SDK runs in worker threads.
docs/alibabacloudslb.md, "How the adapter is built".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeVar

from resourceconsist.adapter import (
    CUDResults,
    Employee,
    Employer,
    EventHandler,
    Outcome,
    OwnedItem,
    Predicate,
    ProviderView,
    ReconcileAdapter,
    ReconcileContext,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, WatchEvent
from resourceconsist.cluster.kube import KubeObject, Resource, object_key
from resourceconsist.watch import handler

from . import config
from .backoff import RequeueBackoff
from .config import Mode, SLBConfigError, check_cluster_name
from .items import provider_backend
from .manage import ManageStrategy, annotated_backend
from .observe import ObserveStrategy
from .search import GroupSearch
from .settings import DEFAULT_GARBAGE_CALL_BUDGET, check_call_budget
from .slbclient import SLBClient
from .strategy import BackendResolver, ModeStrategy, Tools

log = logging.getLogger(__name__)

#: The Go adapter's controller name (Events are reported by it).
CONTROLLER_NAME: Final = "alibaba-cloud-slb-controller"

ItemT = TypeVar("ItemT", Employer, Employee)

#: Where a pass's strategy lives in the frame's ``ctx.scratch``.
_SCRATCH_KEY: Final = "alibabacloudslb.pass"

#: The strategy of each mode.
STRATEGIES: Final[Mapping[Mode, type[ModeStrategy]]] = {
    strategy.mode: strategy for strategy in (ObserveStrategy, ManageStrategy)
}


def choose_strategy(service: KubeObject) -> tuple[type[ModeStrategy], SLBConfigError | None]:
    """The strategy class ``service``'s mode annotation selects, and the error if it is unusable.

    An unusable mode gets manage mode's strategy, carrying the error (raised by every method that
    needs the settings: a Warning event): its selected names are the conservative answer, since
    they keep the finalizer of a pod that may still have a backend in our group.
    """
    try:
        return STRATEGIES[config.mode_of(service)], None
    except SLBConfigError as err:
        return ManageStrategy, err


class SLBAdapter(ReconcileAdapter):
    """The ``alibabacloudslb`` adapter (Go: ``SlbControllerAdapter``), observe and manage modes."""

    def __init__(
        self,
        client: SLBClient,
        *,
        name: str = CONTROLLER_NAME,
        resolver: BackendResolver = annotated_backend,
        backoff: RequeueBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        cluster_name: str = "",
        load_balancers: Iterable[str] = (),
        garbage_call_budget: int = DEFAULT_GARBAGE_CALL_BUDGET,
    ) -> None:
        """``cluster_name`` (required by manage mode) is written on every VServer group the
        adapter creates and is how it finds its own; ``load_balancers`` narrows the garbage
        search to these load balancers (and those live Services name) instead of the whole
        region; ``garbage_call_budget`` bounds that search's SLB calls per garbage pass
        (docs/alibabacloudslb.md, "Tags and the garbage search"). Bad values raise
        ``SLBConfigError``."""
        self.client = client
        self.cluster_name = check_cluster_name(cluster_name, source="cluster_name")
        self.load_balancers = tuple(load_balancers)
        self.name = name
        self.resolver = resolver
        self.backoff = backoff or RequeueBackoff()
        self._clock = clock
        #: Groups whose refused tagging this adapter has said in the log (once per group).
        self._told_tag_refusals: set[str] = set()
        #: The garbage search and where its sweep stands, kept from one garbage pass to the next.
        self.search = GroupSearch(
            client,
            check_call_budget(garbage_call_budget, source="garbage_call_budget"),
            self.load_balancers,
            name=name,
        )

    def __repr__(self) -> str:
        return f"SLBAdapter(name={self.name!r}, cluster_name={self.cluster_name!r}, client={self.client!r})"

    def get_controller_name(self) -> str:
        return self.name

    # -- the pass's strategy ------------------------------------------------------------------------

    def _tools(self) -> Tools:
        return Tools(
            client=self.client,
            name=self.name,
            resolver=self.resolver,
            clock=self._clock,
            cluster_name=self.cluster_name,
            told_tag_refusals=self._told_tag_refusals,
        )

    def strategy(self, ctx: ReconcileContext, employer: KubeObject) -> ModeStrategy:
        """The strategy of this pass of ``employer``: made at the pass's first call, from the
        Service's mode annotation, then the same for the rest of the pass. A bad annotation is
        kept in it, not raised (see ``ModeStrategy``)."""
        found = ctx.scratch.get(_SCRATCH_KEY)
        if isinstance(found, ModeStrategy):
            return found
        strategy_class, error = choose_strategy(employer)
        strategy = strategy_class(self._tools(), ctx, employer, error)
        ctx.scratch[_SCRATCH_KEY] = strategy
        return strategy

    def _checked(self, ctx: ReconcileContext, employer: KubeObject) -> ModeStrategy:
        return self.strategy(ctx, employer).checked()

    # -- watch options: only Services that name a load balancer ---------------------------------

    def new_employer(self) -> Resource:
        return kube.SERVICE

    def new_employee(self) -> Resource:
        return kube.POD

    def employer_predicates(self) -> Predicate:
        return _service_predicate

    def employee_predicates(self) -> Predicate:
        return _any_event

    def employer_event_handler(self) -> EventHandler:
        return _enqueue_self

    def employee_event_handler(self) -> EventHandler:
        return _enqueue_services_of_pod

    # -- cached pod fields: a named targetPort is found in the pod's container ports ------------------

    def get_cached_pod_fields(self) -> list[str]:
        return ["spec.containers.ports"]

    # -- lifecycle options (the Go adapter's) ------------------------------------------------------

    def follow_pod_ops_lifecycle(self) -> bool:
        return True

    def need_record_lifecycle_finalizer_condition(self) -> bool:
        return True

    async def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
        """The pods the selector selects; in manage mode also the pods still holding our finalizer
        (``ManageStrategy.selected_employee_names`` says why). Served even with a bad annotation."""
        return self.strategy(ctx, employer).selected_employee_names()

    # -- status recording and requeue: the per-Service backoff -------------------------------------

    async def record_statuses(
        self,
        ctx: ReconcileContext,
        employer: KubeObject,
        employer_results: CUDResults[Employer],
        employee_results: CUDResults[Employee],
    ) -> None:
        key = ctx.employer_key
        found = ctx.scratch.get(_SCRATCH_KEY)
        due_in = found.drain_due if isinstance(found, ModeStrategy) else None
        waiting = [
            *_fingerprints("employer", employer_results),
            *_fingerprints("employee", employee_results),
        ]
        interval = self.backoff.observe(key, waiting, due_in=due_in)
        if interval is not None:
            log.debug(
                "%s %s: %d items not done yet; next look in %.2fs", self.name, key, len(waiting), interval
            )

    async def record_error_conditions(
        self, ctx: ReconcileContext, employer: KubeObject, err: BaseException
    ) -> None:
        """Nothing to record: the frame has already turned the error into a Warning event."""

    def employer_requeue_interval(self, ctx: ReconcileContext, employer: KubeObject) -> float:
        return self.backoff.interval(ctx.employer_key)

    # -- orphans: what each mode leaves behind (manage mode's groups of gone Services) ---------------

    async def list_owned(self, ctx: ReconcileContext) -> list[OwnedItem]:
        owned: list[OwnedItem] = []
        for strategy_class in STRATEGIES.values():
            owned += await strategy_class.list_owned(self._tools(), ctx, self.search)
        return owned

    # -- explain: what SLB holds, in its words ---------------------------------------------------------

    async def describe_provider(self, ctx: ReconcileContext, employer: KubeObject) -> ProviderView:
        """Our VServer group (manage mode) and each backend SLB holds for the Service: its
        weight (manage) or health (observe), and whether it serves (docs/explain.md). Reads only."""
        strategy = self._checked(ctx, employer)
        groups = await strategy.current_employers()
        items = await strategy.current_employees()
        return ProviderView(
            employer={g.id: g.statuses.model_dump() for g in groups if g.statuses is not None},
            backends=[b for b in map(provider_backend, items) if b is not None],
        )

    # -- employer (manage mode's VServer group) ---------------------------------------------------------

    async def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        return await self._checked(ctx, employer).expected_employers()

    async def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        return await self._checked(ctx, employer).current_employers()

    async def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]
    ) -> Outcome[Employer]:
        return await self._checked(ctx, employer).create_employers(to_create)

    async def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employer]
    ) -> Outcome[Employer]:
        # A group is its name on its load balancer; nothing else about it is ours to change.
        return to_update, []

    async def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employer]
    ) -> Outcome[Employer]:
        return await self._checked(ctx, employer).delete_employers(to_delete)

    # -- employees ------------------------------------------------------------------------------------

    async def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        return await self._checked(ctx, employer).expected_employees()

    async def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        return await self._checked(ctx, employer).current_employees()

    async def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> Outcome[Employee]:
        return await self._checked(ctx, employer).change_employees("create", to_create)

    async def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> Outcome[Employee]:
        return await self._checked(ctx, employer).change_employees("update", to_update)

    async def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> Outcome[Employee]:
        return await self._checked(ctx, employer).change_employees("delete", to_delete)


def _fingerprints(kind: str, results: CUDResults[ItemT]) -> list[str]:
    failed: Iterable[Employer | Employee] = [
        *results.fail_created,
        *results.fail_updated,
        *results.fail_deleted,
    ]
    return [f"{kind}|{item.id}|{item.statuses!r}" for item in failed]


# -- watch handlers and predicates --------------------------------------------------------------------


def _service_predicate(event: WatchEvent) -> bool:
    """Controlled Services naming a load balancer; an update that drops either label still
    passes once (the old object qualified), so the Service gets a last look."""
    if event.type == "MODIFIED":
        return config.is_slb_service(event.obj) or config.is_slb_service(event.old)
    return config.is_slb_service(event.obj)


def _any_event(event: WatchEvent) -> bool:
    return True


def _enqueue_self(event: WatchEvent, reader: CacheReader) -> list[str]:
    return [object_key(event.obj)]


def _enqueue_services_of_pod(event: WatchEvent, reader: CacheReader) -> list[str]:
    """SLB Services selecting the pod before or after the change, and those whose guard or
    lifecycle finalizer the pod still holds (an unselected pod that manage mode is still draining)."""
    return handler.services_of_pod(event, reader, config.is_slb_service)
