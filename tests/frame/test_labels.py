"""Unit tests for ``resourceconsist.rules.labels``: Service selector maps and metav1.LabelSelector."""

from __future__ import annotations

from typing import Any

import pytest

from resourceconsist.rules.labels import InvalidSelector, label_selector_selects, map_selects, to_query

LABELS = {"app": "web", "tier": "frontend", "kusionstack.io/control": "true"}


# --- Service selector maps ----------------------------------------------------------------


@pytest.mark.parametrize("selector", [None, {}])
@pytest.mark.parametrize("labels", [None, {}, LABELS])
def test_empty_map_selects_nothing(selector: dict[str, str] | None, labels: dict[str, str] | None) -> None:
    assert map_selects(selector, labels) is False


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"app": "web"}, True),
        ({"app": "web", "tier": "frontend"}, True),
        ({"kusionstack.io/control": "true"}, True),
        ({"app": "api"}, False),  # value differs
        ({"app": "web", "tier": "backend"}, False),  # one pair differs
        ({"app": "web", "zone": "a"}, False),  # key missing
        ({"app": "Web"}, False),  # case-sensitive
        ({"app": ""}, False),  # empty value is not "absent"
    ],
)
def test_map_selector_needs_every_pair(selector: dict[str, str], expected: bool) -> None:
    assert map_selects(selector, LABELS) is expected


def test_map_selector_against_missing_labels() -> None:
    assert map_selects({"app": "web"}, None) is False
    assert map_selects({"app": "web"}, {}) is False


def test_map_selector_with_empty_value_matches_empty_label() -> None:
    assert map_selects({"flag": ""}, {"flag": ""}) is True


# --- metav1.LabelSelector -----------------------------------------------------------------


def test_none_label_selector_selects_nothing() -> None:
    assert label_selector_selects(None, LABELS) is False
    assert label_selector_selects(None, {}) is False


@pytest.mark.parametrize(
    "selector",
    [{}, {"matchLabels": {}}, {"matchExpressions": []}, {"matchLabels": None, "matchExpressions": None}],
)
@pytest.mark.parametrize("labels", [None, {}, LABELS])
def test_empty_label_selector_selects_everything(
    selector: dict[str, Any], labels: dict[str, str] | None
) -> None:
    assert label_selector_selects(selector, labels) is True


@pytest.mark.parametrize(
    ("match_labels", "expected"),
    [
        ({"app": "web"}, True),
        ({"app": "web", "tier": "frontend"}, True),
        ({"app": "api"}, False),
        ({"zone": "a"}, False),
        ({"app": "web", "zone": "a"}, False),
    ],
)
def test_match_labels(match_labels: dict[str, str], expected: bool) -> None:
    assert label_selector_selects({"matchLabels": match_labels}, LABELS) is expected


def expr(key: str, operator: str, values: list[str] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"key": key, "operator": operator}
    if values is not None:
        result["values"] = values
    return result


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # In: key present with one of the values.
        (expr("app", "In", ["web", "api"]), True),
        (expr("app", "In", ["api"]), False),
        (expr("zone", "In", ["a", "b"]), False),  # absent key is not In
        # NotIn: key absent, or present with none of the values.
        (expr("app", "NotIn", ["api", "db"]), True),
        (expr("app", "NotIn", ["web"]), False),
        (expr("zone", "NotIn", ["a"]), True),  # absent key is NotIn
        # Exists / DoesNotExist: only the key matters.
        (expr("app", "Exists"), True),
        (expr("app", "Exists", []), True),
        (expr("zone", "Exists"), False),
        (expr("app", "DoesNotExist"), False),
        (expr("zone", "DoesNotExist"), True),
    ],
)
def test_match_expressions(expression: dict[str, Any], expected: bool) -> None:
    assert label_selector_selects({"matchExpressions": [expression]}, LABELS) is expected


def test_exists_matches_an_empty_label_value() -> None:
    selector = {"matchExpressions": [expr("flag", "Exists")]}
    assert label_selector_selects(selector, {"flag": ""}) is True


def test_all_requirements_must_hold() -> None:
    selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            expr("tier", "In", ["frontend", "edge"]),
            expr("zone", "DoesNotExist"),
            expr("kusionstack.io/control", "Exists"),
        ],
    }
    assert label_selector_selects(selector, LABELS) is True
    assert label_selector_selects(selector, {**LABELS, "zone": "a"}) is False
    assert label_selector_selects(selector, {**LABELS, "app": "api"}) is False
    assert label_selector_selects(selector, {**LABELS, "tier": "backend"}) is False


def test_expressions_against_missing_labels() -> None:
    assert label_selector_selects({"matchExpressions": [expr("a", "DoesNotExist")]}, None) is True
    assert label_selector_selects({"matchExpressions": [expr("a", "NotIn", ["x"])]}, None) is True
    assert label_selector_selects({"matchExpressions": [expr("a", "Exists")]}, None) is False
    assert label_selector_selects({"matchExpressions": [expr("a", "In", ["x"])]}, None) is False


@pytest.mark.parametrize("operator", ["Gt", "Lt", "in", "Equals", "", None])
def test_unknown_operator_is_invalid(operator: str | None) -> None:
    selector = {"matchExpressions": [{"key": "app", "operator": operator, "values": ["web"]}]}
    with pytest.raises(InvalidSelector) as excinfo:
        label_selector_selects(selector, LABELS)
    assert "app" in str(excinfo.value)


def test_missing_operator_is_invalid() -> None:
    with pytest.raises(InvalidSelector):
        label_selector_selects({"matchExpressions": [{"key": "app"}]}, LABELS)


def test_invalid_selector_is_a_value_error() -> None:
    assert issubclass(InvalidSelector, ValueError)


@pytest.mark.parametrize(
    "selector",
    [
        # matchLabels already fails for these labels ...
        {"matchLabels": {"app": "api"}, "matchExpressions": [expr("app", "Gt", ["1"])]},
        # ... or an earlier expression does.
        {"matchExpressions": [expr("zone", "Exists"), expr("app", "Gt", ["1"])]},
    ],
)
def test_unknown_operator_is_invalid_whatever_the_labels(selector: dict[str, Any]) -> None:
    # The API server rejects such a selector outright (apimachinery's LabelSelectorAsSelector
    # errors before matching anything); whether it is reported must not depend on which object
    # happens to be tested against it.
    with pytest.raises(InvalidSelector):
        label_selector_selects(selector, LABELS)


# --- query strings ------------------------------------------------------------------------


def test_to_query_is_sorted_and_comma_joined() -> None:
    assert to_query({"tier": "frontend", "app": "web"}) == "app=web,tier=frontend"
    assert to_query({"kusionstack.io/control": "true"}) == "kusionstack.io/control=true"
    assert to_query({}) == ""
