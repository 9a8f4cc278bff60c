"""Pods selected by the API server (docs/scaling.md, "Pods selected by the API server"): with
``ShardingOptions.pod_employer_label``, a shard's pod cache lists and watches only the pods whose
employer label (``wire.EMPLOYER_LABEL``) names one of its Services or is shared, so a replica
decodes its share of the fleet's pod events instead of all of them.

The label is the webhook's to stamp on a new pod (``--pod-employer-label``); this module writes it
where the webhook could not, widening it (``marks.widened_employer_label``: absent -> the name ->
shared, never narrower), fenced by the shard Lease as every write of the shard:

- ``PodLabeller`` watches the pods without the label (normally none), every Service of the
  watched namespaces, and the label changes of the shard's own pods, and labels at once a pod
  created past the webhook, a pod whose labels changed so that another Service selects it, and
  the pods of the shard's watch that a Service appearing selects;
- ``ShardPodLabels.before_list`` runs before each list of the shard's pods (in the informer
  thread, ``Informer.before_list``): the unlabelled pods a Service new to the shard selects, and
  at the first list those carrying the share's marks (a fleet that ran before the label was on),
  are labelled from the labeller's watch before the list its first pass waits for, so no pod it
  holds is missing from that list. A labelling that fails fails the list, which is retried: the
  shard's passes wait rather than run on a cache short of a pod;
- ``ShardPodLabels.sweep``, every ``SWEEP_INTERVAL`` seconds, asks the API server for each of the
  shard's Services (a LIST) for what the watches missed.

A pod that leaves the watch while the shard still needs it (its label removed or changed by
someone else) would look deleted. ``holds`` keeps it: a DELETED event, or a list that no longer
shows it, of a pod that still carries finalizers (so the API server has not deleted it) and that
the shard keeps (``ShardPods.keeps``) is checked with a read; a pod still there is labelled again
and stays in the cache, one gone leaves it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, Informer, Store, StoreReader, WatchEvent, indexers_for
from resourceconsist.cluster.kube import ApiError, KubeClient, KubeObject, Resource
from resourceconsist.flow.fence import Fence, LeaseLost, acting_for
from resourceconsist.rules import marks
from resourceconsist.rules.labels import to_query
from resourceconsist.runtime.sharding.pods import ShardPods

log = logging.getLogger(__name__)

#: Seconds between two sweeps for pods newly selected by a shard's Services that the prompt
#: labels missed (``PodLabeller``; e.g. a pod whose label names a deleted Service, in no shard's
#: watch, relabelled into a live one). Each sweep is one LIST per Service of the shard, which the
#: API server answers by matching the selector against every pod of the namespace: at 1000
#: Services over 100k pods that is a cost worth paying rarely.
SWEEP_INTERVAL = 1800.0
#: Seconds a list of the shard's pods waits for the shard Lease before labelling.
LEASE_WAIT = 10.0
#: Seconds before an unlabelled pod whose label could not be written is tried again (doubling,
#: up to ``RETRY_MAX``).
RETRY_FIRST = 0.5
RETRY_MAX = 30.0


def _names_by_namespace(services: list[KubeObject]) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for service in services:
        meta = service["metadata"]
        names.setdefault(str(meta.get("namespace") or ""), set()).add(str(meta["name"]))
    return names


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
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        #: The shard Lease's fence: a label is written only while the shard surely holds it, as
        #: every other write of the shard (resourceconsist/flow/fence.py).
        self._fence = fence
        self._pods = pods
        #: The shard's Service cache (its share), once made.
        self._services = services
        #: The (Service key, selector) pairs labelled for since this shard started.
        self._labelled: set[tuple[str, str]] = set()
        self._swept_marks = False
        self._lock = threading.Lock()
        #: The prompt labels: the unlabelled pods' watch, every Service, label changes.
        self.labeller = PodLabeller(self, client, namespaces, active)

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
        """Before each list of the shard's pods (informer thread): the unlabelled pods the
        Services new to the shard select, and at the first list those carrying the share's
        marks, are labelled for them; then the list is made with the share's selector.

        From the labeller's watch of the unlabelled pods, not a LIST per Service: the pods a
        new Service selects that are labelled for other Services are in their shards' watches,
        which label them when the Service appears (``PodLabeller``); the pods a Service holds
        were labelled for it when it took them, and a label never narrows."""
        services = self.share()
        self._wait_for_lease()
        unlabelled = self.labeller.unlabelled_pods(LEASE_WAIT)
        own = _names_by_namespace(services)
        for service in services:
            selector = (service.get("spec") or {}).get("selector") or {}
            meta = service["metadata"]
            done = (f"{meta.get('namespace') or ''}/{meta['name']}", to_query(selector))
            if not selector or done in self._labelled:
                continue
            for pod in unlabelled.pods_selected_by(service):
                self.widen(pod, self.names_for(pod, own, {str(meta["name"])}))
            with self._lock:
                self._labelled.add(done)
        if not self._swept_marks:
            # A fleet served before the label was on: the pods its Services hold, selected or not.
            for pod in unlabelled.list(kube.POD):
                names = self.names_for(pod, own)
                if names:
                    self.widen(pod, names)
            self._swept_marks = True
        informer.label_selector = marks.employer_label_selector(str(s["metadata"]["name"]) for s in services)

    def _wait_for_lease(self) -> None:
        """Up to ``LEASE_WAIT`` seconds for the shard Lease (a start lists the pods beside its
        campaign); past it the labelling fails, and the list is retried."""
        fence = self._fence
        deadline = time.monotonic() + LEASE_WAIT
        while fence is not None and not fence.held and time.monotonic() < deadline:
            time.sleep(0.05)

    def sweep(self) -> None:
        """Widen the label of every pod one of the share's Services selects whose label does not
        cover it, asking the API server (a LIST per Service): the net under the watches.
        Raises ``LabellingFailed`` when a write fails."""
        for service in self.share():
            selector = (service.get("spec") or {}).get("selector") or {}
            if not selector:
                continue  # selects nothing
            meta = service["metadata"]
            name, namespace = str(meta["name"]), str(meta.get("namespace") or "")
            query = f"{to_query(selector)},{marks.unlabelled_for(name)}"
            for pod in self._list(namespace, query):
                self.widen(pod, {name})

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


class _StoreOf(StoreReader):
    """Lookups in one informer's store (``PodLabeller``'s every Service, or unlabelled pods)."""

    def __init__(self, informer: Informer) -> None:
        self._informer = informer

    def _store(self, resource: Resource, namespace: str | None) -> Store:
        return self._informer.store


class _Seen(enum.Enum):
    """How a pod came to ``PodLabeller``."""

    #: An ADDED or MODIFIED of the unlabelled pods' watch: its copy is the pod's.
    UNLABELLED = "unlabelled"
    #: A DELETED of that watch: it was labelled (or is gone); its copy is not the pod's.
    LEFT_UNLABELLED = "left"
    #: A change of its labels in the shard's own watch.
    RELABELLED = "relabelled"


class PodLabeller:
    """One shard's prompt labels: each pod whose employer label does not cover every Service that
    selects it is labelled at once, by a shard one of whose Services needs it, rather than at the
    sweep. Three watches bring such pods:

    - the pods without the label (its own watch, normally empty: the webhook stamps each new
      pod): created past the webhook (a pod it is not sent, or while it is down), or whose label a
      person removed;
    - the shard's own pod watch, when a pod's labels change: a Service of another shard may select
      it now, and that shard does not see it;
    - every Service (its own watch): one that appears, changes its selector or comes to a shard
      may select pods of this shard's watch labelled for others, or unlabelled ones.

    Against every Service of the watched namespaces (a watch of Services, small beside the pods)
    the pod is labelled for all that select it: ``Shared`` when a second one does. Pods no Service
    selects stay unlabelled, so every shard is sent and decodes their events (docs/scaling.md,
    "Pods selected by the API server")."""

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
        #: Made at each start (a stopped informer does not start again): the pods without the
        #: label, and every Service.
        self.unlabelled: Informer | None = None
        self.services: Informer | None = None
        #: The pods not looked at since their last event, as that event showed them, and how it
        #: came (``_Seen``).
        self._pending: dict[str, tuple[KubeObject, _Seen]] = {}
        #: Keys of the Services that appeared, or whose selector or shard changed, since looked at.
        self._services_pending: set[str] = set()
        #: The shard's pod cache (``start``).
        self._shard_pods: Informer | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] = lambda: None
        #: Label writes so far (the tests count them).
        self.labelled = 0

    def _informer(self, resource: Resource, label_selector: str | None) -> Informer:
        return Informer(
            self._client,
            resource,
            namespace=self._namespaces[0] if len(self._namespaces) == 1 else None,
            namespaces=self._namespaces if len(self._namespaces) > 1 else (),
            indexers=indexers_for(resource),
            label_selector=label_selector,
        )

    def start(self, shard_pods: Informer) -> None:
        """On the loop: watch the unlabelled pods, every Service, and ``shard_pods`` (the shard's
        pod cache) for label changes, and label as they come."""
        loop = asyncio.get_running_loop()
        self.unlabelled = self._informer(kube.POD, f"!{wire.EMPLOYER_LABEL}")
        self.services = self._informer(kube.SERVICE, None)
        self._wake, self._pending, self._services_pending = asyncio.Event(), {}, set()
        self._shard_pods = shard_pods
        self.unlabelled.add_handler(self._changed)
        self.services.add_handler(self._service_changed)
        self._unsubscribe = shard_pods.add_handler(self._relabelled)
        self.services.start(loop)
        self.unlabelled.start(loop)
        self._task = asyncio.create_task(self._run(self._wake, _StoreOf(self.services)))

    async def stop(self) -> None:
        self._unsubscribe()
        self._unsubscribe = lambda: None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        informers = [i for i in (self.unlabelled, self.services) if i is not None]
        self.unlabelled = self.services = None
        for informer in informers:
            informer.signal_stop()
        for informer in informers:
            await asyncio.to_thread(informer.stop, 2.0)

    def _queue(self, pod: KubeObject, seen: _Seen) -> None:
        self._pending[kube.object_key(pod)] = (pod, seen)
        if self._wake is not None:
            self._wake.set()

    def _changed(self, event: WatchEvent) -> None:
        """An event of the unlabelled pods' watch."""
        # A DELETED is looked at too: the pod may have left this watch because another shard
        # labelled it for its own Services only (its Service cache behind); a pod really gone
        # costs a read. Its copy is never written from: the API server sends a pod that left a
        # label-selected watch with its content from before the change under the change's
        # resourceVersion, so a write from it would pass the precondition and could narrow the
        # label the other shard wrote. Such pods are read afresh (``_label``).
        self._queue(event.obj, _Seen.LEFT_UNLABELLED if event.type == "DELETED" else _Seen.UNLABELLED)

    def _service_changed(self, event: WatchEvent) -> None:
        """An event of the every-Service watch: a Service that appeared (a first list's too: a
        restart), whose selector changed, or that came to a shard (its labels changed) may select
        pods labelled for others, in this shard's watch."""
        if event.type == "DELETED":
            return
        if event.type == "MODIFIED" and event.old is not None:
            spec, old_spec = event.obj.get("spec") or {}, event.old.get("spec") or {}
            same_labels = event.obj["metadata"].get("labels") == event.old["metadata"].get("labels")
            if same_labels and spec.get("selector") == old_spec.get("selector"):
                return
        self._services_pending.add(kube.object_key(event.obj))
        if self._wake is not None:
            self._wake.set()

    def unlabelled_pods(self, timeout: float) -> StoreReader:
        """Blocking (an informer thread): the unlabelled pods once their watch has listed them,
        waiting up to ``timeout`` seconds. Raises ``LabellingFailed`` past it."""
        deadline = time.monotonic() + timeout
        while True:
            informer = self.unlabelled
            left = deadline - time.monotonic()
            if informer is not None and informer.synced_within(max(0.0, min(0.1, left))):
                return _StoreOf(informer)
            if time.monotonic() >= deadline:
                raise LabellingFailed(f"the pods without the {wire.EMPLOYER_LABEL} label not listed yet")
            if informer is None:
                time.sleep(0.05)

    def _relabelled(self, event: WatchEvent) -> None:
        """An event of the shard's own pod watch: a pod whose labels (other than the employer
        label) changed may be selected by another shard's Service now."""
        if event.type != "MODIFIED" or event.old is None or not self._active():
            return  # before the Services are in, the share's first list labels (``before_list``)
        now = dict(event.obj["metadata"].get("labels") or {})
        before = dict(event.old["metadata"].get("labels") or {})
        now.pop(wire.EMPLOYER_LABEL, None)
        before.pop(wire.EMPLOYER_LABEL, None)
        if now != before:
            self._queue(event.obj, _Seen.RELABELLED)

    async def _run(self, wake: asyncio.Event, services: StoreReader) -> None:
        retry = RETRY_FIRST
        while True:
            await wake.wait()
            wake.clear()
            if not self._pending and not self._services_pending:
                continue
            watching, own_pods = self.services, self._shard_pods
            ready = own_pods is not None and own_pods.has_synced and own_pods.current
            if not self._active() or watching is None or not watching.has_synced or not ready:
                # Not yet (the Services not in) or not at all (pods do not divide): looked at
                # again shortly.
                await asyncio.sleep(RETRY_FIRST)
                wake.set()
                continue
            pending, self._pending = self._pending, {}
            appeared, self._services_pending = self._services_pending, set()
            batch = [pending[k] for k in sorted(pending)]
            failed = await asyncio.to_thread(self._label, batch, services, appeared)
            if not failed:
                retry = RETRY_FIRST
                continue
            for pod, seen in failed:
                if kube.object_key(pod) not in self._pending:  # else a newer event came
                    self._queue(pod, seen)
            await asyncio.sleep(retry)
            retry = min(retry * 2, RETRY_MAX)
            wake.set()

    def _selected_by(self, keys: AbstractSet[str], services: StoreReader) -> list[tuple[KubeObject, _Seen]]:
        """The pods of this shard's watch, and the unlabelled ones, that the Services of ``keys``
        select while their label does not cover them."""
        found: list[tuple[KubeObject, _Seen]] = []
        unlabelled = self.unlabelled
        for key in sorted(keys):
            namespace, _, name = key.rpartition("/")
            service = services.get(kube.SERVICE, namespace or None, name)
            if service is None or not (service.get("spec") or {}).get("selector"):
                continue
            for pod in self._labels.reader.pods_selected_by(service):
                if marks.employer_label(pod) not in (name, wire.EMPLOYER_LABEL_SHARED):
                    found.append((pod, _Seen.RELABELLED))
            if unlabelled is not None:
                found += [(pod, _Seen.UNLABELLED) for pod in _StoreOf(unlabelled).pods_selected_by(service)]
        return found

    def _label(
        self,
        pods: list[tuple[KubeObject, _Seen]],
        services: StoreReader,
        appeared: AbstractSet[str] = frozenset(),
    ) -> list[tuple[KubeObject, _Seen]]:
        """In a worker thread: label each of ``pods`` for every Service that selects it (and
        those its marks name): a pod of this shard's watch always (no other shard may see it), an
        unlabelled one when one of those Services is this shard's; also the pods the Services of
        ``appeared`` select (``_selected_by``). Returns those whose write failed."""
        pods = [*pods, *self._selected_by(appeared, services)]
        own = _names_by_namespace(self._labels.share())
        failed: list[tuple[KubeObject, _Seen]] = []
        for pod, seen in pods:
            namespace = str(pod["metadata"].get("namespace") or "")
            selecting = {str(s["metadata"]["name"]) for s in services.services_selecting(pod)}
            mine = self._labels.names_for(pod, own, selecting & own.get(namespace, set()))
            if not mine and seen is not _Seen.RELABELLED:
                continue  # another shard's to label, or nobody's
            names = mine | selecting
            if not names:
                continue
            try:
                _, wrote = self._labels.widen(pod, names, read=seen is _Seen.LEFT_UNLABELLED)
            except LabellingFailed as err:
                log.warning("%s; trying again", err)
                failed.append((pod, seen))
                continue
            if not wrote:
                continue  # gone, or labelled for these Services already
            self.labelled += 1
            log.info(
                "pod %s/%s: its %s label did not cover %s; widened",
                namespace,
                pod["metadata"]["name"],
                wire.EMPLOYER_LABEL,
                ", ".join(sorted(names)),
            )
        return failed
