"""What the informer caches keep of each object: field paths, and the transform that keeps only them.

A cached pod decoded whole is about 17 KB of Python objects (containers, volumes, container
statuses...), of which the frame reads a few fields. The pod informer keeps the fields in
``FRAME_POD_FIELDS`` and those the adapters declare (``CachedPodFieldsOptions``,
docs/tutorial.md "Fields the cache keeps"); every other kind is kept whole but for
``metadata.managedFields``. controller-runtime's cache ``TransformFunc`` is the model.

What is kept is interned: the keys every pod repeats, the label pairs and finalizers the pods of
one workload share, and the annotation values the frame writes alike on them.

A field path is dotted: ``spec.readinessGates`` keeps that field whole; a path through a list
keeps the rest of the path in each element (``spec.containers.ports`` keeps each container's
``ports`` and nothing else of it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from resourceconsist import wire
from resourceconsist.kube import KubeObject
from resourceconsist.labels import label_selector_selects

#: What an informer does to each listed or watched object before it is stored.
Transform = Callable[[KubeObject], KubeObject]

#: A parsed set of field paths: each key kept, with the subtree to keep of it (None: all of it).
FieldTree = dict[str, "FieldTree | None"]

#: The fields of a pod the frame reads, and who reads them:
#: - ``metadata`` (all but managedFields): names, labels (selectors), annotations (the
#:   available-conditions record, PodOpsLifecycle), finalizers (the guard), deletionTimestamp,
#:   ownerReferences, resourceVersion (optimistic writes), uid (gate writes), creationTimestamp
#:   (the gate fail-safe);
#: - ``spec.readinessGates``: the gates (docs/zero-downtime.md);
#: - ``status.conditions`` (Ready, ContainersReady, the gates), ``status.phase``, ``status.podIP``
#:   and ``status.podIPs`` (``pod_employee_statuses``, docs/concepts.md).
FRAME_POD_FIELDS: tuple[str, ...] = (
    "apiVersion",
    "kind",
    "metadata",
    "spec.readinessGates",
    "status.conditions",
    "status.phase",
    "status.podIP",
    "status.podIPs",
)

#: Strings longer than this are kept as decoded: long values rarely repeat, and interning costs a hash.
_INTERN_LIMIT = 1024


def field_tree(paths: Iterable[str]) -> FieldTree:
    """The paths as a tree; a path that is a prefix of another keeps the whole field.

    Raises ``ValueError`` on an empty path or an empty part (``spec..ports``), naming it."""
    tree: FieldTree = {}
    for path in paths:
        parts = path.split(".")
        if not path or not all(parts):
            raise ValueError(
                f"field path {path!r} is not a dotted path of field names (e.g. 'spec.containers.ports')"
            )
        node: FieldTree | None = tree
        for i, part in enumerate(parts):
            assert node is not None
            last = i == len(parts) - 1
            if part in node and node[part] is None:
                break  # a shorter path already keeps this whole field
            if last:
                node[part] = None
            else:
                node = node.setdefault(part, {})
    return tree


def intern_all(value: Any) -> Any:
    """``value`` rebuilt with its keys and short strings interned (dicts and lists anew)."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _INTERN_LIMIT else value
    if isinstance(value, dict):
        return {sys.intern(k): intern_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [intern_all(v) for v in value]
    return value


def keep(value: Any, tree: FieldTree) -> Any:
    """What ``tree`` keeps of ``value``, interned; a list keeps the tree in each element."""
    if isinstance(value, dict):
        return {
            sys.intern(k): intern_all(value[k]) if sub is None else keep(value[k], sub)
            for k, sub in tree.items()
            if k in value
        }
    if isinstance(value, list):
        return [keep(v, tree) for v in value]
    return intern_all(value)


def keeping(paths: Iterable[str]) -> Transform:
    """A transform that keeps the fields ``paths`` name, and always ``apiVersion``, ``kind`` and
    ``metadata`` (but for managedFields)."""
    tree = field_tree(("apiVersion", "kind", "metadata", *paths))

    def transform(obj: KubeObject) -> KubeObject:
        kept: KubeObject = keep(trim(obj), tree)
        return kept

    return transform


def trim(obj: KubeObject) -> KubeObject:
    """The object as the caches keep a kind they keep whole: without ``metadata.managedFields``
    (server-side apply's bookkeeping, often half a small pod's bytes), which nothing here or in
    an adapter reads (controller-runtime's transform functions drop it the same way). Changes
    ``obj`` in place."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj


#: The prefixes of the finalizers an employer puts on a pod (the guard, the lifecycle finalizer).
_MARK_FINALIZER_PREFIXES = (wire.GUARD_FINALIZER_PREFIX + "/", wire.LIFECYCLE_FINALIZER_PREFIX + "/")


def carries_marks(pod: KubeObject) -> bool:
    """The pod carries one of the frame's marks: a guard or lifecycle finalizer, an
    ``available-conditions`` annotation, or one of the frame's readiness gates. A pod cache that
    keeps only the pods a label selects keeps these too, whatever their labels: a pod that lost
    the label while an employer holds it must still be released (docs/concepts.md, "Pods the
    caches keep")."""
    meta = pod.get("metadata") or {}
    if any(f.startswith(_MARK_FINALIZER_PREFIXES) for f in meta.get("finalizers") or ()):
        return True
    if wire.AVAILABLE_CONDITIONS_ANNOTATION in (meta.get("annotations") or {}):
        return True
    gates = (pod.get("spec") or {}).get("readinessGates") or ()
    return any(str(g.get("conditionType", "")).startswith(wire.READINESS_GATE_DOMAIN + "/") for g in gates)


def keeping_selected_or_marked(selector: Mapping[str, Any]) -> Callable[[KubeObject], bool]:
    """Which pods a cache limited to ``selector`` (a ``metav1.LabelSelector``) keeps: those it
    selects, and those that carry the frame's marks (``carries_marks``)."""

    def keeps(pod: KubeObject) -> bool:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return label_selector_selects(selector, labels) or carries_marks(pod)

    return keeps
