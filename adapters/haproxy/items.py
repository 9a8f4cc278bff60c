"""The ``haproxy`` adapter's employee items: what the frame diffs, one per pod (id = pod name).

The expected side carries ``Desired``: what the pod's servers should be on every instance. The
current side carries ``Attached``: the servers of ours each instance holds for the pod (in any
backend), or that an instance could not be read (``InstanceServers.error``). A server of ours
whose pod is gone is a current-only item under the pod's name, which the diff deletes.

``registered()`` (the guard's question) is True while any instance holds a server of the pod,
in whatever state (a draining or maintenance server may still carry established connections),
and while an instance cannot be read: unknown never releases a pod. ``serves()`` (the readiness
gate's question) is True only when every instance reports the server up, with a weight above 0
and not draining nor in maintenance: a pod is served only when every instance serves it
(docs/haproxy.md, "Several instances").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from resourceconsist.adapter import Employee, PodEmployeeStatuses, ProviderBackend

from .runtime import ServerStat

#: What a pod's servers should be:
#: ``on``: exactly one server, ``target``, ready for traffic, on every instance;
#: ``pending``: ready, but no server can be built yet (no IP, unknown port): never equal, so the
#: pod waits without a finalizer; ``idle``: alive but not ready: servers may stay, draining;
#: ``gone``: no server at all. Observe mode (servers someone else manages): ``listed``: some
#: server of the backend at the pod's IP may route to it on every instance; ``unlisted``: none.
DesiredState = Literal["on", "pending", "idle", "gone", "listed", "unlisted"]


@dataclass(frozen=True)
class Target:
    """The server a ready pod should have."""

    backend: str
    server: str
    ip: str
    port: int
    weight: int
    options: tuple[str, ...]
    checked: bool

    def matches(self, server: ServerStat) -> bool:
        """``server`` is this target (backend, name, address), whatever its state."""
        host, port = server.host_port
        return (
            server.backend == self.backend
            and server.name == self.server
            and host == self.ip
            and port == self.port
        )


@dataclass(frozen=True)
class Desired:
    """The expected ``extra_status``."""

    state: DesiredState
    target: Target | None = None
    #: Why a ready pod is ``pending`` (for logs).
    reason: str = ""
    #: Set on an item this pass added or let take traffic: HAProxy has not yet said it is up,
    #: so it does not serve until a later pass reads it up.
    health_pending: bool = False

    def satisfied_by(self, attached: Attached) -> bool:
        if attached.unknown:
            return False
        if self.state == "on":
            target = self.target
            return target is not None and all(
                len(found.servers) == 1
                and target.matches(found.servers[0])
                and not found.servers[0].maintenance
                and not found.servers[0].draining
                and found.servers[0].weight == target.weight
                for found in attached.instances
            )
        if self.state == "idle":
            return all(s.maintenance or s.draining for s in attached.servers)
        if self.state == "gone":
            return not attached.servers
        if self.state == "listed":
            return all(any(_may_route(s) for s in found.servers) for found in attached.instances)
        if self.state == "unlisted":
            return not attached.routing
        return False


@dataclass(frozen=True)
class InstanceServers:
    """What one instance holds for one pod: its servers of ours, or why it could not be read."""

    instance: str
    servers: tuple[ServerStat, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Attached:
    """The current ``extra_status``: per instance, the servers of ours for the pod (observe mode:
    the backend's servers at the pod's IP, ``observed``)."""

    instances: tuple[InstanceServers, ...] = ()
    observed: bool = False

    @property
    def unknown(self) -> bool:
        """Some instance could not be read."""
        return any(found.error for found in self.instances)

    @property
    def servers(self) -> tuple[ServerStat, ...]:
        return tuple(s for found in self.instances for s in found.servers)

    @property
    def routing(self) -> tuple[ServerStat, ...]:
        """The servers that may route to the pod: every server of ours, whatever its state (a
        draining or maintenance server of ours is on its way out and still ours to remove); in
        observe mode those not in maintenance with no session and no queue (someone else took
        them out, and nothing is in flight)."""
        if not self.observed:
            return self.servers
        return tuple(s for s in self.servers if _may_route(s))

    def serving(self) -> bool:
        """Every instance (and at least one) has a server of the pod that HAProxy sends new
        traffic to: up, a weight above 0, and a health check that has spoken if it runs."""
        return (
            bool(self.instances)
            and not self.unknown
            and all(any(_takes_traffic(s) for s in found.servers) for found in self.instances)
        )


def _may_route(server: ServerStat) -> bool:
    return not server.maintenance or server.sessions > 0 or server.queued > 0


def _takes_traffic(server: ServerStat) -> bool:
    return server.up and server.weight > 0 and not (server.checked and server.check_status == "INI")


def _statuses(item: Employee) -> PodEmployeeStatuses | None:
    return item.statuses if isinstance(item.statuses, PodEmployeeStatuses) else None


class ServerEmployee(Employee):
    """A pod (or a server of ours whose pod is gone), on both sides."""

    def equal(self, other: Employee) -> bool:
        desired = self.desired
        attached = other.attached if isinstance(other, ServerEmployee) else None
        return desired is not None and attached is not None and desired.satisfied_by(attached)

    def registered(self) -> bool:
        """Expected: servers should stay or be added (``on``, ``idle``), or be listed (observe);
        current: some instance holds a server that may route to the pod (``Attached.routing``),
        or an instance could not be read."""
        desired, attached = self.desired, self.attached
        if desired is not None:
            return desired.state in ("on", "idle", "listed")
        return attached is not None and (attached.unknown or bool(attached.routing))

    def serves(self) -> bool:
        """Expected: ``on`` at a weight above 0 and not waiting for HAProxy to say it is up;
        current: every instance sends the pod new traffic (``Attached.serving``)."""
        desired, attached = self.desired, self.attached
        if desired is not None:
            target = desired.target
            return (
                desired.state == "on"
                and target is not None
                and target.weight > 0
                and not desired.health_pending
            )
        return attached is not None and attached.serving()

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

    def health_pending(self) -> ServerEmployee:
        """This expected item as a pass leaves it once it added a server or let one take traffic:
        HAProxy has not said yet that it is up."""
        statuses = _statuses(self)
        desired = self.desired
        if statuses is None or desired is None:
            return self
        pending = statuses.model_copy(update={"extra_status": replace(desired, health_pending=True)})
        return self.model_copy(update={"statuses": pending})


def server_details(server: ServerStat) -> dict[str, object]:
    """One server in HAProxy's words, for ``explain``."""
    return {
        "backend": server.backend,
        "server": server.name,
        "address": server.addr,
        "status": server.status,
        "weight": server.weight,
        "sessions": server.sessions,
        "queued": server.queued,
        "check": server.check_status or None,
    }


def provider_backend(item: Employee) -> ProviderBackend | None:
    """What the HAProxy instances hold for one current item, in HAProxy's words (``resourceconsist
    explain``); None when they hold nothing that may route to the pod."""
    attached = item.attached if isinstance(item, ServerEmployee) else None
    if attached is None or not item.registered():
        return None
    states = []
    for found in attached.instances:
        if found.error:
            states.append(f"{found.instance}: unknown ({found.error})")
        elif not found.servers:
            states.append(f"{found.instance}: none")
        else:
            states.extend(f"{found.instance}: {s.status} weight {s.weight}" for s in found.servers)
    return ProviderBackend(
        employee=item.name,
        id=item.id,
        serving=item.serves(),
        state="; ".join(states),
        details={
            found.instance: [server_details(s) for s in found.servers] if not found.error else found.error
            for found in attached.instances
        },
    )
