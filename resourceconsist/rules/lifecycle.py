"""PodOpsLifecycle rules: the shared ``available-conditions`` annotation and lifecycle finalizers.

Pure functions over pod dicts, used by both the reconcile steps and the admission webhook, so
the two compute byte-identical annotation values (one implementation, not two). The JSON they
write is what Go's ``encoding/json`` writes for ``PodAvailableConditions``: compact, keys sorted,
an empty map omitted (``{}``), so KusionStack Operating and the Go controller read it unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from resourceconsist import wire
from resourceconsist.errors import ResourceConsistError

Pod = Mapping[str, Any]
_GO_ESCAPES = (
    ("&", "\\u0026"),
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


class MalformedAvailableConditions(ResourceConsistError, ValueError):
    """A pod's ``available-conditions`` annotation is not the JSON PodOpsLifecycle expects."""

    def __init__(self, pod_name: str, value: str, reason: str) -> None:
        shown = value if len(value) <= 120 else value[:117] + "..."
        super().__init__(
            f"pod {pod_name}: annotation {wire.AVAILABLE_CONDITIONS_ANNOTATION} is not valid "
            f'{{"{wire.EXPECTED_FINALIZERS_KEY}": {{...}}}} JSON ({reason}): {shown!r}; '
            "fix or remove the annotation so the controller can manage it"
        )


@functools.lru_cache(maxsize=4096)
def _employer_hash(employer_name: str) -> str:
    return hashlib.md5(employer_name.encode(), usedforsecurity=False).hexdigest()[8:24]


def lifecycle_finalizer(employer_name: str) -> str:
    """The lifecycle finalizer one employer puts on its pods (Go: ``GenerateLifecycleFinalizer``):
    the provider serves the pod for this employer."""
    return f"{wire.LIFECYCLE_FINALIZER_PREFIX}/{_employer_hash(employer_name)}"


def guard_finalizer(employer_name: str) -> str:
    """The guard finalizer one employer puts on a pod before registering it with the provider:
    the provider may hold a registration of the pod for this employer (docs/concepts.md)."""
    return f"{wire.GUARD_FINALIZER_PREFIX}/{_employer_hash(employer_name)}"


#: The name part of a Kubernetes qualified name (``<prefix>/<name>``): at most 63 characters.
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_QUALIFIED_NAME_MAX = 63
_HASH_LENGTH = 16


def readiness_gate(employer_name: str) -> str:
    """The pod readiness-gate condition type of one employer (docs/zero-downtime.md):
    ``<READINESS_GATE_DOMAIN>/<employer name>``, a valid qualified name whatever the name.

    A name that is not a valid name part (longer than 63 characters, e.g. a CRD employer's
    DNS subdomain) becomes its first characters, cleaned, ``-`` and the employer hash the
    finalizers use, so two long names never share a gate."""
    if len(employer_name) <= _QUALIFIED_NAME_MAX and _QUALIFIED_NAME.match(employer_name):
        return f"{wire.READINESS_GATE_DOMAIN}/{employer_name}"
    room = _QUALIFIED_NAME_MAX - _HASH_LENGTH - 1
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", employer_name)[:room].strip("-_.")
    digest = _employer_hash(employer_name)
    return (
        f"{wire.READINESS_GATE_DOMAIN}/{head}-{digest}" if head else f"{wire.READINESS_GATE_DOMAIN}/{digest}"
    )


def is_readiness_gate(condition_type: str) -> bool:
    """Whether a condition type is one of the frame's readiness gates (of any employer)."""
    return condition_type.startswith(wire.READINESS_GATE_DOMAIN + "/")


def readiness_gates(pod: Pod) -> list[str]:
    """The condition types of a pod's ``spec.readinessGates``."""
    return [str(g.get("conditionType", "")) for g in (pod.get("spec") or {}).get("readinessGates") or []]


def pod_condition(pod: Pod, condition_type: str) -> Mapping[str, Any] | None:
    """The pod's condition of that type, None when it has none."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == condition_type:
            return condition  # type: ignore[no-any-return]
    return None


def expected_finalizer_key(kind: str, namespace: str, name: str) -> str:
    """The key of an employer's entry in ``expectedFinalizers``: ``<Kind>/<namespace>/<name>``."""
    return f"{kind}/{namespace}/{name}"


def _name(pod: Pod) -> str:
    return str(pod.get("metadata", {}).get("name", "<unnamed>"))


def get_annotations(obj: Pod) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def get_finalizers(obj: Pod) -> list[str]:
    """A copy of the object's finalizers, for the caller to change."""
    return list(obj.get("metadata", {}).get("finalizers") or [])


def held_finalizers(obj: Pod) -> Sequence[str]:
    """The object's finalizers as stored, for reading only: a pass asks for every pod's several
    times, and a copy each time was a visible share of its CPU at 3000 pods."""
    return obj.get("metadata", {}).get("finalizers") or ()


def expected_finalizers(pod: Pod) -> dict[str, str]:
    """The ``expectedFinalizers`` map of a pod's annotation (empty when absent)."""
    return dict(_expected_entries(pod))


def has_expected_finalizer(pod: Pod, key: str) -> bool:
    """The pod's ``expectedFinalizers`` hold an entry ``key``: what a pass asks of each of its
    pods, without building the map."""
    return any(entry == key for entry, _ in _expected_entries(pod))


def _expected_entries(pod: Pod) -> tuple[tuple[str, str], ...]:
    value = get_annotations(pod).get(wire.AVAILABLE_CONDITIONS_ANNOTATION, "")
    if not value:
        return ()
    parsed = _parse_expected_finalizers(value)
    if isinstance(parsed, str):
        raise MalformedAvailableConditions(_name(pod), value, parsed)
    return parsed


@functools.lru_cache(maxsize=1024)
def _parse_expected_finalizers(value: str) -> tuple[tuple[str, str], ...] | str:
    """The entries of one annotation value, or what is wrong with it. One parse per distinct
    value: the pods of one employer share theirs, and every pass reads them all."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        return f"not JSON: {err.msg}"
    if parsed is None:  # Go's json.Unmarshal reads `null` as the empty struct
        return ()
    if not isinstance(parsed, dict):
        return "not a JSON object"
    entries = parsed.get(wire.EXPECTED_FINALIZERS_KEY)
    if entries is None:
        return ()
    if not isinstance(entries, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in entries.items()
    ):
        return f"{wire.EXPECTED_FINALIZERS_KEY} is not a map of strings"
    return tuple(entries.items())


def render_available_conditions(entries: Mapping[str, str]) -> str:
    """The annotation value for ``entries``, byte-identical to Go's ``json.Marshal``."""
    body: dict[str, Any] = {wire.EXPECTED_FINALIZERS_KEY: dict(sorted(entries.items()))} if entries else {}
    text = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    # Go escapes these even with ensure_ascii off (HTML safety); they only occur inside strings.
    for raw, escaped in _GO_ESCAPES:
        text = text.replace(raw, escaped)
    return text


def updated_available_conditions(
    pod: Pod, *, add: Mapping[str, str] | None = None, remove: Iterable[str] = ()
) -> str | None:
    """The new annotation value after adding ``add`` and removing the keys in ``remove``,
    keeping every other entry; ``None`` when nothing changes (so no write is needed)."""
    current = expected_finalizers(pod)
    wanted = dict(current)
    for key in remove:
        wanted.pop(key, None)
    wanted.update(add or {})
    if wanted == current:
        return None
    if not wanted and not get_annotations(pod).get(wire.AVAILABLE_CONDITIONS_ANNOTATION):
        return None
    return render_available_conditions(wanted)


def updated_finalizers(obj: Pod, *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> list[str] | None:
    """The object's finalizer list with ``add`` appended and ``remove`` dropped, order kept;
    ``None`` when nothing changes."""
    current = get_finalizers(obj)
    dropped = set(remove)
    wanted = [f for f in current if f not in dropped]
    for f in add:
        if f not in wanted:
            wanted.append(f)
    return None if wanted == current else wanted


def is_deleting(obj: Pod) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def is_lifecycle_ready(pod: Pod) -> bool:
    """Not deleting, ``pod.kusionstack.io/service-ready`` True if present, and ready: condition
    ``Ready`` True, or, for a pod carrying one of the frame's readiness gates, ``ContainersReady``
    True and every *other* readiness gate True.

    ``Ready`` waits on the frame's gates, which wait on the provider serving the pod: a gated pod
    must be registered, with the weight of a ready pod, before it can be Ready
    (docs/zero-downtime.md, "The circle")."""
    if is_deleting(pod):
        return False
    status: dict[str, str] = {}
    for condition in (pod.get("status") or {}).get("conditions") or []:
        status[str(condition.get("type"))] = str(condition.get("status"))
    if status.get(wire.SERVICE_READY_CONDITION, "True") != "True":
        return False
    gates = readiness_gates(pod)
    if any(is_readiness_gate(g) for g in gates):
        others = [g for g in gates if not is_readiness_gate(g)]
        return status.get("ContainersReady") == "True" and all(status.get(g) == "True" for g in others)
    return status.get("Ready") == "True"


def json_pointer_escape(segment: str) -> str:
    """Escape one JSON-pointer path segment (RFC 6901), e.g. an annotation key holding ``/``."""
    return segment.replace("~", "~0").replace("/", "~1")


def admission_patch(pod: Pod, new_annotation: str) -> list[dict[str, Any]]:
    """JSON-patch operations that set the ``available-conditions`` annotation of ``pod``."""
    if not pod.get("metadata", {}).get("annotations"):
        return [
            {
                "op": "add",
                "path": "/metadata/annotations",
                "value": {wire.AVAILABLE_CONDITIONS_ANNOTATION: new_annotation},
            }
        ]
    op = "replace" if wire.AVAILABLE_CONDITIONS_ANNOTATION in get_annotations(pod) else "add"
    path = "/metadata/annotations/" + json_pointer_escape(wire.AVAILABLE_CONDITIONS_ANNOTATION)
    return [{"op": op, "path": path, "value": new_annotation}]
