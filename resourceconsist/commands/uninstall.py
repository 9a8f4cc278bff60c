"""``resourceconsist uninstall-check``: whether the manager may go (the chart's pre-delete hook;
docs/install.md, "Uninstalling").

Only the running manager deregisters a pod from its load balancers and then releases the pod's
guard. Removed while a controlled Service exists, it leaves that Service's pods guarded by
finalizers no one removes: they can never be deleted. Releasing them without deregistering would
let a load balancer route to pods that stop, which breaks the promise. So the check refuses
while any controlled Service exists in the watched namespaces (deleting it, or taking off its
``kusionstack.io/control`` label, is the user's call: the manager then deregisters and releases
its pods), and while a pod still carries a guard or lifecycle finalizer of ours after a wait
(the manager releases them within seconds once their Services are gone). Nothing is changed:
it only reads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient

#: How many names a refusal lists before it counts the rest.
_NAMED = 5
#: The finalizers by which the frame holds a pod (its guard, PodOpsLifecycle's).
_HOLDING_PREFIXES = (wire.GUARD_FINALIZER_PREFIX + "/", wire.LIFECYCLE_FINALIZER_PREFIX + "/")


@dataclass(frozen=True)
class Blockers:
    """What holds an uninstall: controlled Services, and pods carrying our finalizers."""

    services: list[str]
    pods: list[str]

    def __bool__(self) -> bool:
        return bool(self.services or self.pods)


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:_NAMED])
    return shown + (f" and {len(items) - _NAMED} more" if len(items) > _NAMED else "")


def find_blockers(client: KubeClient, namespaces: Sequence[str]) -> Blockers:
    """The controlled Services and the pods holding our finalizers, in ``namespaces`` (every
    namespace when empty), as ``namespace/name``."""
    selector = f"{wire.CONTROL_LABEL}={wire.CONTROL_LABEL_VALUE}"
    services, pods = [], []
    scopes: list[str | None] = list(namespaces) or [None]
    for namespace in scopes:
        for svc in client.list(kube.SERVICE, namespace, label_selector=selector).get("items") or []:
            meta = svc["metadata"]
            services.append(f"{meta['namespace']}/{meta['name']}")
        for pod in client.list(kube.POD, namespace).get("items") or []:
            meta = pod["metadata"]
            if any(f.startswith(_HOLDING_PREFIXES) for f in meta.get("finalizers") or []):
                pods.append(f"{meta['namespace']}/{meta['name']}")
    return Blockers(sorted(services), sorted(pods))


def refusal(blockers: Blockers, waited: float) -> str:
    """One line saying what holds the uninstall and what to do."""
    if blockers.services:
        return (
            f"uninstall refused: {len(blockers.services)} controlled Service(s) still exist "
            f"({_named(blockers.services)}): delete them or remove their {wire.CONTROL_LABEL} label "
            "first, so the manager deregisters their pods and releases them, then uninstall again "
            '(docs/install.md, "Uninstalling")'
        )
    return (
        f"uninstall refused: {len(blockers.pods)} pod(s) still carry the manager's finalizers after "
        f"{waited:.0f} s ({_named(blockers.pods)}): the manager has not deregistered them yet; "
        "`resourceconsist explain pod NS/NAME` says what it waits for, then uninstall again"
    )


def check(client: KubeClient, namespaces: Sequence[str], *, wait_seconds: float) -> str | None:
    """None when the manager may go; else the one-line refusal. A controlled Service refuses at
    once (waiting cannot help); pods still held are given ``wait_seconds`` to be released."""
    deadline = time.monotonic() + wait_seconds
    started = time.monotonic()
    while True:
        blockers = find_blockers(client, namespaces)
        if not blockers:
            return None
        if blockers.services or time.monotonic() >= deadline:
            return refusal(blockers, time.monotonic() - started)
        time.sleep(1.0)
