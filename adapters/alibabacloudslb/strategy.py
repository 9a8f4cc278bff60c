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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from resourceconsist import lifecycle
from resourceconsist.adapter import Employee, Employer, Outcome, OwnedItem, ReconcileContext
from resourceconsist.cancellation import call_adapter
from resourceconsist.kube import KubeObject

from . import config
from .config import LOAD_BALANCER_ID_LABEL, Mode, SLBConfigError
from .slbclient import BackendServer, SLBClient, SLBNotFound

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


def pod_name(obj: KubeObject) -> str:
    return str(obj["metadata"]["name"])


class ModeStrategy(ABC):
    """One pass of one Service in one mode: its settings, what it has read, what it writes.

    A settings error (a bad annotation, a live Service without a load balancer) is kept, not
    raised: the adapter raises it from the first method that needs the settings
    (``checked()``), and the frame turns it into a Warning event on the Service.
    """

    mode: ClassVar[Mode]

    def __init__(
        self,
        tools: Tools,
        ctx: ReconcileContext,
        service: KubeObject,
        error: SLBConfigError | None = None,
    ) -> None:
        meta = service["metadata"]
        self.tools = tools
        self.ctx = ctx
        self.service = service
        self.namespace = str(meta.get("namespace") or "")
        self.deleting = lifecycle.is_deleting(service)
        self.finalizer = lifecycle.lifecycle_finalizer(str(meta["name"]))
        self.guard = lifecycle.guard_finalizer(str(meta["name"]))
        self.lb_id = ""
        #: Seconds until the earliest drain ends, when a backend waits for one (caps the requeue).
        self.drain_due: float | None = None
        self.error = error
        if error is not None:
            return
        try:
            self.lb_id = config.load_balancer_id(service)
            if not self.lb_id and not self.deleting:
                raise SLBConfigError(
                    f"Service {ctx.employer_key} has no {LOAD_BALANCER_ID_LABEL} label "
                    "naming its load balancer"
                )
            self.read_settings()
        except SLBConfigError as err:
            self.error = err

    @abstractmethod
    def read_settings(self) -> None:
        """Parse the mode's own annotations; ``SLBConfigError`` for a bad one."""

    def checked(self) -> Self:
        if self.error is not None:
            raise self.error
        return self

    def log(self, level: int, message: str, *args: Any) -> None:
        """Log ``message`` prefixed with the controller and the Service."""
        log.log(level, "%s %s: " + message, self.tools.name, self.ctx.employer_key, *args)

    def selected_employee_names(self) -> list[str]:
        """The pods the Service's selector selects."""
        return [pod_name(pod) for pod in self.ctx.reader.pods_selected_by(self.service)]

    async def read_load_balancer(self, call: Callable[[str], T], without_it: str) -> T | None:
        """``call(lb_id)``; ``None`` when a deleting Service has no load balancer (any more),
        after logging what the pass does ``without_it``."""
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

    # -- what each mode says --------------------------------------------------------------------

    @classmethod
    @abstractmethod
    async def list_owned(
        cls, tools: Tools, ctx: ReconcileContext, load_balancers: Sequence[str]
    ) -> list[OwnedItem]:
        """What this mode leaves on the load balancers that the frame may collect once its
        Service is gone (``load_balancers``: searched besides those the Services name)."""

    @abstractmethod
    async def expected_employers(self) -> list[Employer]: ...

    @abstractmethod
    async def current_employers(self) -> list[Employer]: ...

    @abstractmethod
    async def create_employers(self, to_create: list[Employer]) -> Outcome[Employer]: ...

    @abstractmethod
    async def delete_employers(self, to_delete: list[Employer]) -> Outcome[Employer]: ...

    @abstractmethod
    async def expected_employees(self) -> list[Employee]: ...

    @abstractmethod
    async def current_employees(self) -> list[Employee]: ...

    @abstractmethod
    async def create_employees(self, to_create: list[Employee]) -> Outcome[Employee]: ...

    @abstractmethod
    async def update_employees(self, to_update: list[Employee]) -> Outcome[Employee]: ...

    @abstractmethod
    async def delete_employees(self, to_delete: list[Employee]) -> Outcome[Employee]: ...
