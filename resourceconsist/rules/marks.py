"""What a pod's marks say about the employers that hold it, and the command a person runs to
release a pod by hand (docs/lifecycle-hooks.md, "Gone employers").

A pod names the employers it belongs to twice: its ``available-conditions`` entry
(``Kind/namespace/name`` -> lifecycle finalizer) and the guard or lifecycle finalizer itself,
whose suffix is the hash of the employer's name (docs/wire-contract.md). The garbage pass
(resourceconsist/hooks/orphans.py) finds employers that are gone while their marks remain from these
answers, and ``resourceconsist explain pod`` reads the same ones. Pure functions over objects.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from resourceconsist import wire
from resourceconsist.rules import lifecycle

#: The prefixes of the finalizers one employer puts on a pod, each followed by ``/<hash>``.
_EMPLOYER_FINALIZER_PREFIXES = (wire.GUARD_FINALIZER_PREFIX, wire.LIFECYCLE_FINALIZER_PREFIX)


@dataclass(frozen=True)
class Hold:
    """One employer's marks on one pod: its entry and its guard or lifecycle finalizers."""

    namespace: str
    pod: str
    #: The employer's name; "" when only the hash its finalizers carry is known.
    employer: str
    #: The hash of the employer's name, as its finalizers carry it.
    digest: str
    #: The ``expectedFinalizers`` key that names the employer (None: no entry left).
    entry: str | None
    #: The employer's guard and lifecycle finalizers the pod carries, in the pod's order.
    finalizers: tuple[str, ...]

    @property
    def key(self) -> str:
        """The employer key (``namespace/name``); "" when the name is unknown."""
        return f"{self.namespace}/{self.employer}" if self.employer else ""


def digest_of(finalizer: str) -> str | None:
    """The employer hash of a guard or lifecycle finalizer; None for any other finalizer."""
    prefix, sep, digest = finalizer.rpartition("/")
    return digest if sep and prefix in _EMPLOYER_FINALIZER_PREFIXES and digest else None


def employer_finalizers(pod: Mapping[str, Any]) -> list[str]:
    """The guard and lifecycle finalizers of any employer the pod carries. None left means no
    provider routes to the pod any more (the guard invariant, docs/concepts.md "The guard"): what
    the drain endpoint tells a drain waiter (docs/zero-downtime.md)."""
    return [f for f in lifecycle.held_finalizers(pod) if digest_of(f) is not None]


def name_digest(employer_name: str) -> str:
    """The hash an employer's finalizers carry (md5 of its name, docs/wire-contract.md)."""
    return lifecycle.lifecycle_finalizer(employer_name).rpartition("/")[2]


def entries_of(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's ``expectedFinalizers`` entries; a malformed annotation counts as none."""
    try:
        return lifecycle.expected_finalizers(pod)
    except lifecycle.MalformedAvailableConditions:
        return {}


def entry_names(pod: Mapping[str, Any], kind: str) -> list[str]:
    """The employers of ``kind`` the pod's entries name (in the pod's namespace)."""
    namespace = str(pod.get("metadata", {}).get("namespace") or "")
    prefix = f"{kind}/{namespace}/"
    return [key[len(prefix) :] for key in entries_of(pod) if key.startswith(prefix) and key != prefix]


def gate_names(pod: Mapping[str, Any]) -> list[str]:
    """The employer names the pod's readiness gates carry (a hashed, shortened gate names none)."""
    found = []
    for gate in lifecycle.readiness_gates(pod):
        if lifecycle.is_readiness_gate(gate):
            name = gate.partition("/")[2]
            if lifecycle.readiness_gate(name) == gate:
                found.append(name)
    return found


def event_names(events: Iterable[Mapping[str, Any]], kind: str) -> set[str]:
    """The names of the objects of ``kind`` that ``events`` are about: an employer's Events outlive
    it for the API server's event TTL (an hour by default), so they still name a gone one."""
    return {
        str(involved.get("name") or "")
        for event in events
        for involved in [event.get("involvedObject") or {}]
        if involved.get("kind") == kind
    } - {""}


def holds(pod: Mapping[str, Any], kind: str, known_names: Iterable[str] = ()) -> list[Hold]:
    """The marks employers of ``kind`` left on the pod, one ``Hold`` per employer.

    An employer is named by the pod's own entry of ``kind``, else by ``known_names`` (names the
    caller knows in the namespace: live employers, other pods' entries, Events) or the pod's
    readiness gates, matched by hash. A finalizer whose hash another kind's entry on the pod
    explains is that kind's business and left out; one nothing explains is a ``Hold`` with
    ``employer`` "" (an unknown employer)."""
    meta = pod.get("metadata", {})
    namespace, pod_name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    entries = entries_of(pod)
    ours = entry_names(pod, kind)
    by_digest: dict[str, str] = {}
    for name in [*known_names, *gate_names(pod), *ours]:  # the pod's own entries win
        by_digest[name_digest(name)] = name
    foreign = {
        digest
        for key, finalizer in entries.items()
        if not key.startswith(f"{kind}/")
        for digest in [digest_of(finalizer)]
        if digest is not None
    }
    found: dict[tuple[str, str], list[str]] = {}
    for finalizer in lifecycle.get_finalizers(pod):
        digest = digest_of(finalizer)
        if digest is None:
            continue
        name = by_digest.get(digest, "")
        if not name and digest in foreign:
            continue
        found.setdefault((name, digest), []).append(finalizer)
    for name in ours:
        found.setdefault((name, name_digest(name)), [])
    return [
        Hold(
            namespace=namespace,
            pod=pod_name,
            employer=name,
            digest=digest,
            entry=(
                lifecycle.expected_finalizer_key(kind, namespace, name)
                if name and lifecycle.expected_finalizer_key(kind, namespace, name) in entries
                else None
            ),
            finalizers=tuple(fs),
        )
        for (name, digest), fs in sorted(found.items())
    ]


def release_patch(pod: Mapping[str, Any], hold: Hold) -> list[dict[str, Any]]:
    """The JSON patch that takes ``hold``'s finalizers and entry off the pod, each removal
    preceded by a ``test`` of what it removes: applied to a pod that changed since, it fails
    and changes nothing."""
    ops: list[dict[str, Any]] = []
    finalizers = lifecycle.get_finalizers(pod)
    # From the last to the first, so each index still points where it pointed when read.
    for index in reversed(range(len(finalizers))):
        if finalizers[index] in hold.finalizers:
            path = f"/metadata/finalizers/{index}"
            ops += [{"op": "test", "path": path, "value": finalizers[index]}, {"op": "remove", "path": path}]
    if hold.entry is not None:
        current = lifecycle.get_annotations(pod).get(wire.AVAILABLE_CONDITIONS_ANNOTATION, "")
        remaining = {k: v for k, v in entries_of(pod).items() if k != hold.entry}
        path = "/metadata/annotations/" + lifecycle.json_pointer_escape(wire.AVAILABLE_CONDITIONS_ANNOTATION)
        ops += [
            {"op": "test", "path": path, "value": current},
            {"op": "replace", "path": path, "value": lifecycle.render_available_conditions(remaining)},
        ]
    return ops


def release_command(pod: Mapping[str, Any], hold: Hold) -> str:
    """The ``kubectl patch`` that releases the pod from ``hold`` by hand (run it only once no
    load balancer routes to the pod any more)."""
    ops = release_patch(pod, hold)
    return (
        f"kubectl patch pod {shlex.quote(hold.pod)} -n {shlex.quote(hold.namespace)} "
        f"--type=json -p {shlex.quote(json.dumps(ops, separators=(',', ':')))}"
    )


def describe(hold: Hold, kind: str) -> str:
    """The employer in words: ``Service ns/web``, or the hash when the name is unknown."""
    if hold.employer:
        return f"{kind} {hold.namespace}/{hold.employer}"
    return f"an unknown {kind} of namespace {hold.namespace} (finalizer hash {hold.digest})"


# -- sharding's employer label (docs/scaling.md, "Pods selected by the API server") -------------


def employer_label(pod: Mapping[str, Any]) -> str | None:
    """The pod's employer label (``wire.EMPLOYER_LABEL``); None when it carries none."""
    labels = pod.get("metadata", {}).get("labels") or {}
    value = labels.get(wire.EMPLOYER_LABEL)
    return None if value is None else str(value)


def widened_employer_label(current: str | None, names: Iterable[str]) -> str | None:
    """The employer label a pod must carry so that the shards of the employers ``names`` see its
    watch events, given the one it carries (``current``). It only widens: no label and one name
    gives that name; anything else that adds a name gives ``wire.EMPLOYER_LABEL_SHARED``, which
    every shard watches (an empty value too); a label already covering ``names`` is returned
    unchanged. So no shard that saw the pod stops seeing it by this label's change. The
    manager's admission policy allows exactly these changes (docs/security.md)."""
    wanted = set(names)
    if current == wire.EMPLOYER_LABEL_SHARED or wanted <= ({current} if current else set()):
        return current
    if current is None and len(wanted) == 1:
        return next(iter(wanted))
    return wire.EMPLOYER_LABEL_SHARED


def employer_label_selector(names: Iterable[str]) -> str:
    """The ``labelSelector`` of a shard's pod watch: the pods labelled with one of its employers'
    ``names``, or shared. Sorted, so one share always asks for the same selector."""
    return f"{wire.EMPLOYER_LABEL} in ({','.join(sorted({wire.EMPLOYER_LABEL_SHARED, *names}))})"


def unlabelled_for(name: str) -> str:
    """The requirement a ``labelSelector`` adds to select the pods whose employer label does not
    yet cover the employer ``name`` (no label, or another employer's name)."""
    return f"{wire.EMPLOYER_LABEL} notin ({name},{wire.EMPLOYER_LABEL_SHARED})"
