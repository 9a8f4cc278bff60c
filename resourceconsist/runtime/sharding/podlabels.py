"""Pods selected by the API server (docs/scaling.md, "Pods selected by the API server"): with
``ShardingOptions.pod_employer_label``, a shard's pod cache lists and watches only the pods whose
employer label (``wire.EMPLOYER_LABEL``) names one of its Services or is shared, so a replica
decodes its share of the fleet's pod events instead of all of them.

The label is the webhook's to stamp on a new pod (``--pod-employer-label``); this module writes it
where the webhook could not: ``ShardPodLabels.label`` lists, for each of the shard's Services, the
pods it selects whose label does not cover it yet (a selector the API server evaluates, so the
answer is usually empty) and widens their label (``marks.widened_employer_label``: absent -> the
name -> shared, never narrower). It runs before each list of the shard's pods (in the informer
thread, ``Informer.before_list``), while the shard surely holds its Lease (the fence, as for every
write of the shard): a Service that arrives is labelled for before the list its first pass waits
for, so no pod it holds is missing from that list. A labelling that fails fails the list, which is
retried: the shard's passes wait rather than run on a cache short of a pod. Before the first list,
the pods without any label that carry marks of the shard's Services (a fleet that ran before the
label was on) are labelled too. A pod that carries no label at all (created past the webhook: a pod
it is not sent, or while it is down) is labelled at once: every shard watches the unlabelled pods
(``UnlabelledPods``; normally none) and labels those its Services select or whose marks name them.
A sweep every ``SWEEP_INTERVAL`` seconds labels pods that came to be selected since (their labels
changed).

A pod that leaves the watch while the shard still needs it (its label removed or changed by
someone else) would look deleted. ``holds`` keeps it: a DELETED event, or a list that no longer
shows it, of a pod that still carries finalizers (so the API server has not deleted it) and that
the shard keeps (``ShardPods.keeps``) is checked with a read; a pod still there is labelled again
and stays in the cache, one gone leaves it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, Informer, WatchEvent
from resourceconsist.cluster.kube import ApiError, KubeClient, KubeObject
from resourceconsist.flow.fence import Fence, LeaseLost, acting_for
from resourceconsist.rules import marks
from resourceconsist.rules.labels import to_query
from resourceconsist.runtime.sharding.pods import ShardPods

log = logging.getLogger(__name__)

#: Seconds between two sweeps for pods newly selected by a shard's Services (their labels
#: changed). Each sweep is one LIST per Service of the shard, which the API server answers by
#: matching the selector against every pod of the namespace: at 1000 Services over 100k pods,
#: about a second of its CPU per Service-minute matters, so not more often.
SWEEP_INTERVAL = 300.0
#: Seconds a list of the shard's pods waits for the shard Lease before labelling.
LEASE_WAIT = 10.0
#: Seconds before an unlabelled pod whose label could not be written is tried again (doubling,
#: up to ``RETRY_MAX``).
RETRY_FIRST = 0.5
RETRY_MAX = 30.0


class LabellingFailed(RuntimeError):
    """The employer label of a pod a shard's Service selects could not be written: the shard's
    pod list waits (it is retried) rather than miss the pod."""


class ShardPodLabels:
    """One shard's employer labels: what its pod watch selects, and the labels it writes."""

    def __init__(
        self,
        client: KubeClient,
        pods: ShardPods,
        services: Callable[[], Informer | None],
        namespaces: tuple[str, ...],
        fence: Fence | None = None,
    ) -> None:
        self.client = client
        #: The shard Lease's fence: a label is written only while the shard surely holds it, as
        #: every other write of the shard (resourceconsist/flow/fence.py).
        self._fence = fence
        self._pods = pods
        #: The shard's Service cache (its share), once made.
        self._services = services
        #: The watched namespaces; empty: all.
        self._namespaces = namespaces
        #: The (Service key, selector) pairs labelled for since this shard started.
        self._labelled: set[tuple[str, str]] = set()
        self._swept_marks = False
        self._lock = threading.Lock()

    @property
    def reader(self) -> CacheReader:
        """The replica's caches (its Service cache holds the shard's share)."""
        return self._pods.reader

    def reset(self) -> None:
        """A new start: every Service is labelled for again, and the marks swept."""
        with self._lock:
            self._labelled.clear()
            self._swept_marks = False

    def share(self) -> list[KubeObject]:
        informer = self._services()
        return [] if informer is None else informer.store.list()

    def before_list(self, informer: Informer) -> None:
        """Before each list of the shard's pods (informer thread): the Services new to the shard
        are labelled for, then the list is made with the share's selector."""
        services = self.share()
        self._wait_for_lease()
        self.label(services, only_new=True)
        if not self._swept_marks:
            self._label_marked(services)
            self._swept_marks = True
        informer.label_selector = marks.employer_label_selector(str(s["metadata"]["name"]) for s in services)

    def _wait_for_lease(self) -> None:
        """Up to ``LEASE_WAIT`` seconds for the shard Lease (a start lists the pods beside its
        campaign); past it the labelling fails, and the list is retried."""
        fence = self._fence
        deadline = time.monotonic() + LEASE_WAIT
        while fence is not None and not fence.held and time.monotonic() < deadline:
            time.sleep(0.05)

    def label(self, services: list[KubeObject] | None = None, *, only_new: bool = False) -> None:
        """Widen the label of every pod one of ``services`` (default: the share) selects whose
        label does not cover it. Raises ``LabellingFailed`` when a write fails."""
        for service in self.share() if services is None else services:
            selector = (service.get("spec") or {}).get("selector") or {}
            if not selector:
                continue  # selects nothing
            meta = service["metadata"]
            name, namespace = str(meta["name"]), str(meta.get("namespace") or "")
            done = (f"{namespace}/{name}", to_query(selector))
            if only_new and done in self._labelled:
                continue
            query = f"{to_query(selector)},{marks.unlabelled_for(name)}"
            for pod in self._list(namespace, query):
                self.widen(pod, {name})
            with self._lock:
                self._labelled.add(done)

    def _label_marked(self, services: list[KubeObject]) -> None:
        """Pods with no employer label that carry marks naming one of ``services``, or marks
        naming an employer they cannot name: labelled for it (or shared)."""
        names_by_ns: dict[str, set[str]] = {}
        for service in services:
            meta = service["metadata"]
            names_by_ns.setdefault(str(meta.get("namespace") or ""), set()).add(str(meta["name"]))
        for namespace in self._namespaces or (None,):
            for pod in self._list(namespace, f"!{wire.EMPLOYER_LABEL}"):
                names = self.names_for(pod, names_by_ns)
                if names:
                    self.widen(pod, names)

    def names_for(
        self, pod: KubeObject, own: Mapping[str, set[str]], selecting: AbstractSet[str] = frozenset()
    ) -> set[str]:
        """What this shard labels ``pod`` for: the names of its Services (``own``, by namespace)
        that select it (``selecting``) or whose marks it carries, with the other Services its
        marks name beside them; ``Shared`` for a mark of an employer it cannot name (every shard
        keeps such a pod). Empty: the pod is another shard's, or nobody's."""
        namespace = str(pod["metadata"].get("namespace") or "")
        names = {h.employer for h in marks.holds(pod, kube.SERVICE.kind, own.get(namespace, ()))}
        if "" in names:
            return {wire.EMPLOYER_LABEL_SHARED}
        if not names & own.get(namespace, set()):
            names = set()  # marks of another shard's Services only: theirs to label
        return names | selecting

    def _list(self, namespace: str | None, selector: str) -> Iterator[KubeObject]:
        token: str | None = None
        while True:
            try:
                page = self.client.list(
                    kube.POD, namespace or None, label_selector=selector, limit=500, continue_token=token
                )
            except ApiError as err:
                raise LabellingFailed(f"listing pods to label ({selector}): {err}") from err
            yield from page.get("items") or ()
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return

    def widen(self, pod: KubeObject, names: set[str], *, read: bool = False) -> tuple[bool, bool]:
        """Write the pod's widened label, starting from ``pod`` or (``read``) from a fresh read:
        whether the pod is still there, and whether a label was written."""
        meta = pod["metadata"]
        namespace, name = str(meta.get("namespace") or ""), str(meta["name"])

        def change(current: KubeObject) -> dict[str, object] | None:
            had = marks.employer_label(current)
            wider = marks.widened_employer_label(had, names)
            return None if wider == had else {"metadata": {"labels": {wire.EMPLOYER_LABEL: wider}}}

        try:
            with acting_for(self._fence):
                now, wrote = self.client.patch_optimistic(
                    kube.POD, namespace, name, change, current=None if read else pod
                )
        except LeaseLost as err:
            raise LabellingFailed(f"not labelling pod {namespace}/{name}: {err}") from err
        except ApiError as err:
            raise LabellingFailed(
                f"cannot write the label {wire.EMPLOYER_LABEL} of pod {namespace}/{name}: {err}; "
                "the manager's admission policy must allow it (docs/security.md)"
            ) from err
        present = now is not None and now["metadata"].get("uid") == meta.get("uid")
        return present, wrote and present

    def holds(self, pod: KubeObject) -> bool:
        """A pod that left the shard's watch or list: kept (and labelled again) when the API
        server still has it and the shard needs it (the module's docstring)."""
        if not (pod.get("metadata", {}).get("finalizers")) or not self._pods.keeps(pod):
            return False
        selecting = {str(s["metadata"]["name"]) for s in self.reader.services_selecting(pod)}
        names = selecting or {wire.EMPLOYER_LABEL_SHARED}
        try:
            kept, _ = self.widen(pod, names, read=True)  # the copy held is from before the change
        except LabellingFailed as err:
            log.warning("%s; the pod stays in the cache as last seen", err)
            return True
        if kept:
            log.info(
                "pod %s/%s left this shard's watch (its label %s was changed): labelled again",
                pod["metadata"].get("namespace"),
                pod["metadata"]["name"],
                wire.EMPLOYER_LABEL,
            )
        return kept


class UnlabelledPods:
    """One shard's watch of the pods that carry no employer label, and the labels it writes
    for them: a pod created past the webhook (one it is not sent, or while it is down) or whose
    label a person removed is labelled at once for the shard's Services that select it or whose
    marks it carries, so it enters their shard's watch without waiting for the sweep. Normally the
    watch is empty (the webhook stamps each new pod); pods no Service selects stay in it, so
    every shard decodes their events (docs/scaling.md, "Pods selected by the API server")."""

    def __init__(
        self,
        labels: ShardPodLabels,
        client: KubeClient,
        namespaces: tuple[str, ...],
        active: Callable[[], bool],
    ) -> None:
        self._labels = labels
        self._client = client
        self._namespaces = namespaces
        #: Labelling runs only while this is true (the shard's pods divide, its Services synced).
        self._active = active
        #: Made at each start (a stopped informer does not start again).
        self.informer: Informer | None = None
        #: The unlabelled pods not looked at since their last event, as that event showed them.
        self._pending: dict[str, KubeObject] = {}
        #: Of those, the ones whose last event was a DELETED (their copy is not the pod's).
        self._left: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: Label writes so far (the tests count them).
        self.labelled = 0

    def start(self) -> None:
        """On the loop: watch the unlabelled pods and label them as they come."""
        loop = asyncio.get_running_loop()
        informer = Informer(
            self._client,
            kube.POD,
            namespace=self._namespaces[0] if len(self._namespaces) == 1 else None,
            namespaces=self._namespaces if len(self._namespaces) > 1 else (),
            label_selector=f"!{wire.EMPLOYER_LABEL}",
        )
        self.informer, self._wake, self._pending = informer, asyncio.Event(), {}
        informer.add_handler(self._changed)
        informer.start(loop)
        self._task = asyncio.create_task(self._run(self._wake))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        informer, self.informer = self.informer, None
        if informer is not None:
            await asyncio.to_thread(informer.stop, 2.0)

    def _changed(self, event: WatchEvent) -> None:
        # A DELETED is looked at too: the pod may have left this watch because another shard
        # labelled it for its own Services only, before this shard labelled it for its own; a pod
        # really gone costs a read. Its copy is never written from: the API server sends a pod
        # that left a label-selected watch with its content from before the change under the
        # change's resourceVersion, so a write from it would pass the precondition and could
        # narrow the label the other shard wrote. Such pods are read afresh (``_label``).
        key = kube.object_key(event.obj)
        self._pending[key] = event.obj
        if event.type == "DELETED":
            self._left.add(key)
        else:
            self._left.discard(key)
        if self._wake is not None:
            self._wake.set()

    async def _run(self, wake: asyncio.Event) -> None:
        retry = RETRY_FIRST
        while True:
            await wake.wait()
            wake.clear()
            if not self._pending:
                continue
            if not self._active():
                # Not yet (the shard's Services not synced) or not at all (pods do not divide):
                # looked at again shortly.
                await asyncio.sleep(RETRY_FIRST)
                wake.set()
                continue
            pending, self._pending = self._pending, {}
            left, self._left = self._left & set(pending), set()
            pods = [(pending[k], k in left) for k in sorted(pending)]
            failed = await asyncio.to_thread(self._label, pods)
            if not failed:
                retry = RETRY_FIRST
                continue
            for pod, read in failed:
                key = kube.object_key(pod)
                if key not in self._pending:  # else a newer event came
                    self._pending[key] = pod
                    if read:
                        self._left.add(key)
            await asyncio.sleep(retry)
            retry = min(retry * 2, RETRY_MAX)
            wake.set()

    def _label(self, pods: list[tuple[KubeObject, bool]]) -> list[tuple[KubeObject, bool]]:
        """In a worker thread: label each of ``pods`` (each with whether it must be read afresh
        first) this shard's Services need; those whose write failed."""
        own: dict[str, set[str]] = {}
        for service in self._labels.share():
            meta = service["metadata"]
            own.setdefault(str(meta.get("namespace") or ""), set()).add(str(meta["name"]))
        reader = self._labels.reader
        failed: list[tuple[KubeObject, bool]] = []
        for pod, read in pods:
            selecting = {str(s["metadata"]["name"]) for s in reader.services_selecting(pod)}
            names = self._labels.names_for(pod, own, selecting)
            if not names:
                continue
            try:
                _, wrote = self._labels.widen(pod, names, read=read)
            except LabellingFailed as err:
                log.warning("%s; trying again", err)
                failed.append((pod, read))
                continue
            if not wrote:
                continue  # gone, or labelled for these Services already
            self.labelled += 1
            log.info(
                "pod %s/%s carried no %s label: labelled for %s",
                pod["metadata"].get("namespace"),
                pod["metadata"]["name"],
                wire.EMPLOYER_LABEL,
                ", ".join(sorted(names)),
            )
        return failed
