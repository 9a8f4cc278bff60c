"""What the adapter's subscribers are told of a pass (docs/lifecycle-hooks.md, "Subscribers"):
each change of state of an employer or of one of its pods, once, as its memory
(``memory.EmployerMemory.told``) records what they were last told.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from resourceconsist.cluster.kube import EmployerKey
from resourceconsist.reconcile.guard import Verdict, announcements
from resourceconsist.reconcile.memory import Memories
from resourceconsist.reconcile.podwriter import EmployerEntry

log = logging.getLogger(__package__)


class Telling:
    """Tells one reconciler's subscribers (``notify``: what happened, employer key, pod name or
    "") what its passes decide, each once per change; ``notify`` must not block."""

    def __init__(
        self, memory: Memories, notify: Callable[[str, EmployerKey, str], None], controller: str
    ) -> None:
        self._memory = memory
        self._notify = notify
        self._controller = controller

    def told(self, key: EmployerKey) -> Mapping[str, str]:
        """What the subscribers were last told of the employer ``key``, by pod ("": itself)."""
        return self._memory.told(key)

    def tell(self, key: EmployerKey, pod: str, what: str) -> None:
        """Notify subscribers of a change of state of an employer (pod "") or pod, once."""
        told = self._memory.of(key).told
        if told.get(pod) == what:
            return
        if what == "employer_deleted":
            self._memory.told_deleted(key)
        elif what == "pod_released":
            told.pop(pod, None)
        else:
            told[pod] = what
        try:
            self._notify(what, key, pod)
        except Exception:
            log.exception("%s %s: notifying subscribers of %s failed", self._controller, key, what)

    def guarded(self, key: EmployerKey, pods: Iterable[str]) -> None:
        """The guard went on these pods before the calls: news for pods nothing was told of yet."""
        for name in pods:
            if name not in self._memory.told(key):
                self.tell(key, name, "pod_guarded")

    def announce(
        self,
        key: EmployerKey,
        verdicts: Mapping[str, Verdict],
        finalizers_of: Callable[[str], Sequence[str]],
        entry: EmployerEntry,
    ) -> None:
        """Tell what a pass's confirmed verdicts made true, after its writes (``finalizers_of``:
        a pod's finalizers after them; ``guard.announcements``)."""
        for name, what in announcements(verdicts, self._memory.told(key), finalizers_of, entry):
            self.tell(key, name, what)
