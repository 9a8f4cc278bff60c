"""Label selectors: matching objects' labels the way the API server does.

Two forms exist on the wire: a Service's plain ``spec.selector`` map (every pair must match;
an empty map selects nothing, as for Service endpoints) and a ``metav1.LabelSelector``
(``matchLabels`` + ``matchExpressions``; an empty one selects everything).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resourceconsist.errors import ResourceConsistError

_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


class InvalidSelector(ResourceConsistError, ValueError):
    """A LabelSelector that the API server would reject."""


def map_selects(selector: Mapping[str, str] | None, labels: Mapping[str, str] | None) -> bool:
    """A Service-style selector map: non-empty and every pair present in ``labels``."""
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def label_selector_selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A ``metav1.LabelSelector``: ``matchLabels`` and every ``matchExpressions`` entry hold."""
    if selector is None:
        return False
    labels = labels or {}
    expressions = selector.get("matchExpressions") or []
    for expr in expressions:
        # The API server rejects such a selector outright; do not let the labels decide.
        if expr.get("operator") not in _OPERATORS:
            raise InvalidSelector(
                f"unknown label selector operator {expr.get('operator')!r} for key {expr.get('key')!r}"
            )
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in expressions:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise InvalidSelector(f"unknown label selector operator {op!r} for key {key!r}")
        if not ok:
            return False
    return True


def to_query(selector: Mapping[str, str]) -> str:
    """A selector map as the ``labelSelector`` query string (``a=b,c=d``)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
