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
label was on) are labelled too. A sweep every ``SWEEP_INTERVAL`` seconds labels pods that came to
be selected since (their labels changed).

A pod that leaves the watch while the shard still needs it (its label removed or changed by
someone else) would look deleted. ``holds`` keeps it: a DELETED event, or a list that no longer
shows it, of a pod that still carries finalizers (so the API server has not deleted it) and that
the shard keeps (``ShardPods.keeps``) is checked with a read; a pod still there is labelled again
and stays in the cache, one gone leaves it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Informer
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

    def reset(self) -> None:
        """A new start: every Service is labelled for again, and the marks swept."""
        with self._lock:
            self._labelled.clear()
            self._swept_marks = False

    def _share(self) -> list[KubeObject]:
        informer = self._services()
        return [] if informer is None else informer.store.list()

    def before_list(self, informer: Informer) -> None:
        """Before each list of the shard's pods (informer thread): the Services new to the shard
        are labelled for, then the list is made with the share's selector."""
        services = self._share()
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
        for service in self._share() if services is None else services:
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
                self._widen(pod, {name})
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
                ns = str(pod["metadata"].get("namespace") or "")
                names = {h.employer for h in marks.holds(pod, kube.SERVICE.kind, names_by_ns.get(ns, ()))}
                if not names:
                    continue
                if "" in names:
                    names = {wire.EMPLOYER_LABEL_SHARED}
                elif not names & names_by_ns.get(ns, set()):
                    continue  # another shard's
                self._widen(pod, names)

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

    def _widen(self, pod: KubeObject, names: set[str], *, read: bool = False) -> bool:
        """Write the pod's widened label, starting from ``pod`` or (``read``) from a fresh read;
        whether the pod is still there."""
        meta = pod["metadata"]
        namespace, name = str(meta.get("namespace") or ""), str(meta["name"])

        def change(current: KubeObject) -> dict[str, object] | None:
            had = marks.employer_label(current)
            wider = marks.widened_employer_label(had, names)
            return None if wider == had else {"metadata": {"labels": {wire.EMPLOYER_LABEL: wider}}}

        try:
            with acting_for(self._fence):
                now, _ = self.client.patch_optimistic(
                    kube.POD, namespace, name, change, current=None if read else pod
                )
        except LeaseLost as err:
            raise LabellingFailed(f"not labelling pod {namespace}/{name}: {err}") from err
        except ApiError as err:
            raise LabellingFailed(
                f"cannot write the label {wire.EMPLOYER_LABEL} of pod {namespace}/{name}: {err}; "
                "the manager's admission policy must allow it (docs/security.md)"
            ) from err
        return now is not None and now["metadata"].get("uid") == meta.get("uid")

    def holds(self, pod: KubeObject) -> bool:
        """A pod that left the shard's watch or list: kept (and labelled again) when the API
        server still has it and the shard needs it (the module's docstring)."""
        if not (pod.get("metadata", {}).get("finalizers")) or not self._pods.keeps(pod):
            return False
        selecting = {str(s["metadata"]["name"]) for s in self._pods.reader.services_selecting(pod)}
        names = selecting or {wire.EMPLOYER_LABEL_SHARED}
        try:
            kept = self._widen(pod, names, read=True)  # the copy held is from before the change
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
