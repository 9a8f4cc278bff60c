"""The SLB adapter's employer and employee items: what the frame diffs, per mode.

Observe mode (the Go adapter's model): one item per selected pod, on both sides, id = pod name;
``Traffic.traffic_on`` is "should be in the load balancer" (expected: the pod is lifecycle-ready)
or "is in the load balancer" (current: its IP is listed by ``DescribeHealthStatus``, whose health
the current item keeps in ``Traffic.healthy``).

Manage mode: one item per relevant pod, on both sides, id = pod name. The expected side carries
``Desired`` (what the pod's backends in our VServer group should be), the current side
``Attached`` (the backends of ours the group holds for that pod's IP); ``ManagedEmployee.equal``
compares the two. Backends of ours that no pod accounts for are current-only items ("orphans"),
which the diff deletes. On every expected item ``lifecycle_ready`` is True exactly when the pod
should carry the lifecycle finalizer, because the frame reads it on updated and unchanged items
to add or remove the finalizer.

In both modes ``registered()`` says whether SLB holds a backend that may route to the pod (the
guard's question) and ``serves()`` whether that backend carries traffic: a weight above 0, and
not reported unhealthy (the readiness gate's question; docs/concepts.md, "The guard").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from resourceconsist.adapter import Employee, Employer, PodEmployeeStatuses, ProviderBackend

from .config import MEMBER_DESCRIPTION_PREFIX
from .slbclient import BackendServer

#: What a pod's backends should be in manage mode:
#: ``on``: exactly ``backend`` (key and weight); ``pending``: ready, but no backend can be built
#: yet (no IP, no server id, unknown port): never equal, so the pod waits without a finalizer;
#: ``idle``: alive but not ready: backends may stay, at weight 0; ``gone``: no backend at all.
DesiredState = Literal["on", "pending", "idle", "gone"]


class Traffic(BaseModel):
    """Observe mode's ``extra_status``."""

    model_config = ConfigDict(frozen=True)

    traffic_on: bool
    #: Current side: whether SLB reports the listed backend healthy on some listener (False: every
    #: listener reports it ``abnormal``); None where SLB reports no health (the expected side).
    healthy: bool | None = None


class Desired(BaseModel):
    """Manage mode's expected ``extra_status``."""

    model_config = ConfigDict(frozen=True)

    state: DesiredState
    backend: BackendServer | None = None
    #: Why a ready pod is ``pending`` (for logs).
    reason: str = ""
    #: Set on an item this pass just added or raised above weight 0 while a readiness gate waits
    #: on the Service: SLB's health check has not spoken yet, so it does not serve until a later
    #: pass reads a health that is not ``abnormal`` (docs/alibabacloudslb.md, "Manage").
    health_pending: bool = False

    def satisfied_by(self, members: tuple[BackendServer, ...]) -> bool:
        if self.state == "on":
            want = self.backend
            return (
                want is not None
                and len(members) == 1
                and members[0].key == want.key
                and members[0].weight == want.weight
            )
        if self.state == "idle":
            return all(member.weight == 0 for member in members)
        if self.state == "gone":
            return not members
        return False


class Attached(BaseModel):
    """Manage mode's current ``extra_status``: our backends in the group for this pod's IP."""

    model_config = ConfigDict(frozen=True)

    members: tuple[BackendServer, ...] = ()
    #: Whether SLB reports these backends healthy on some listener (False: every report about
    #: them is ``abnormal``); None where health was not read or SLB reports none.
    healthy: bool | None = None


def _statuses(item: Employee) -> PodEmployeeStatuses | None:
    return item.statuses if isinstance(item.statuses, PodEmployeeStatuses) else None


def _traffic(statuses: PodEmployeeStatuses) -> bool | None:
    extra = statuses.extra_status
    return extra.traffic_on if isinstance(extra, Traffic) else None


class ObservedEmployee(Employee):
    """A selected pod in observe mode (Go: ``AlibabaSlbPodStatus``)."""

    def equal(self, other: Employee) -> bool:
        mine, theirs = _statuses(self), _statuses(other)
        if mine is None or theirs is None:
            return False
        return (
            self.name == other.name
            and mine.ip == theirs.ip
            and mine.ipv6 == theirs.ipv6
            # Health is SLB's to judge, not ours to change: it never makes an update.
            and _traffic(mine) == _traffic(theirs)
        )

    def registered(self) -> bool:
        """Expected: the pod should be in the load balancer; current: its IP is listed."""
        return self.traffic_on

    def serves(self) -> bool:
        """Listed, and not reported unhealthy on every listener (CCM gives weight; SLB's health
        list is all observe mode reads)."""
        statuses = _statuses(self)
        extra = statuses.extra_status if statuses is not None else None
        return self.traffic_on and not (isinstance(extra, Traffic) and extra.healthy is False)

    @property
    def traffic_on(self) -> bool:
        statuses = _statuses(self)
        return (
            statuses is not None
            and isinstance(statuses.extra_status, Traffic)
            and (statuses.extra_status.traffic_on)
        )


class ManagedEmployee(Employee):
    """A pod (or an orphan backend) in manage mode."""

    def equal(self, other: Employee) -> bool:
        desired, attached = self.desired, other.attached if isinstance(other, ManagedEmployee) else None
        if desired is None or attached is None:
            return False
        return desired.satisfied_by(attached.members)

    def registered(self) -> bool:
        """Expected: backends should stay or be added (``on``, or ``idle`` at weight 0);
        current: the group holds a backend of ours for the pod."""
        desired, attached = self.desired, self.attached
        if desired is not None:
            return desired.state in ("on", "idle")
        return attached is not None and bool(attached.members)

    def serves(self) -> bool:
        """Expected: the pod should have its backend at a weight above 0, and its health is not
        still pending; current: the group holds a backend of ours for the pod at a weight above
        0 that SLB does not report ``abnormal`` on every listener. A backend at weight 0 is
        registered (it may get traffic back at any moment, so the guard holds) but carries none,
        and an unhealthy one gets none, so the pod's readiness gate stays False
        (docs/alibabacloudslb.md, "Manage")."""
        desired, attached = self.desired, self.attached
        if desired is not None:
            return (
                desired.state == "on"
                and desired.backend is not None
                and desired.backend.weight > 0
                and not desired.health_pending
            )
        return (
            attached is not None
            and attached.healthy is not False
            and any(member.weight > 0 for member in attached.members)
        )

    @property
    def desired(self) -> Desired | None:
        statuses = _statuses(self)
        extra = statuses.extra_status if statuses is not None else None
        return extra if isinstance(extra, Desired) else None

    @property
    def attached(self) -> Attached | None:
        statuses = _statuses(self)
        extra = statuses.extra_status if statuses is not None else None
        return extra if isinstance(extra, Attached) else None


class GroupStatus(BaseModel):
    """Manage mode's employer statuses: our VServer group on the Service's load balancer."""

    model_config = ConfigDict(frozen=True)

    load_balancer_id: str
    #: Known on the current side only.
    vserver_group_id: str = ""


class GroupEmployer(Employer):
    """Our VServer group; equal when it sits on the load balancer the Service names."""

    def equal(self, other: Employer) -> bool:
        mine, theirs = self.statuses, other.statuses
        if not isinstance(mine, GroupStatus) or not isinstance(theirs, GroupStatus):
            return False
        return self.id == other.id and mine.load_balancer_id == theirs.load_balancer_id


def provider_backend(item: Employee) -> ProviderBackend | None:
    """What SLB holds for one current item, in SLB's words (``resourceconsist explain``); None
    when it holds nothing that may route to the pod.

    A backend of ours that no pod accounts for (an orphan) is named by the pod its description
    names, so explain can say that pod no longer exists."""
    if not item.registered():
        return None
    if isinstance(item, ManagedEmployee) and item.attached is not None:
        members = item.attached.members
        described = [
            m.description[len(MEMBER_DESCRIPTION_PREFIX) :]
            for m in members
            if m.description and m.description.startswith(MEMBER_DESCRIPTION_PREFIX)
        ]
        return ProviderBackend(
            employee=described[0] if described and described[0] != item.name else item.name,
            id=item.id,
            serving=item.serves(),
            state=", ".join(f"weight {m.weight}" for m in members),
            details={
                "backends": [
                    {
                        "server_id": m.server_id,
                        "ip": m.server_ip,
                        "port": m.port,
                        "weight": m.weight,
                        "type": m.server_type,
                    }
                    for m in members
                ]
            },
        )
    statuses = _statuses(item)
    extra = statuses.extra_status if statuses is not None else None
    healthy = extra.healthy if isinstance(extra, Traffic) else None
    return ProviderBackend(
        employee=item.name,
        id=item.id,
        serving=item.serves(),
        state="listed" + ("" if healthy is None else ", healthy" if healthy else ", unhealthy"),
        details={"ip": statuses.ip if statuses is not None else "", "healthy": healthy},
    )
