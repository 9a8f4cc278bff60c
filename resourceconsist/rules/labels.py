"""Label selectors: matching objects' labels the way the API server does.

Two forms exist on the wire: a Service's plain ``spec.selector`` map (every pair must match;
an empty map selects nothing, as for Service endpoints) and a ``metav1.LabelSelector``
(``matchLabels`` + ``matchExpressions``; an empty one selects everything).
"""

from __future__ import annotations

import re
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


#: A label key (an optional DNS-subdomain prefix and ``/``, then a name) or value, as the API
#: server accepts them; checked loosely here, strictly by the API server on the first LIST.
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_SET = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")


def parse_selector(text: str) -> dict[str, Any]:
    """The ``labelSelector`` query string (``a=b,c!=d,e in (f,g),h,!i``) as a
    ``metav1.LabelSelector`` (``label_selector_selects`` matches it as the API server does).

    Raises ``InvalidSelector`` naming the requirement at fault; an empty string is refused (it
    would select everything: give no selector instead)."""
    requirements = _split_requirements(text)
    if not requirements:
        raise InvalidSelector(f"label selector {text!r} is empty: give e.g. 'kusionstack.io/control=true'")
    match_labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for requirement in requirements:
        found = _SET.match(requirement)
        if found:
            key, op, values = found.group(1), found.group(2), [v.strip() for v in found.group(3).split(",")]
            expressions.append(
                {
                    "key": _key(key, text),
                    "operator": "In" if op == "in" else "NotIn",
                    "values": [_value(v, text) for v in values],
                }
            )
        elif "!=" in requirement:
            key, _, value = requirement.partition("!=")
            expressions.append({"key": _key(key, text), "operator": "NotIn", "values": [_value(value, text)]})
        elif "=" in requirement:
            key, _, value = requirement.partition("==" if "==" in requirement else "=")
            match_labels[_key(key, text)] = _value(value, text)
        elif requirement.startswith("!"):
            expressions.append({"key": _key(requirement[1:], text), "operator": "DoesNotExist"})
        else:
            expressions.append({"key": _key(requirement, text), "operator": "Exists"})
    return {"matchLabels": match_labels, "matchExpressions": expressions}


def _split_requirements(text: str) -> list[str]:
    """The comma-separated requirements of a selector string; commas inside ``( )`` stay."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _key(key: str, selector: str) -> str:
    return _checked(key, _KEY, "a label key (e.g. 'app' or 'kusionstack.io/control')", selector)


def _value(value: str, selector: str) -> str:
    return _checked(
        value, _VALUE, "a label value (alphanumerics, '-', '_', '.', at most 63 characters)", selector
    )


def _checked(part: str, pattern: re.Pattern[str], what: str, selector: str) -> str:
    """``part`` stripped, when ``pattern`` matches it; else ``InvalidSelector`` saying it is not ``what``."""
    part = part.strip()
    if not pattern.match(part):
        raise InvalidSelector(f"label selector {selector!r}: {part!r} is not {what}")
    return part
