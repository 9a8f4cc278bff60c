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

import msgspec

from resourceconsist import wire
from resourceconsist.cluster.kube import KubeObject, decode_json
from resourceconsist.rules.labels import label_selector_selects

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


class Keeping:
    """The transform that keeps the fields ``paths`` name, and always ``apiVersion``, ``kind`` and
    ``metadata`` (but for managedFields); made by ``keeping``.

    It also decodes: ``decode_event`` and ``decode_list`` turn a watch line and a LIST answer into
    what the transform keeps without building the rest (msgspec skips the fields no struct
    names), so a pod's containers, volumes and statuses never become Python objects. A value of
    a shape the paths do not foresee (a list of scalars where they go through objects) is
    decoded whole and transformed: the result is the same either way."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.tree = field_tree(("apiVersion", "kind", "metadata", *paths))
        kept = _struct_of(self.tree, "Kept", top=True)
        event = msgspec.defstruct("KeptEvent", [("type", str, ""), ("object", kept | None, None)])
        page = msgspec.defstruct(
            "KeptList",
            [("metadata", dict[str, Any], {}), ("items", list[kept] | None, None)],  # type: ignore[valid-type]
        )
        # Decoders of structs made at run time: what they return is typed Any.
        self._event: msgspec.json.Decoder[Any] = msgspec.json.Decoder(event)
        self._page: msgspec.json.Decoder[Any] = msgspec.json.Decoder(page)

    def __call__(self, obj: KubeObject) -> KubeObject:
        kept: KubeObject = keep(trim(obj), self.tree)
        return kept

    def decode_event(self, line: bytes) -> KubeObject:
        """A watch line (``{"type", "object"}``) with only the kept fields of its object; an
        ERROR event's Status whole."""
        try:
            event = self._event.decode(line)
        except msgspec.ValidationError:
            return self._whole_event(line)
        if event.type == "ERROR":
            return self._whole_event(line)
        return {"type": event.type, "object": self._interned(event.object)}

    def decode_list(self, body: bytes) -> KubeObject:
        """A LIST answer with only the kept fields of each item."""
        try:
            page = self._page.decode(body)
        except msgspec.ValidationError:
            whole: KubeObject = decode_json(body)
            whole["items"] = [self(item) for item in whole.get("items") or ()]
            return whole
        return {"metadata": page.metadata, "items": [self._interned(item) for item in page.items or ()]}

    def _whole_event(self, line: bytes) -> KubeObject:
        event: KubeObject = decode_json(line)
        if event.get("type") != "ERROR" and isinstance(event.get("object"), dict):
            event["object"] = self(event["object"])
        return event

    @staticmethod
    def _interned(kept: Any) -> Any:
        return None if kept is None else intern_all(msgspec.to_builtins(kept))


def keeping(paths: Iterable[str]) -> Keeping:
    """The transform that keeps the fields ``paths`` name (``Keeping``)."""
    return Keeping(paths)


#: ObjectMeta's fields but ``managedFields`` (k8s.io/apimachinery's ``metav1.ObjectMeta``): what
#: a kept object's ``metadata`` holds, as ``trim`` leaves it.
OBJECT_META_FIELDS: tuple[str, ...] = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
)


def _struct_of(tree: FieldTree, name: str, *, top: bool = False) -> Any:
    """The msgspec struct that decodes what ``tree`` keeps of an object; absent fields stay
    absent. Field names are positional and renamed to the JSON keys, which need not be Python
    names."""
    fields: list[tuple[str, Any, Any]] = []
    rename: dict[str, str] = {}
    for i, (key, sub) in enumerate(tree.items()):
        if top and key == "metadata" and sub is None:
            kind: Any = _struct_of(dict.fromkeys(OBJECT_META_FIELDS), "KeptMeta") | None
        elif sub is None:
            kind = Any
        else:
            # A value the tree goes through: an object, a list of them (the tree kept in each),
            # a scalar, or null, as ``keep`` takes them.
            inner = _struct_of(sub, f"{name}_{i}")
            kind = inner | list[inner] | str | int | float | bool | None  # type: ignore[valid-type]
        fields.append((f"f{i}", kind, msgspec.UNSET))
        rename[f"f{i}"] = key
    return msgspec.defstruct(name, fields, rename=rename, omit_defaults=True)


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
