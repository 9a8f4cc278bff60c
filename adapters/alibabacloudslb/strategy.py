"""What the SLB adapter's two mode strategies share, and what each must provide.

``SLBAdapter`` (adapter.py) reads a Service's mode once per pass and makes one strategy for that
pass: ``ObserveStrategy`` (observe.py) or ``ManageStrategy`` (manage.py). Every adapter method
then delegates to it; none looks at the mode again. A strategy also holds what its pass has learnt
(e.g. one read of the load balancer shared by ``get_expected_*`` and ``get_current_*``), so it
lives in the frame's per-pass ``ctx.scratch``. docs/alibabacloudslb.md, "How the adapter is
built".
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar

from resourceconsist.adapter import Employee, Employer, Outcome, OwnedItem, ReconcileContext
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle

from . import config
from .config import LOAD_BALANCER_ID_LABEL, Mode, SLBConfigError
from .slbclient import BackendServer, SLBClient, SLBNotFound

if TYPE_CHECKING:
    from .search import GroupSearch

#: Both strategies log as the adapter module always has, so logging settings keep applying.
log = logging.getLogger("resourceconsist.adapters.alibabacloudslb.adapter")

T = TypeVar("T")


#: Builds the backend a ready pod should have in manage mode, from the Service and the pod.
#: Raises ``manage.Unresolved`` while something is missing (the pod waits, without a finalizer) and
#: ``SLBConfigError`` for a bad annotation (a Warning event on the Service).
BackendResolver = Callable[[KubeObject, KubeObject], BackendServer]


@dataclass(frozen=True)
class Tools:
    """What a strategy borrows from its ``SLBAdapter``."""

    client: SLBClient
    #: The controller name, which starts every log line.
    name: str
    resolver: BackendResolver
    clock: Callable[[], float]
    #: The cluster name written on our VServer groups; empty: not set (manage mode refuses).
    cluster_name: str = ""
    #: Groups whose tagging SLB refused for good, already said in the log: the adapter's own
    #: set, so each adapter says it once per group, whatever other adapters of the process said.
    told_tag_refusals: set[str] = field(default_factory=set)


def pod_name(obj: KubeObject) -> str:
    return str(obj["metadata"]["name"])


#: What the frame asks a strategy to do with employee items (``create_employees`` and so on).
Change = Literal["create", "update", "delete"]


@dataclass(eq=False)
class ModeStrategy(ABC):
    """One pass of one Service in one mode: its settings, what it has read, what it writes.

    A settings error (a bad annotation, a live Service without a load balancer) is kept, not
    raised: the adapter raises it from the first method that needs the settings
    (``checked()``), and the frame turns it into a Warning event on the Service.
    """

    mode: ClassVar[Mode]

    tools: Tools = field(repr=False)
    ctx: ReconcileContext = field(repr=False)
    service: KubeObject = field(repr=False)
    error: SLBConfigError | None = None
    namespace: str = field(init=False)
    deleting: bool = field(init=False)
    finalizer: str = field(init=False)
    guard: str = field(init=False)
    lb_id: str = field(default="", init=False)
    #: Seconds until the earliest drain ends, when a backend waits for one (caps the requeue).
    drain_due: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        meta = self.service["metadata"]
        self.namespace = str(meta.get("namespace") or "")
        self.deleting = lifecycle.is_deleting(self.service)
        self.finalizer = lifecycle.lifecycle_finalizer(str(meta["name"]))
        self.guard = lifecycle.guard_finalizer(str(meta["name"]))
        if self.error is not None:
            return
        try:
            self.lb_id = config.load_balancer_id(self.service)
            if not self.lb_id and not self.deleting:
                raise SLBConfigError(
                    f"Service {self.ctx.employer_key} has no {LOAD_BALANCER_ID_LABEL} label "
                    "naming its load balancer"
                )
            self.read_settings()
        except SLBConfigError as err:
            self.error = err

    def checked(self) -> Self:
        if self.error is not None:
            raise self.error
        return self

    def log(self, level: int, message: str, *args: Any) -> None:
        """Log ``message`` prefixed with the controller and the Service."""
        log.log(level, "%s %s: " + message, self.tools.name, self.ctx.employer_key, *args)

    async def read_load_balancer(self, call: Callable[[str], T], without_it: str) -> T | None:
        """``call(lb_id)``, or ``None`` for a deleting Service whose load balancer is gone or
        unknown (its label was removed: logged, with what the pass does ``without_it``)."""
        if not self.lb_id:
            self.log(logging.WARNING, "deleting Service without %s: %s", LOAD_BALANCER_ID_LABEL, without_it)
            return None
        try:
            found: T = await call_adapter(call, self.lb_id)
        except SLBNotFound:
            if self.deleting:
                return None  # the load balancer itself is gone, and all it held with it
            raise
        return found

    @staticmethod
    def not_ours(action: str, item: Employer) -> SLBConfigError:
        return SLBConfigError(f"refusing to {action} VServer group {item.id!r}: not this Service's group")

    # -- what a mode may change -------------------------------------------------------------------

    def selected_employee_names(self) -> list[str]:
        """The pods the Service's selector selects (the frame strips the lifecycle finalizer from
        recorded pods missing here)."""
        return [pod_name(pod) for pod in self.ctx.reader.pods_selected_by(self.service)]

    @classmethod
    async def list_owned(cls, tools: Tools, ctx: ReconcileContext, search: GroupSearch) -> list[OwnedItem]:
        """What this mode leaves on the load balancers that the frame may collect once its
        Service is gone, as far as this pass's share of ``search`` finds. A mode that makes
        nothing leaves nothing."""
        return []

    # -- what each mode must say ------------------------------------------------------------------

    @abstractmethod
    def read_settings(self) -> None:
        """Parse the mode's own annotations into the strategy; ``SLBConfigError`` for a bad one."""

    @abstractmethod
    async def expected_employers(self) -> list[Employer]:
        """What the load balancer should hold for the Service as a whole (e.g. a group)."""

    @abstractmethod
    async def current_employers(self) -> list[Employer]:
        """What it holds now; compared with ``expected_employers`` by the frame's diff."""

    @abstractmethod
    async def create_employers(self, to_create: list[Employer]) -> Outcome[Employer]:
        """Create what the diff found missing: (done, not done yet)."""

    @abstractmethod
    async def delete_employers(self, to_delete: list[Employer]) -> Outcome[Employer]:
        """Delete what the diff found unwanted; an item that is not this Service's own must be
        refused with an error (``not_ours``), never deleted."""

    @abstractmethod
    async def expected_employees(self) -> list[Employee]:
        """One item per pod (id = pod name) saying what the load balancer should hold for it;
        ``lifecycle_ready`` on each says whether the pod should carry the lifecycle finalizer."""

    @abstractmethod
    async def current_employees(self) -> list[Employee]:
        """One item per pod the load balancer may still route to (and per leftover of ours)."""

    @abstractmethod
    async def change_employees(self, change: Change, items: list[Employee]) -> Outcome[Employee]:
        """Carry out the diff's ``change`` for ``items``: (done, not done yet). An item not done
        keeps its pod's finalizer as it is, and the Service is looked at again."""
