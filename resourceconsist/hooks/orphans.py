"""The garbage pass: provider items and cluster-scoped sub-resources whose owner employer is gone
(docs/lifecycle-hooks.md, "Orphans" and "Sub-resources").

A Service deleted while the controller was down and stripped of its finalizers by hand leaves
what the provider holds for it behind for ever; the adapter's ``list_owned`` names each item's
owner, and this pass collects the items of owners that no longer exist. It deletes nothing
itself: each gone owner gets one reconcile pass over a deleting stand-in of it, so the
adapter's own ``get_current_*`` and ``delete_*`` do the work and the frame's guard releases
the pods only once the provider confirmed (docs/concepts.md, "The guard").

Against a re-created employer of the same name: the owner key is claimed in the controller's
workqueue first (skipped when a pass is queued or running), then looked up in the cache and
with a live GET; while the claim is held, the employer's own events wait in the queue, so its
next pass runs after the collection and re-creates what it needs.

Every adapter, listing or not: the pods say which employers they belonged to (their entries and
the hash their guard and lifecycle finalizers carry; resourceconsist/rules/marks.py), so an employer
gone while its marks remain is found too (docs/lifecycle-hooks.md, "Gone employers"). Its pods
are released only through a stand-in pass, when the adapter's ``list_owned`` answered and either
named items of it or is complete (``CompleteListingOptions``); when the adapter cannot list, its
listing failed or may be partial, or only the hash is left, nothing is released and
the operator is told once per pod and employer: a Warning Event on the pod and on the Namespace
with the ``kubectl`` command that releases the pod by hand, the
``resourceconsist_pods_held_by_gone_employers`` gauge, and ``resourceconsist explain pod``.

A lookup the install may not make (403: a namespaced install, a narrowed role) says nothing of
whether the employer exists: that employer is unknown, never gone, and waits (a log line and a
Warning Event on its Namespace name the permission missing) while the others go on
(docs/security.md, "A namespaced install").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from resourceconsist.adapter import OwnedItem
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheNotSynced
from resourceconsist.cluster.events import MAX_MESSAGE
from resourceconsist.cluster.kube import EmployerKey, KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.hooks.handle import ControllerHandle
from resourceconsist.hooks.subresources import (
    OWNER_ANNOTATION,
    OWNER_CONTROLLER_LABEL,
    OWNER_UID_LABEL,
    cluster_scoped_kinds,
    label_value,
)
from resourceconsist.options import GarbageOptions
from resourceconsist.rules import marks
from resourceconsist.rules.marks import Hold

log = logging.getLogger(__name__)

#: The reason of the Event recorded (on the owner's Namespace) per collected owner.
COLLECTED_REASON = "OrphanCollected"
#: Why an owner is skipped while a pass of it is queued or running (tried again soon).
BUSY = "a pass is queued or running"
#: The reason of the Warning Events (on the pod, and on its Namespace) about a pod held by a
#: gone employer that the controller cannot collect (docs/lifecycle-hooks.md, "Gone employers").
HELD_BY_GONE_REASON = "HeldByGoneEmployer"
#: Why a gone employer's pods wait for a person, by cause.
CANNOT_LIST = "its adapter cannot list what the provider holds (no OrphanCollectOptions.list_owned)"
NOT_COMPLETE = (
    "its adapter lists nothing of it, but its list may be partial (no CompleteListingOptions), "
    "so the provider may still route to the pods"
)
NAME_UNKNOWN = "only the hash of its name is left on the pod: no entry, readiness gate or Event names it"
#: The reason of the Warning Event (on the Namespace) about a gone-looking employer whose live
#: lookup was refused (403): unknown, never gone.
LOOKUP_REFUSED_REASON = "EmployerLookupRefused"


@dataclass
class GarbageReport:
    """What one garbage pass found and did; owners are employer keys (``namespace/name``)."""

    dry_run: bool = False
    #: Items whose owner is gone, by owner (in dry-run: what would be collected).
    orphans: dict[str, list[str]] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    #: Owners whose collection is under way (the provider still holds something).
    pending: list[str] = field(default_factory=list)
    #: Owners left alone this time, and why (a pass queued or running, found alive by a live GET).
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Cluster-scoped sub-resources (``kind/name``) whose owner is gone.
    strays: list[str] = field(default_factory=list)
    #: Gone employers found from the marks their pods still carry, and those pods' names
    #: (an employer known only by its hash: ``namespace/#<hash>``).
    held: dict[str, list[str]] = field(default_factory=dict)
    #: Gone employers whose pods wait for a person, and why (the operator was told).
    uncollectable: dict[str, str] = field(default_factory=dict)
    #: The adapter's ``list_owned`` failed this pass (its error); nothing was released.
    list_error: str | None = None
    #: Owners whose live lookup was refused (403), and the API server's words: unknown, never
    #: gone; nothing of theirs was touched.
    unknown: dict[str, str] = field(default_factory=dict)


def stand_in(resource: kube.Resource, key: EmployerKey, item: OwnedItem) -> KubeObject:
    """A deleting copy of the gone employer ``key``, carrying what ``item`` says it had."""
    namespace = key.namespace
    meta: dict[str, object] = {
        "name": key.name,
        "labels": dict(item.labels),
        "annotations": dict(item.annotations),
        "deletionTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "finalizers": [],
    }
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}


class GarbageCollector:
    """One controller's garbage pass, and its loop; it sees the controller through its handle."""

    def __init__(self, controller: ControllerHandle, options: GarbageOptions) -> None:
        self.controller = controller
        self.options = options
        self.last_report: GarbageReport | None = None
        self.passes = 0
        #: (pod key, employer) pairs and (namespace, employer) pairs the operator was told about:
        #: once each per controller lifetime (forgotten once the employer's marks are gone).
        self._told: set[tuple[str, str]] = set()
        #: Owners whose refused lookup (403) the operator was told about, with the refusal: told
        #: again only when it changes, forgotten once a lookup answers.
        self._refused: dict[str, str] = {}

    @property
    def wanted(self) -> bool:
        profile = self.controller.profile
        return self.options.enabled and (
            profile.orphans is not None
            or bool(cluster_scoped_kinds(profile))
            or self.controller.follows_lifecycle
        )

    async def run(self) -> None:
        """Run a pass now, then every ``interval`` (sooner while a collection is pending)."""
        while True:
            try:
                report = await self.run_once()
                delay = self.options.interval
                busy = BUSY in report.skipped.values()
                if report.pending or report.failed or busy or report.list_error:
                    delay = min(delay or self.options.retry, self.options.retry)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: garbage pass failed", self.controller.name)
                delay = self.options.retry
            if delay is None:
                return
            await asyncio.sleep(delay)

    async def run_once(self) -> GarbageReport:
        controller = self.controller
        report = GarbageReport(dry_run=self.options.dry_run)
        if not controller.synced:
            # An empty cache would make every owner look gone.
            raise CacheNotSynced(f"{controller.name}: caches not synced; no garbage pass")
        adapter = controller.profile.orphans
        # None: nothing can be collected this pass (why_not says why); unknown releases nothing.
        by_owner: dict[str, list[OwnedItem]] | None = None
        why_not: str | None = CANNOT_LIST
        if adapter is not None:
            ctx = controller.context("")
            try:
                owned: list[OwnedItem] = list(await call_adapter(adapter.list_owned, ctx))
            except asyncio.CancelledError:
                raise
            except Exception as err:
                report.list_error = str(err) or type(err).__name__
                why_not = f"listing what the provider holds failed: {report.list_error}"
                log.warning("%s: garbage pass: %s", controller.name, why_not)
            else:
                why_not = None
                by_owner = {}
                for item in owned:
                    by_owner.setdefault(item.owner, []).append(item)
        # Off the event loop: a scan of the cached pods (about 0.15 s at 10k served pods) and,
        # for a hash no known name explains, a list of the namespace's Events.
        held = await asyncio.to_thread(self.gone_holds)
        for owner in sorted(set(by_owner or {}) | set(held)):
            key = EmployerKey(owner)
            if not controller.watches(key):
                continue
            holds = held.get(key, [])
            if holds and not holds[0][1].employer:
                await self._unknown_employer(key, holds, report)
            else:
                await self._one_owner(key, (by_owner or {}).get(key, []), holds, report, why_not)
        # What was told about employers whose marks are gone is forgotten: the set stays as small
        # as what is held now.
        self._told = {told for told in self._told if told[1] in held}
        still_held = {
            f"{hold.namespace}/{hold.pod}"
            for key, pods in held.items()
            if key in report.held and key not in report.collected
            for _, hold in pods
        }
        controller.report_held(len(still_held))
        await self._collect_strays(report)
        self.passes += 1
        self.last_report = report
        if report.orphans or report.strays or report.held or report.unknown:
            log.info(
                "%s: garbage pass%s: orphans of %s; pods held by gone %s; collected %s; pending %s; "
                "skipped %s; unknown (lookup refused) %s; strays %s",
                controller.name,
                " (dry run)" if report.dry_run else "",
                ", ".join(sorted(report.orphans)) or "none",
                ", ".join(sorted(report.held)) or "none",
                ", ".join(report.collected) or "none",
                ", ".join(report.pending) or "none",
                ", ".join(f"{k} ({why})" for k, why in sorted(report.skipped.items())) or "none",
                ", ".join(sorted(report.unknown)) or "none",
                ", ".join(report.strays) or "none",
            )
        return report

    async def owner_exists(self, key: EmployerKey) -> bool:
        """The employer ``key`` is in the cache or, asked live, in the API server."""
        controller = self.controller
        resource = controller.employer
        if controller.reader.get(resource, key.namespace_or_none, key.name) is not None:
            return True
        live = await asyncio.to_thread(
            controller.client.get_or_none, resource, key.namespace_or_none, key.name
        )
        return live is not None

    def gone_holds(self) -> dict[str, list[tuple[KubeObject, Hold]]]:
        """The marks (resourceconsist/rules/marks.py) that employers of this controller's kind missing
        from the cache left on cached pods, by employer key; an employer known only by its hash
        is keyed ``namespace/#<hash>``. Alive employers' marks are theirs to keep.

        Only for namespaced employers whose pods, in this cluster, follow PodOpsLifecycle: pods
        in member clusters are not in this cache."""
        controller = self.controller
        resource = controller.employer
        if not resource.namespaced or not controller.follows_lifecycle or controller.employees_in_members:
            return {}
        kind = resource.kind
        by_namespace: dict[str, list[KubeObject]] = {}
        # The cache holds the namespaces watched, and no other.
        for pod in controller.reader.list(kube.POD):
            if marks.entry_names(pod, kind) or any(
                marks.digest_of(f) for f in pod["metadata"].get("finalizers") or []
            ):
                by_namespace.setdefault(str(pod["metadata"].get("namespace") or ""), []).append(pod)
        found: dict[str, list[tuple[KubeObject, Hold]]] = {}
        for namespace, marked in sorted(by_namespace.items()):
            alive = {obj["metadata"]["name"] for obj in controller.reader.list(resource, namespace)}
            alive_digests = {marks.name_digest(name) for name in alive}
            # Steady state: every mark is a live employer's; a few lookups per pod, no parsing.
            pods = [
                pod
                for pod in marked
                if not all(name in alive for name in marks.entry_names(pod, kind))
                or not all(
                    digest is None or digest in alive_digests
                    for digest in map(marks.digest_of, pod["metadata"].get("finalizers") or [])
                )
            ]
            if not pods:
                continue
            known = alive | {name for pod in marked for name in marks.entry_names(pod, kind)}
            holds = [(pod, hold) for pod in pods for hold in marks.holds(pod, kind, known)]
            if any(not hold.employer for _, hold in holds):
                # Only a hash is left: the employer's Events may still name it.
                known |= self._names_in_events(namespace, kind)
                holds = [(pod, hold) for pod in pods for hold in marks.holds(pod, kind, known)]
            for pod, hold in holds:
                if hold.employer in alive:
                    continue
                key = hold.key or f"{namespace}/#{hold.digest}"
                found.setdefault(key, []).append((pod, hold))
        return found

    def _names_in_events(self, namespace: str, kind: str) -> set[str]:
        """Names of the objects of ``kind`` the namespace's Events are about (``marks.event_names``)."""
        try:
            events = self.controller.client.list(
                kube.EVENT, namespace, field_selector=f"involvedObject.kind={kind}"
            )
        except Exception as err:  # only a hint: the hold stays unknown
            log.info("%s: listing Events of %s failed: %s", self.controller.name, namespace, err)
            return set()
        return marks.event_names(events.get("items") or [], kind)

    async def _unknown_employer(
        self, key: EmployerKey, holds: list[tuple[KubeObject, Hold]], report: GarbageReport
    ) -> None:
        """Pods held by an employer of which only the hash is left: never released, reported."""
        report.held[key] = sorted({hold.pod for _, hold in holds})
        report.uncollectable[key] = NAME_UNKNOWN
        await self._tell_operator(key, holds, NAME_UNKNOWN)

    async def _tell_operator(self, key: EmployerKey, holds: list[tuple[KubeObject, Hold]], why: str) -> None:
        """A Warning Event on each held pod and one on the Namespace: which employer is gone, why
        the controller cannot collect it, and the command that releases a pod by hand. Each pod
        and employer once per controller lifetime (the log line too)."""
        controller = self.controller
        kind = controller.employer.kind
        recorder = controller.recorder
        namespace = key.namespace
        fresh = [(pod, hold) for pod, hold in holds if (f"{namespace}/{hold.pod}", key) not in self._told]
        for pod, hold in fresh:
            self._told.add((f"{namespace}/{hold.pod}", key))
            message = (
                f"held by gone {marks.describe(hold, kind)}, which {controller.name} cannot collect: "
                f"{why}. Once no load balancer routes to this pod any more, release it by hand: "
            )
            command = marks.release_command(pod, hold)
            if len(message) + len(command) > MAX_MESSAGE:
                # A cut command would do harm; explain prints it whole.
                command = f"the command `resourceconsist explain pod {namespace}/{hold.pod}` prints"
            await recorder.event(
                {**pod, "apiVersion": "v1", "kind": "Pod"}, "Warning", HELD_BY_GONE_REASON, message + command
            )
        if (namespace, key) in self._told or not fresh:
            return
        self._told.add((namespace, key))
        pods = sorted({hold.pod for _, hold in holds})
        who = marks.describe(holds[0][1], kind)
        log.warning(
            "%s: %d pods held by gone %s, which cannot be collected (%s); told the operator",
            controller.name,
            len(pods),
            who,
            why,
        )
        await recorder.event(
            _namespace_object(namespace),
            "Warning",
            HELD_BY_GONE_REASON,
            f"{len(pods)} pod{'' if len(pods) == 1 else 's'} held by gone {who}, which "
            f"{controller.name} cannot collect: {why}. "
            f"Pods: {', '.join(pods)}. Each pod's own Warning Event (and `resourceconsist explain pod "
            f"{namespace}/<pod>`) gives the kubectl command that releases it by hand, once no load "
            "balancer routes to it any more.",
        )

    async def _open_gates(self, key: EmployerKey) -> None:
        """The pass of a deleted employer, which its delete event would have brought: its readiness
        gate goes True on the pods still waiting on it (docs/zero-downtime.md), so a gone employer
        that cannot be collected keeps no pod un-Ready. Its finalizers stay."""
        controller = self.controller
        try:
            await controller.run_pass(key)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.warning("%s: opening the readiness gates of gone %s failed: %s", controller.name, key, err)

    def _unlisted_why_not(self, key: EmployerKey) -> str | None:
        """Why the pods of gone ``key``, which the adapter's list does not name, cannot be released
        (None: they can, once the bare stand-in's pass confirms the provider holds nothing)."""
        if not self.controller.profile.lists_everything_owned:
            return NOT_COMPLETE
        peers = self.controller.peers()
        if peers:
            return (
                f"controllers {', '.join(sorted(peers))} of this manager employ "
                f"{self.controller.employer.kind} too, and nothing listed ties {key} to "
                f"{self.controller.name}"
            )
        return None

    async def _one_owner(
        self,
        key: EmployerKey,
        items: list[OwnedItem],
        holds: list[tuple[KubeObject, Hold]],
        report: GarbageReport,
        why_not: str | None,
    ) -> None:
        """Collect the gone employer ``key``: the items the adapter listed for it, and the pods
        its marks still hold; with ``why_not`` (nothing can be collected), tell the operator."""
        controller = self.controller
        resource = controller.employer
        if controller.reader.get(resource, key.namespace_or_none, key.name) is not None:
            return  # alive: not an orphan
        if not controller.claim(key):
            report.skipped[key] = BUSY
            return
        try:
            # Looked up again under the claim: a re-created employer's pass now waits for us.
            try:
                exists = await self.owner_exists(key)
            except kube.Forbidden as err:
                await self._refused_lookup(key, err, report)
                return
            self._refused.pop(key, None)
            if exists:
                report.skipped[key] = "the employer exists"
                return
            pods = sorted({hold.pod for _, hold in holds})
            if pods:
                report.held[key] = pods
            if why_not is None and not items:
                why_not = self._unlisted_why_not(key)
            if why_not is not None:
                report.uncollectable[key] = why_not
                await self._tell_operator(key, holds, why_not)
                if not self.options.dry_run:
                    await self._open_gates(key)
                return
            if items:
                report.orphans[key] = [item.id for item in items]
            if self.options.dry_run:
                for item in items:
                    log.info("%s: would collect %s of gone %s (dry run)", controller.name, item.id, key)
                if pods:
                    log.info(
                        "%s: would release %s from gone %s (dry run)", controller.name, ", ".join(pods), key
                    )
                return
            # The adapter listed nothing for a gone employer whose pods still carry its marks:
            # a bare stand-in's pass asks the provider (get_current_*) before releasing them.
            merged = OwnedItem(
                owner=key,
                id=items[0].id if items else "",
                labels={k: v for item in items for k, v in item.labels.items()},
                annotations={k: v for item in items for k, v in item.annotations.items()},
            )
            try:
                result = await controller.run_pass(key, stand_in=stand_in(resource, key, merged))
            except asyncio.CancelledError:
                raise
            except Exception as err:
                report.failed[key] = str(err)
                log.warning("%s: collecting what gone %s left failed: %s", controller.name, key, err)
                if holds:
                    await self._tell_operator(
                        key, holds, f"collecting it failed (tried again every {self.options.retry:g}s): {err}"
                    )
                return
            if not result.collected:
                report.pending.append(key)
                return
            report.collected.append(key)
            for item in items:
                log.info("%s: collected %s of gone %s", controller.name, item.id, key)
                controller.count_collected()
            done = [f"deleted {', '.join(i.id for i in items)}"] if items else []
            if pods:
                done.append(f"released pods {', '.join(pods)}")
                log.info("%s: released %s from gone %s", controller.name, ", ".join(pods), key)
            await controller.recorder.event(
                _namespace_object(key.namespace),
                "Normal",
                COLLECTED_REASON,
                f"{controller.name}: {' and '.join(done)} left by gone {key}",
            )
        finally:
            controller.done(key)

    async def _refused_lookup(self, key: EmployerKey, err: kube.Forbidden, report: GarbageReport) -> None:
        """The live lookup of ``key`` was refused (403): whether it is gone is unknown, so
        nothing of it is touched. The operator is told which permission is missing (a log line
        and a Warning Event on the Namespace), once until the refusal changes."""
        controller = self.controller
        refusal = err.message or str(err)
        report.unknown[key] = refusal
        if self._refused.get(key) == refusal:
            return
        self._refused[key] = refusal
        kind = controller.employer.kind
        log.warning(
            "%s: %s %s looks gone but looking it up was refused, so it is unknown, never gone; "
            "nothing of it is touched until the lookup answers: %s",
            controller.name,
            kind,
            key,
            refusal,
        )
        await controller.recorder.event(
            _namespace_object(key.namespace),
            "Warning",
            LOOKUP_REFUSED_REASON,
            f"{controller.name}: {kind} {key} is not in its cache and looking it up was refused "
            f"(403): it is unknown, never gone, so its pods keep their finalizers and what the "
            f"provider holds for it stays. Grant the manager `get` on it: {refusal}",
        )

    async def _collect_strays(self, report: GarbageReport) -> None:
        """Delete this controller's cluster-scoped sub-resources (resourceconsist/hooks/subresources.py)
        whose owner employer is gone."""
        controller = self.controller
        dry_run = self.options.dry_run
        client = controller.client
        selector = f"{OWNER_CONTROLLER_LABEL}={label_value(controller.name)}"
        for api_version, kind in cluster_scoped_kinds(controller.profile):
            res = await asyncio.to_thread(client.resource, api_version, kind)
            if res.namespaced:
                continue  # owner references: Kubernetes' garbage collector deletes them
            try:
                listing = await asyncio.to_thread(client.list, res, None, label_selector=selector)
            except kube.Forbidden as err:
                # Unknown, never gone: the other kinds and the owners above go on.
                log.warning("%s: listing %s refused, none collected: %s", controller.name, kind, err.message)
                continue
            for obj in listing.get("items") or []:
                meta = obj["metadata"]
                owner = str((meta.get("annotations") or {}).get(OWNER_ANNOTATION, ""))
                uid = str((meta.get("labels") or {}).get(OWNER_UID_LABEL, ""))
                key = EmployerKey(owner)
                if not owner or not controller.watches(key):
                    continue  # not written by the frame, or for a namespace this manager does not watch
                if _owner_alive(
                    controller.reader.get(controller.employer, key.namespace_or_none, key.name), uid
                ):
                    continue
                if not controller.claim(key):
                    report.skipped[f"{kind}/{meta['name']}"] = BUSY
                    continue
                try:
                    try:
                        live = await asyncio.to_thread(
                            client.get_or_none, controller.employer, key.namespace_or_none, key.name
                        )
                    except kube.Forbidden as err:
                        await self._refused_lookup(key, err, report)
                        continue
                    if _owner_alive(live, uid):
                        continue
                    report.strays.append(f"{kind}/{meta['name']}")
                    if dry_run:
                        log.info(
                            "%s: would delete %s %s of gone %s (dry run)",
                            controller.name,
                            kind,
                            meta["name"],
                            key,
                        )
                        continue
                    try:
                        await asyncio.to_thread(client.delete, res, None, meta["name"])
                    except kube.NotFound:
                        continue
                    controller.count_collected()
                    log.info("%s: deleted %s %s of gone %s", controller.name, kind, meta["name"], key)
                finally:
                    controller.done(key)


def _owner_alive(employer: KubeObject | None, uid: str) -> bool:
    return employer is not None and label_value(str(employer["metadata"].get("uid", ""))) == uid


def _namespace_object(namespace: str) -> KubeObject:
    """The owner is gone: its Event goes on its Namespace (``kubectl describe namespace``)."""
    # Filed in the namespace itself, so ``kubectl get events -n <ns>`` lists it.
    name = namespace or "default"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "namespace": name}}
