"""The readiness gates of one employer (docs/zero-downtime.md): which pods carry its gate, what
each gate should say from the facts the pass confirmed (``plan_gates``), and the writes of the
changed conditions (``write_gates``). The rules of one gate are resourceconsist/rules/gates.py.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from resourceconsist import wire
from resourceconsist.cluster import aiokube, kube
from resourceconsist.cluster.interfaces import EventSink, ObjectReader
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.outcome import ReconcileError
from resourceconsist.reconcile.podwriter import PodLocation, RecentWrites
from resourceconsist.rules import gates, lifecycle

log = logging.getLogger(__package__)

#: (employee name, pod, the condition it should carry).
Change = tuple[str, KubeObject, gates.GateState]

#: Seconds the provider's calls of a pass may take before the gates of the pods they register or
#: change say so (``Gatekeeper.in_flight``): a call that answers sooner leaves one gate write per
#: pod (the one after the calls), a slow one shows its pods waiting for the provider meanwhile.
IN_FLIGHT_AFTER = 1.0


@dataclass
class GateFacts:
    """What the pass confirmed that the gates follow; ``synced`` False: the employee sync did
    not run to its end, so the provider's state is unknown."""

    deleting: bool
    synced: bool = False
    #: The pods the employer employs (expected or selected); None: the pass could not tell.
    employed: set[str] | None = None
    #: The pods the provider confirmed it serves, and those whose outcome is unknown.
    serving: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    #: The provider's reason for each pod whose item it refused in this pass.
    refused: Mapping[str, str] = field(default_factory=dict)


@dataclass
class GatePlan:
    """The gate conditions to write, and when the fail-safe wants the employer looked at again."""

    changes: list[Change] = field(default_factory=list)
    recheck: float | None = None


def gated_pods(
    namespace: str, gate: str, reader: ObjectReader, members: Mapping[str, ObjectReader] | None = None
) -> list[tuple[str, KubeObject]]:
    """(employee name, pod) of the cached pods whose ``spec.readinessGates`` holds ``gate``;
    with ``members``, the pods of the member clusters (named ``pod#cluster``).

    Found by the cache's readiness-gate index, not by selector: a pod the employer stopped
    selecting keeps its gate, and must still be found; the lookup costs the gated pods, not
    the namespace's."""
    if members is not None:
        return [
            (f"{pod['metadata']['name']}{wire.MULTI_CLUSTER_SEPARATOR}{cluster}", pod)
            for cluster, member in sorted(members.items())
            for pod in member.pods_with_readiness_gate(namespace, gate)
        ]
    return [(pod["metadata"]["name"], pod) for pod in reader.pods_with_readiness_gate(namespace, gate)]


def plan_gates(
    pods: Sequence[tuple[str, KubeObject]],
    gate: str,
    *,
    employer: str,
    facts: GateFacts,
    timeout: float | None,
    now: datetime.datetime,
) -> GatePlan:
    """The condition each live gated pod should carry (``gates.decide``), where it differs."""
    plan = GatePlan()
    for name, pod in pods:
        serving: bool | None = None
        if facts.synced and name not in facts.unknown:
            serving = name in facts.serving
        decision = gates.decide(
            pod,
            gate,
            employer=employer,
            employer_deleting=facts.deleting,
            employed=None if facts.employed is None else name in facts.employed,
            serving=serving,
            timeout=timeout,
            now=now,
            refused=facts.refused.get(name),
        )
        if decision.recheck_after is not None:
            # A second more than the time left: the next pass finds the timeout run out.
            recheck = decision.recheck_after + 1.0
            plan.recheck = recheck if plan.recheck is None else min(plan.recheck, recheck)
        if decision.want is not None and not decision.want.matches(lifecycle.pod_condition(pod, gate)):
            plan.changes.append((name, pod, decision.want))
    return plan


def gone_employer_changes(pods: Sequence[tuple[str, KubeObject]], gate: str, who: str) -> list[Change]:
    """The employer is gone: its gate goes True on every pod still waiting on it, so no pod
    stays un-Ready for ever (docs/zero-downtime.md)."""
    want = gates.GateState(True, wire.GateReason.EMPLOYER_DELETED, f"{who} is deleted")
    return [
        (n, pod, want)
        for n, pod in pods
        if not lifecycle.is_deleting(pod)
        and (lifecycle.pod_condition(pod, gate) or {}).get("status") != "True"
    ]


async def write_gates(
    namespace: str,
    gate: str,
    changes: Sequence[Change],
    now: datetime.datetime,
    *,
    locate: Callable[[str], PodLocation],
    recorder: EventSink,
    controller: str,
    recent: RecentWrites,
    by: str = "",
) -> dict[str, BaseException]:
    """Write each changed gate condition (status subresource), on the event loop's transport
    (resourceconsist.cluster.aiokube); the failures by pod. Each answer is noted in ``recent``,
    so a pass that starts before its watch event reaches the cache does not write the same
    condition again, and, with ``by`` (the writing employer's queue key), so that the write's
    echo queues no pass of that employer: no verdict reads the frame's gates
    (podwriter.RecentWrites; docs/concepts.md, "A write's echo")."""
    limit = asyncio.Semaphore(8)
    failures: dict[str, BaseException] = {}

    async def one(name: str, pod: KubeObject, want: gates.GateState) -> None:
        where = locate(name)
        body = gates.condition_patch(pod, gate, want, now)
        async with limit:
            cached = where.reader.get(kube.POD, namespace, where.name)
            with recent.writing(where.reader, namespace, where.name):
                try:
                    answer = await aiokube.patch(
                        where.client,
                        kube.POD,
                        namespace,
                        where.name,
                        body,
                        patch_type="strategic",
                        subresource="status",
                    )
                except kube.NotFound:
                    return  # the pod is gone: nothing left to gate
                except Exception as err:
                    failures[name] = err
                    return
                recent.wrote(where.reader, namespace, where.name, cached, pod, answer, by=by)
        log.info(
            "%s: pod %s: readiness gate %s %s (%s)",
            *(controller, name, gate, want.status, want.reason),
            extra={"pod": name},
        )
        if want.reason is wire.GateReason.TIMEOUT:
            await recorder.event(
                {**pod, "apiVersion": "v1", "kind": "Pod"}, "Warning", want.reason, want.message
            )

    await asyncio.gather(*(one(n, pod, want) for n, pod, want in changes))
    return failures


async def employed_pods(
    synced: bool,
    expected: set[str],
    selected: Callable[[], Awaitable[Sequence[str]]],
    *,
    controller: str,
    key: str,
) -> set[str] | None:
    """The pods this employer employs: those the adapter expects to hold (``expected``), and
    those it selects; None when the pass could not tell.

    The selection is read afresh, after the caller listed the gated pods: a pod created
    during the pass is in the cache by then, so it is never taken for one the employer
    stopped selecting (which would open its gate before the provider serves it)."""
    if not synced:
        return None
    try:
        names = await selected()
    except Exception as err:
        log.info("%s %s: readiness gates: selected pods unknown: %s", controller, key, err)
        return None
    return expected | set(names)


@dataclass(frozen=True)
class GateOutcome:
    """What updating one employer's gates left: when the fail-safe wants the employer looked at
    again, and the writes that failed, by pod."""

    recheck: float | None = None
    failures: dict[str, BaseException] = field(default_factory=dict)

    async def raise_failures(self, failures: PassFailures) -> None:
        """The pass's error for the gate writes that failed, if any (a Warning Event)."""
        if self.failures:
            name, err = sorted(self.failures.items())[0]
            raise await failures.fail(
                wire.EventReason.UPDATE_READINESS_GATES_FAILED,
                f"update readiness gates failed: pod {name}: {err}"
                + (f" (and {len(self.failures) - 1} more pods)" if len(self.failures) > 1 else ""),
            )


@dataclass(frozen=True)
class Gatekeeper:
    """Where one reconciler reads and writes its employers' readiness gates: the gated pods of
    a namespace, where each pod lives, the Events, and the names its messages use."""

    controller: str
    #: The employers' kind, for a stand-in or gone employer that carries none.
    employer_kind: str
    gated: Callable[[str, str], Sequence[tuple[str, KubeObject]]]
    locate: Callable[[str], PodLocation]
    recorder: EventSink
    #: This reconciler's recent pod writes: the gates' answers are noted there too.
    recent: RecentWrites

    async def update(
        self,
        employer: KubeObject,
        key: str,
        *,
        confirmed: GateFacts,
        expected: set[str],
        selected: Callable[[], Awaitable[Sequence[str]]],
    ) -> GateOutcome:
        """Set this employer's readiness gate on every live pod that carries it: True once the
        provider confirmed it serves the pod, False while it does not, True when the employer is
        deleting or no longer employs the pod, and True after the employer's fail-safe timeout
        (with a Warning Event on the pod). Only changed conditions are written.

        ``confirmed``: what the pass confirmed, but whom the employer employs: the names the
        provider is expected to hold (``expected``) and those it ``selected`` (read afresh)."""
        meta = employer["metadata"]
        namespace = str(meta.get("namespace") or "")
        gate = lifecycle.readiness_gate(meta["name"])
        pods = [(n, pod) for n, pod in self.gated(namespace, gate) if not lifecycle.is_deleting(pod)]
        if not pods:
            return GateOutcome()
        try:
            timeout = None if confirmed.deleting else gates.gate_timeout(employer)
        except gates.InvalidAnnotation as err:
            await self.recorder.event(
                employer,
                "Warning",
                wire.EventReason.UPDATE_READINESS_GATES_FAILED,
                f"{err}; the fail-safe is off",
            )
            timeout = None
        employed = await employed_pods(
            confirmed.synced, expected, selected, controller=self.controller, key=key
        )
        facts = replace(confirmed, employed=employed)
        now = datetime.datetime.now(datetime.UTC)
        who = f"{employer.get('kind') or self.employer_kind} {kube.object_key(employer)}"
        plan = plan_gates(pods, gate, employer=who, facts=facts, timeout=timeout, now=now)
        failures = await self.write(namespace, gate, plan.changes, now, by=str(key))
        return GateOutcome(plan.recheck, failures)

    async def in_flight(
        self, employer: KubeObject, key: str, created: Collection[str], changed: Collection[str]
    ) -> dict[str, BaseException]:
        """The provider is being asked to serve these pods, and its calls are still running:
        a registration (``created``) or a change of a backend it holds (``changed``, e.g. traffic
        turned on). A live gated pod whose containers are ready says so, ``ProviderNotServing``
        (waiting for the registration, or not served yet), instead of the ``ContainersNotReady``
        it may carry from before (docs/zero-downtime.md). One write per pod and change: a
        condition that says it already is left alone, and the gates after the calls write only
        what changed."""
        meta = employer["metadata"]
        namespace = str(meta.get("namespace") or "")
        gate = lifecycle.readiness_gate(meta["name"])
        who = f"{employer.get('kind') or self.employer_kind} {kube.object_key(employer)}"
        wants = {True: gates.registering(who), False: gates.not_serving_yet(who)}
        changes: list[Change] = []
        for name, pod in self.gated(namespace, gate):
            if name not in created and name not in changed:
                continue
            if lifecycle.is_deleting(pod) or not lifecycle.is_lifecycle_ready(pod):
                continue
            want = wants[name in created]
            condition = lifecycle.pod_condition(pod, gate)
            if (condition or {}).get("status") == "True" or want.matches(condition):
                continue
            changes.append((name, pod, want))
        if not changes:
            return {}
        return await self.write(namespace, gate, changes, datetime.datetime.now(datetime.UTC), by=str(key))

    async def write(
        self, namespace: str, gate: str, changes: Sequence[Change], now: datetime.datetime, *, by: str = ""
    ) -> dict[str, BaseException]:
        """Write each changed gate condition (``write_gates``; ``by``: the writing employer's
        queue key, or "" when its echo is news to all); the failures by pod."""
        return await write_gates(
            namespace,
            gate,
            changes,
            now,
            locate=self.locate,
            recorder=self.recorder,
            controller=self.controller,
            recent=self.recent,
            by=by,
        )

    async def release_gone(self, namespace: str, name: str) -> None:
        """The employer is gone: its gate goes True on every pod still waiting on it, so no pod
        stays un-Ready for ever (docs/zero-downtime.md)."""
        gate = lifecycle.readiness_gate(name)
        who = f"{self.employer_kind} {namespace}/{name}"
        changes = gone_employer_changes(self.gated(namespace, gate), gate, who)
        failures = await self.write(namespace, gate, changes, datetime.datetime.now(datetime.UTC))
        if failures:
            pod, err = sorted(failures.items())[0]
            raise ReconcileError(
                wire.EventReason.UPDATE_READINESS_GATES_FAILED,
                f"update readiness gates of deleted {namespace}/{name} failed: pod {pod}: {err}",
            )
