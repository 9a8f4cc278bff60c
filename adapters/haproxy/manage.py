"""One pass of one Service: ``ServicePass`` reads every instance once, plans one item per pod
(``plan``), and brings each pod's servers to what it should be on every instance (``converge``).

A ready pod's server is added in maintenance with its health check (``add server ... check``,
``enable health``) and let take traffic (``set server ... state ready``) only once that check has
passed while in maintenance: HAProxy 2.6 marks a server that leaves maintenance up at once,
whatever its check says, so enabling it earlier could send requests to a pod that does not answer.
A leaving pod's server is drained (``state drain``: no new traffic, established connections go
on), then, once it has no session left on the instance or the Service's drain time is over (its
sessions then shut down), put in maintenance and deleted. Its pod is released only when no
instance holds a server of it any more. An instance that cannot be read or written leaves the
pods it concerns as they are (guarded, not served) and is tried again; the others go on, so a
leaving pod is drained wherever HAProxy answers. Drain clocks live in the per-Service
``ctx.memo``. docs/haproxy.md, "Servers".
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from resourceconsist.adapter import (
    Employee,
    Outcome,
    PodEmployeeStatuses,
    ReconcileContext,
    pod_employee_statuses,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle

from .. import podbackend
from . import config
from .config import HAProxyConfigError
from .items import Attached, Desired, InstanceServers, ServerEmployee, Target
from .runtime import RuntimeAPI, RuntimeAPIError, RuntimeAPIRefused, RuntimeAPIUnavailable, ServerStat, Stat

log = logging.getLogger("resourceconsist.adapters.haproxy")

#: How soon a pass looks again while a server waits for HAProxy's health check, or a gated pod's
#: server is not up yet: no Kubernetes event announces a check that passes.
HEALTH_POLL_SECONDS: Final = 0.5
#: How soon a pass looks again at a draining server: its drain ends as soon as its last session does.
DRAIN_POLL_SECONDS: Final = 0.5
#: Where the drain clocks live in the frame's per-Service ``ctx.memo``.
_DRAIN_KEY: Final = "haproxy.drain_since"


@dataclass(frozen=True)
class Tools:
    """What a pass borrows from its adapter."""

    instances: tuple[RuntimeAPI, ...]
    #: The controller name, which starts every log line.
    name: str
    clock: Callable[[], float]


#: One write to one instance: what it does (for logs), and the call.
Step = tuple[str, Callable[[RuntimeAPI], None]]


@dataclass
class Chain:
    """Writes for one server of one item on one instance, in order; the first failure ends it."""

    item: str
    instance: str
    server: str
    steps: list[Step]
    #: Takes traffic away (drain, maintenance, delete): sent before any registration.
    removal: bool
    #: Run once every step succeeded.
    written: Callable[[], None] | None = None
    #: How it ended: None (not run or succeeded), or the failure.
    failure: RuntimeAPIError | None = None


def _pod_name(obj: KubeObject) -> str:
    return str(obj["metadata"]["name"])


@dataclass(eq=False)
class ServicePass:
    """One pass of one Service: its settings, what the instances hold, what it writes."""

    tools: Tools = field(repr=False)
    ctx: ReconcileContext = field(repr=False)
    service: KubeObject = field(repr=False)
    error: HAProxyConfigError | None = None
    namespace: str = field(init=False)
    name: str = field(init=False)
    deleting: bool = field(init=False)
    finalizer: str = field(init=False)
    guard: str = field(init=False)
    backend: str = field(default="", init=False)
    options: tuple[str, ...] = field(default=config.DEFAULT_OPTIONS, init=False)
    drain_seconds: float = field(default=config.DEFAULT_DRAIN_SECONDS, init=False)
    #: Observe mode: the backend's servers are someone else's; the pass reads and never writes.
    observe: bool = field(default=False, init=False)
    #: Per instance: what ``show stat`` said, or why it could not be read.
    stats: dict[str, Stat | RuntimeAPIError] | None = field(default=None, init=False)
    expected: list[Employee] | None = field(default=None, init=False)
    current: list[Employee] | None = field(default=None, init=False)
    #: Per pod (item id): the servers of ours each instance holds for it.
    attached: dict[str, Attached] = field(default_factory=dict, init=False)
    #: Seconds until the earliest drain ends, when a server waits for one.
    drain_due: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        meta = self.service["metadata"]
        self.namespace = str(meta.get("namespace") or "")
        self.name = str(meta["name"])
        self.deleting = lifecycle.is_deleting(self.service)
        self.finalizer = lifecycle.lifecycle_finalizer(self.name)
        self.guard = lifecycle.guard_finalizer(self.name)
        try:
            self.observe = config.observed(self.service)
            self.drain_seconds = config.drain_seconds(self.service)
            self.backend = config.checked_backend(self.service)
            self.options = config.server_options(self.service)
            if not self.backend and not self.deleting:
                raise HAProxyConfigError(
                    f"Service {self.ctx.employer_key} has no {config.BACKEND_ANNOTATION} annotation "
                    "naming its backend"
                )
        except HAProxyConfigError as err:
            # A deleting Service's servers go whatever its annotations say.
            if not self.deleting:
                self.error = err

    def checked(self) -> ServicePass:
        if self.error is not None:
            raise self.error
        return self

    def log(self, level: int, message: str, *args: Any) -> None:
        log.log(level, "%s %s: " + message, self.tools.name, self.ctx.employer_key, *args)

    # -- reading ---------------------------------------------------------------------------------------

    async def read(self) -> dict[str, Stat | RuntimeAPIError]:
        """Every instance's ``show stat``, once per pass, read side by side."""
        if self.stats is None:
            self.stats = await read_instances(self.tools.instances)
            for instance, found in self.stats.items():
                if isinstance(found, RuntimeAPIError):
                    self.log(logging.WARNING, "HAProxy %s not read: %s", instance, found.message)
        return self.stats

    def ours(self, stats: dict[str, Stat | RuntimeAPIError]) -> dict[str, dict[str, list[ServerStat]]]:
        """The servers named for this Service, by pod, then by instance."""
        found: dict[str, dict[str, list[ServerStat]]] = {}
        for instance, stat in stats.items():
            if isinstance(stat, RuntimeAPIError):
                continue
            for server in stat.servers:
                owner = config.owner_of(server.name)
                if owner is not None and (owner.namespace, owner.service) == (self.namespace, self.name):
                    found.setdefault(owner.pod, {}).setdefault(instance, []).append(server)
        return found

    def listed(
        self, stats: dict[str, Stat | RuntimeAPIError], pods: dict[str, KubeObject]
    ) -> dict[str, dict[str, list[ServerStat]]]:
        """Observe mode: the backend's servers at each pod's IP, by pod, then by instance."""
        by_ip = {ip: name for name, pod in pods.items() if (ip := podbackend.pod_ip(pod))}
        found: dict[str, dict[str, list[ServerStat]]] = {}
        for instance, stat in stats.items():
            if isinstance(stat, RuntimeAPIError):
                continue
            for server in stat.servers:
                name = by_ip.get(server.host_port[0]) if server.backend == self.backend else None
                if name is not None:
                    found.setdefault(name, {}).setdefault(instance, []).append(server)
        return found

    # -- planning --------------------------------------------------------------------------------------

    async def plan(self) -> None:
        """Expected and current items for every pod that matters, from one read of each instance.

        Pods that matter: the selected ones, the ones holding this Service's finalizers, and the
        ones a server of ours names (its pod may be gone: a current-only item, which the diff
        deletes). Each appears on both sides under its name while its pod exists.
        """
        if self.current is not None:
            return
        stats = await self.read()
        reader = self.ctx.reader
        selected_pods = [] if self.deleting else reader.pods_selected_by(self.service)
        selected = {_pod_name(p) for p in selected_pods}
        pods = {_pod_name(p): p for p in selected_pods}
        for finalizer in (self.finalizer, self.guard):
            for pod in reader.pods_with_finalizer(self.namespace, finalizer):
                pods.setdefault(_pod_name(pod), pod)
        mine = self.listed(stats, pods) if self.observe else self.ours(stats)
        for name in mine:
            found_pod = None if name in pods else reader.get(kube.POD, self.namespace, name)
            if found_pod is not None:
                pods[name] = found_pod
        gate = lifecycle.readiness_gate(self.name)
        expected: list[Employee] = []
        current: list[Employee] = []
        for name in sorted(set(pods) | set(mine)):
            servers = mine.get(name, {})
            attached = Attached(
                tuple(
                    InstanceServers(instance, error=found.message)
                    if isinstance(found, RuntimeAPIError)
                    else InstanceServers(instance, tuple(servers.get(instance, ())))
                    for instance, found in stats.items()
                ),
                observed=self.observe,
            )
            self.attached[name] = attached
            known = pods.get(name)
            if known is None:
                statuses = PodEmployeeStatuses(extra_status=attached)
                current.append(ServerEmployee(id=name, name=name, statuses=statuses))
                continue
            item = None
            if not self.deleting:
                item = self._expected_item(known, name in selected)
                expected.append(item)
            base = pod_employee_statuses(known)
            base.extra_status = attached
            current.append(ServerEmployee(id=name, name=name, statuses=base))
            desired = item.desired if isinstance(item, ServerEmployee) else None
            if (
                desired is not None
                and desired.state == "on"
                and not attached.serving()
                and gate in lifecycle.readiness_gates(known)
            ):
                # Its gate waits on a health check no watch event will announce.
                self.ctx.look_again_in(HEALTH_POLL_SECONDS)
        self.expected, self.current = expected, current
        # Forget the drain clocks of servers that no longer exist.
        existing = {
            _clock_key(i, s) for by_instance in mine.values() for i, ss in by_instance.items() for s in ss
        }
        clocks = self._drain_clocks()
        for key in [k for k in clocks if k not in existing]:
            del clocks[key]

    def _expected_item(self, pod: KubeObject, selected: bool) -> ServerEmployee:
        name = _pod_name(pod)
        statuses = pod_employee_statuses(pod)
        desired: Desired
        if self.observe:
            # Someone else lists the pod or not; what it should be is what PodOpsLifecycle says.
            ready = selected and statuses.lifecycle_ready and not lifecycle.is_deleting(pod)
            desired = Desired(state="listed" if ready else "unlisted")
        elif not selected or lifecycle.is_deleting(pod):
            desired = Desired(state="gone")
        elif not statuses.lifecycle_ready:
            desired = Desired(state="idle")
        else:
            ip = podbackend.pod_ip(pod)
            port = config.backend_port(self.service, pod)
            if not ip:
                desired = Desired(state="pending", reason="the pod has no IP yet")
            elif port is None:
                desired = Desired(
                    state="pending",
                    reason=f"the pod declares no container port named by {config.PORT_ANNOTATION} "
                    "/ targetPort",
                )
            else:
                desired = Desired(
                    state="on",
                    target=Target(
                        backend=self.backend,
                        server=config.server_name(self.namespace, self.name, name),
                        ip=ip,
                        port=port,
                        weight=config.server_weight(self.service, pod),
                        options=self.options,
                        checked=config.health_checked(self.options),
                    ),
                )
        # The frame adds the lifecycle finalizer to updated/unchanged items whose lifecycle_ready
        # is True and takes it off when False: True exactly when the pod should be served.
        statuses.lifecycle_ready = desired.state in ("on", "listed")
        statuses.extra_status = desired
        return ServerEmployee(id=name, name=name, statuses=statuses)

    # -- writing ---------------------------------------------------------------------------------------

    async def converge(self, items: Sequence[Employee], *, leaving: bool) -> Outcome[Employee]:
        """Bring each item's servers towards what it should be on every instance; (done, not done).

        Each item gets, per instance, chains of writes (``Chain``); an instance's removals go
        before its registrations, and the instances are written side by side. An item is done
        when every instance holds what it should and no step failed; otherwise the frame keeps
        its pod's finalizers as they are and the Service is looked at again.
        """
        stats = await self.read()
        if self.observe:
            return self._observed(items, leaving=leaving)
        plan = _Plan(self, stats)
        for item in items:
            plan.item(item, leaving=leaving)
        await plan.run()
        return plan.outcome(items)

    def _observed(self, items: Sequence[Employee], *, leaving: bool) -> Outcome[Employee]:
        """Observe mode writes nothing: a leaving item is done once no server may route to its pod
        any more; the others wait for whoever manages HAProxy's servers."""
        done = [item for item in items if leaving and not item.registered()]
        waiting = [item for item in items if item not in done]
        if waiting:
            self.log(
                logging.DEBUG,
                "waiting for HAProxy's servers to follow %d pods: %s",
                len(waiting),
                ", ".join(item.id for item in waiting[:10]),
            )
        return done, waiting

    def _drain_clocks(self) -> dict[str, float]:
        """When each of the Service's servers began to drain, per instance (kept across passes)."""
        clocks: dict[str, float] = self.ctx.memo.setdefault(_DRAIN_KEY, {})
        return clocks


def _clock_key(instance: str, server: ServerStat) -> str:
    return f"{instance}|{server.backend}|{server.name}"


async def read_instances(instances: Sequence[RuntimeAPI]) -> dict[str, Stat | RuntimeAPIError]:
    """Every instance's ``show stat``, side by side; an instance that cannot be read gives its error."""
    results = await asyncio.gather(*(call_adapter(api.stat) for api in instances), return_exceptions=True)
    found: dict[str, Stat | RuntimeAPIError] = {}
    for api, result in zip(instances, results, strict=True):
        if isinstance(result, RuntimeAPIError | Stat):
            found[api.name] = result
        elif isinstance(result, BaseException):
            raise result
    return found


class _Plan:
    """The writes of one ``converge`` call, and what each item's outcome is."""

    def __init__(self, run: ServicePass, stats: dict[str, Stat | RuntimeAPIError]) -> None:
        self.run_ = run
        self.stats = stats
        self.now = run.tools.clock()
        self.clocks = run._drain_clocks()
        self.chains: list[Chain] = []
        #: Items that cannot be done in this pass whatever the writes do.
        self.waiting: set[str] = set()
        #: Items that let a server take traffic: HAProxy's word on it is for a later pass.
        self.raised: set[str] = set()

    # -- deciding ---------------------------------------------------------------------------------------

    def item(self, item: Employee, *, leaving: bool) -> None:
        attached = self.run_.attached.get(item.id)
        if attached is None and isinstance(item, ServerEmployee):
            attached = item.attached
        desired = item.desired if isinstance(item, ServerEmployee) and not leaving else None
        state = desired.state if desired is not None else "gone"
        if state == "pending" and desired is not None:
            self.run_.log(
                logging.INFO, "pod %s is ready but has no server yet: %s", item.name, desired.reason
            )
            self.waiting.add(item.id)
            return
        for api in self.run_.tools.instances:
            stat = self.stats.get(api.name)
            if not isinstance(stat, Stat):
                self.waiting.add(item.id)
                message = stat.message if stat is not None else "not read"
                self.run_.ctx.fail_item(item.id, f"HAProxy {api.name}: {message}", "Unavailable")
                continue
            servers = _servers_on(attached, api.name)
            if state == "on" and desired is not None and desired.target is not None:
                self._on(item.id, api.name, stat, desired.target, servers)
            elif state == "idle":
                for server in servers:
                    # A DOWN server's status hides a drain (``ServerStat.down``), so a pass sends
                    # it again while the checks fail: one command a pass, and the server is
                    # still drained the moment its check passes, before the pod is ready.
                    if not (server.maintenance or server.draining):
                        self._chain(item.id, api.name, server, [_drain(server)], removal=True)
            else:
                for server in servers:
                    self._retire(item.id, api.name, server)

    def _on(
        self, item: str, instance: str, stat: Stat, target: Target, servers: Sequence[ServerStat]
    ) -> None:
        if target.backend not in stat.backends:
            self.waiting.add(item)
            self.run_.ctx.fail_item(
                item,
                f"HAProxy {instance}: backend {target.backend!r} does not exist; declare it in HAProxy's "
                "configuration with a dynamic balance algorithm (roundrobin, leastconn, random, first)",
                "NoSuchBackend",
            )
            return
        matching = [s for s in servers if target.matches(s)]
        stale = [s for s in servers if not target.matches(s)]
        # A server of the same name at another address (a pod re-created under the name) must go
        # before the new one can be added; others (another backend) stay until the new one is up.
        blocking = [s for s in stale if s.backend == target.backend and s.name == target.server]
        if not matching:
            self.waiting.add(item)
            if blocking:
                for server in blocking:
                    self._retire(item, instance, server)
                return
            steps: list[Step] = [
                (
                    f"add server {target.backend}/{target.server} {target.ip}:{target.port}",
                    functools.partial(_add, target),
                )
            ]
            if target.checked:
                steps.append(("enable health", functools.partial(_call, "enable_health", target)))
            else:
                steps.append(("set state ready", functools.partial(_call, "ready", target)))
                self.waiting.discard(item)
                self.raised.add(item)
            self._chain_target(item, instance, target, steps)
            return
        server = matching[0]
        steps = []
        if server.weight != target.weight:
            steps.append((f"set weight {target.weight}", functools.partial(_weight, target)))
            if server.weight == 0:
                self.raised.add(item)
        if server.maintenance:
            if target.checked and not server.checked:
                steps.append(("enable health", functools.partial(_call, "enable_health", target)))
                self.waiting.add(item)
            elif target.checked and not server.check_passed:
                self.waiting.add(item)  # its health check has not passed yet: no traffic for it
                self.run_.ctx.look_again_in(HEALTH_POLL_SECONDS)
            else:
                steps.append(("set state ready", functools.partial(_call, "ready", target)))
                self.raised.add(item)
        elif server.draining:
            steps.append(("set state ready", functools.partial(_call, "ready", target)))
            self.raised.add(item)
        if steps:
            self._chain_target(item, instance, target, steps)
        others = [s for s in stale if s not in blocking]
        if blocking or (others and not (server.up and not server.maintenance and not server.draining)):
            self.waiting.add(item)  # the old ones stay until the new one takes traffic
        for old in blocking:
            self._retire(item, instance, old)
        if server.up and not server.maintenance and not server.draining:
            for old in others:
                self._retire(item, instance, old)

    def _retire(self, item: str, instance: str, server: ServerStat) -> None:
        """Drain the server, then, once it has no session (or its drain time is over), take it out
        of traffic and delete it; its item is not done until it is gone. A server HAProxy's
        checks found down takes no new traffic already: it is not drained first (its status would
        stay ``DOWN``), only waited on while it has sessions."""
        key = _clock_key(instance, server)
        if not (server.maintenance or server.draining or server.down):
            self.waiting.add(item)

            def started() -> None:
                self.clocks[key] = self.now

            self._chain(item, instance, server, [_drain(server)], removal=True, written=started)
            self.run_.ctx.look_again_in(DRAIN_POLL_SECONDS)
            return
        since = self.clocks.setdefault(key, self.now)
        left = since + self.run_.drain_seconds - self.now
        quiet = server.sessions == 0 and server.queued == 0
        if not quiet and left > 0:
            self.waiting.add(item)
            due = self.run_.drain_due
            self.run_.drain_due = left if due is None else min(due, left)
            self.run_.ctx.look_again_in(min(left, DRAIN_POLL_SECONDS))
            return
        steps: list[Step] = []
        if not server.maintenance:
            steps.append(("set state maint", functools.partial(_set, server, "maint")))
        if not quiet:
            steps.append(("shutdown sessions", functools.partial(_shutdown, server)))
        steps.append((f"del server {server.backend}/{server.name}", functools.partial(_delete, server)))

        def deleted() -> None:
            self.clocks.pop(key, None)

        self._chain(item, instance, server, steps, removal=True, written=deleted)

    def _chain(
        self,
        item: str,
        instance: str,
        server: ServerStat,
        steps: list[Step],
        *,
        removal: bool,
        written: Callable[[], None] | None = None,
    ) -> None:
        self.chains.append(Chain(item, instance, f"{server.backend}/{server.name}", steps, removal, written))

    def _chain_target(self, item: str, instance: str, target: Target, steps: list[Step]) -> None:
        server = f"{target.backend}/{target.server}"
        self.chains.append(Chain(item, instance, server, steps, removal=False))

    # -- writing ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        by_instance: dict[str, list[Chain]] = {}
        for chain in self.chains:
            by_instance.setdefault(chain.instance, []).append(chain)
        apis = {api.name: api for api in self.run_.tools.instances}
        await asyncio.gather(
            *(
                call_adapter(functools.partial(_run_chains, apis[name], chains, self.run_.log))
                for name, chains in by_instance.items()
            )
        )
        for chain in self.chains:
            if chain.failure is None:
                if chain.written is not None:
                    chain.written()
                continue
            self.waiting.add(chain.item)
            failure = chain.failure
            if isinstance(failure, RuntimeAPIRefused):
                if failure.reason.transient:
                    continue  # not done yet: the next pass reads the instance again
                self.run_.ctx.fail_item(
                    chain.item,
                    f"HAProxy {failure.address}: {failure.command}: {failure.message}",
                    failure.reason.value,
                )
            else:
                self.run_.ctx.fail_item(
                    chain.item, f"HAProxy {failure.address}: {failure.message}", "Unavailable"
                )

    def outcome(self, items: Sequence[Employee]) -> Outcome[Employee]:
        done: list[Employee] = []
        not_done: list[Employee] = []
        for item in items:
            if item.id in self.waiting:
                not_done.append(item)
            elif item.id in self.raised and isinstance(item, ServerEmployee):
                done.append(item.health_pending())
            else:
                done.append(item)
        if self.raised - self.waiting:
            self.run_.ctx.look_again_in(HEALTH_POLL_SECONDS)
        return done, not_done


def _servers_on(attached: Attached | None, instance: str) -> tuple[ServerStat, ...]:
    if attached is None:
        return ()
    return next((found.servers for found in attached.instances if found.instance == instance), ())


def _run_chains(api: RuntimeAPI, chains: list[Chain], say: Callable[..., None]) -> None:
    """One instance's chains, removals first; each stops at its first failure (runs in a thread)."""
    for chain in sorted(chains, key=lambda c: 0 if c.removal else 1):
        for what, step in chain.steps:
            try:
                step(api)
            except RuntimeAPIRefused as err:
                if (
                    chain.removal
                    and err.command.startswith(("del server", "set server", "shutdown"))
                    and (err.reason.value == "NoSuchServer")
                ):
                    break  # already gone (a reloaded HAProxy): nothing left to take away
                chain.failure = err
                say(
                    logging.INFO, "HAProxy %s refused %s of %s: %s", api.name, what, chain.server, err.message
                )
                break
            except RuntimeAPIUnavailable as err:
                chain.failure = err
                say(
                    logging.INFO,
                    "HAProxy %s: %s of %s not done: %s",
                    api.name,
                    what,
                    chain.server,
                    err.message,
                )
                break
            say(logging.INFO, "HAProxy %s: %s (%s)", api.name, what, chain.server)


def _add(target: Target, api: RuntimeAPI) -> None:
    options = [o for o in target.options if o != "no-check"]
    options.append(f"weight {target.weight}")
    api.add_server(target.backend, target.server, _address(target), " ".join(options).split())


def _address(target: Target) -> str:
    from .runtime import server_address

    return server_address(target.ip, target.port)


def _call(what: str, target: Target, api: RuntimeAPI) -> None:
    if what == "enable_health":
        api.enable_health(target.backend, target.server)
    else:
        api.set_state(target.backend, target.server, "ready")


def _weight(target: Target, api: RuntimeAPI) -> None:
    api.set_weight(target.backend, target.server, target.weight)


def _drain(server: ServerStat) -> Step:
    return ("set state drain", functools.partial(_set, server, "drain"))


def _set(server: ServerStat, state: str, api: RuntimeAPI) -> None:
    if state == "drain":
        api.set_state(server.backend, server.name, "drain")
    else:
        api.set_state(server.backend, server.name, "maint")


def _shutdown(server: ServerStat, api: RuntimeAPI) -> None:
    api.shutdown_sessions(server.backend, server.name)


def _delete(server: ServerStat, api: RuntimeAPI) -> None:
    api.del_server(server.backend, server.name)
