"""Unit tests for ``resourceconsist.rules.lifecycle``: PodOpsLifecycle annotation and finalizer rules.

Expected JSON literals were produced by Go's ``encoding/json`` (``json.Marshal``) for
``struct{ ExpectedFinalizers map[string]string `json:"expectedFinalizers,omitempty"` }``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from resourceconsist.rules import lifecycle
from resourceconsist.rules.lifecycle import (
    MalformedAvailableConditions,
    admission_patch,
    expected_finalizer_key,
    expected_finalizers,
    has_expected_finalizer,
    is_deleting,
    is_lifecycle_ready,
    json_pointer_escape,
    lifecycle_finalizer,
    render_available_conditions,
    updated_available_conditions,
    updated_finalizers,
)

ANNOTATION = "pod.kusionstack.io/available-conditions"
SERVICE_READY = "pod.kusionstack.io/service-ready"
PREFIX = "prot.podopslifecycle.kusionstack.io/"


def pod(
    name: str = "web-0",
    *,
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    conditions: list[dict[str, str]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    result: dict[str, Any] = {"metadata": metadata}
    if conditions is not None:
        result["status"] = {"conditions": conditions}
    return result


def with_entries(entries: dict[str, str], name: str = "web-0") -> dict[str, Any]:
    return pod(name, annotations={ANNOTATION: json.dumps({"expectedFinalizers": entries})})


def md5_finalizer(employer_name: str) -> str:
    return PREFIX + hashlib.md5(employer_name.encode("utf-8")).hexdigest()[8:24]


# --- lifecycle finalizer and entry key ----------------------------------------------------


@pytest.mark.parametrize("employer", ["demo-svc", "a", "", "resource-consist-ut-svc", "服务-ü"])
def test_lifecycle_finalizer_is_prefix_plus_md5_hex_8_to_24(employer: str) -> None:
    finalizer = lifecycle_finalizer(employer)
    assert finalizer == md5_finalizer(employer)
    suffix = finalizer.removeprefix(PREFIX)
    assert len(suffix) == 16
    assert all(c in "0123456789abcdef" for c in suffix)


def test_lifecycle_finalizer_literals() -> None:
    # Pinned from Go's GenerateLifecycleFinalizer.
    assert lifecycle_finalizer("demo-svc") == "prot.podopslifecycle.kusionstack.io/ccccca6af890783e"
    assert lifecycle_finalizer("") == "prot.podopslifecycle.kusionstack.io/8f00b204e9800998"
    assert (
        lifecycle_finalizer("resource-consist-ut-svc")
        == "prot.podopslifecycle.kusionstack.io/abb2deba1db11299"
    )


def test_lifecycle_finalizer_differs_per_employer() -> None:
    assert lifecycle_finalizer("svc-a") != lifecycle_finalizer("svc-b")


def test_expected_finalizer_key() -> None:
    assert expected_finalizer_key("Service", "ns", "name") == "Service/ns/name"
    assert expected_finalizer_key("CustomKind", "default", "x-1") == "CustomKind/default/x-1"


# --- rendering (byte-identical to Go) -----------------------------------------------------


def test_render_empty_map_is_omitted() -> None:
    assert render_available_conditions({}) == "{}"


def test_render_is_compact_with_sorted_keys() -> None:
    entries = {
        "Service/ns/b": "prot.podopslifecycle.kusionstack.io/x",
        "Service/ns/a": "y",
    }
    expected = (
        '{"expectedFinalizers":{"Service/ns/a":"y","Service/ns/b":"prot.podopslifecycle.kusionstack.io/x"}}'
    )
    assert render_available_conditions(entries) == expected


def test_render_single_entry_literal() -> None:
    key = "Service/default/demo-svc"
    assert render_available_conditions({key: lifecycle_finalizer("demo-svc")}) == (
        '{"expectedFinalizers":{"Service/default/demo-svc":'
        '"prot.podopslifecycle.kusionstack.io/ccccca6af890783e"}}'
    )


def test_render_escapes_like_go_encoding_json() -> None:
    # Go's json.Marshal escapes <, >, & and U+2028/U+2029 and writes other non-ASCII as UTF-8.
    # Output of Go for the same map (go run, encoding/json):
    go_output = '{"expectedFinalizers":{"Service/ns/a\\u0026\\u003c\\u003e":"v\\u2028\\u2029é"}}'
    assert render_available_conditions({"Service/ns/a&<>": "v\u2028\u2029é"}) == go_output


def test_render_round_trips_through_parse() -> None:
    entries = {"Service/ns/b": "fb", "Service/ns/a": "fa"}
    value = render_available_conditions(entries)
    assert expected_finalizers(pod(annotations={ANNOTATION: value})) == entries


# --- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [
        pod(),
        pod(annotations={}),
        {"metadata": {"name": "x", "annotations": None}},
        {},
        pod(annotations={ANNOTATION: ""}),
        pod(annotations={"other": "value"}),
        pod(annotations={ANNOTATION: "{}"}),
        pod(annotations={ANNOTATION: '{"expectedFinalizers":null}'}),
        pod(annotations={ANNOTATION: '{"expectedFinalizers":{}}'}),
    ],
)
def test_parse_absent_or_empty_is_an_empty_map(p: dict[str, Any]) -> None:
    assert expected_finalizers(p) == {}


def test_parse_reads_entries_and_ignores_unknown_top_level_fields() -> None:
    value = '{ "other": [1, 2], "expectedFinalizers": {"Service/ns/a": "fa", "Service/ns/b": "fb"} }'
    assert expected_finalizers(pod(annotations={ANNOTATION: value})) == {
        "Service/ns/a": "fa",
        "Service/ns/b": "fb",
    }


def test_has_expected_finalizer_answers_as_the_map_does() -> None:
    value = '{"expectedFinalizers": {"Service/ns/a": "fa", "Service/ns/b": "fb"}}'
    p = pod(annotations={ANNOTATION: value})
    for key in ("Service/ns/a", "Service/ns/b", "Service/ns/c", "fa"):
        assert has_expected_finalizer(p, key) == (key in expected_finalizers(p))
    assert not has_expected_finalizer(pod(), "Service/ns/a")
    with pytest.raises(MalformedAvailableConditions, match="broken"):
        has_expected_finalizer(pod("broken", annotations={ANNOTATION: "[]"}), "Service/ns/a")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("not json", "not JSON"),
        ("{", "not JSON"),
        ('{"expectedFinalizers": {"a": "b"}', "not JSON"),
        ("[]", "not a JSON object"),
        ('["expectedFinalizers"]', "not a JSON object"),
        ('"text"', "not a JSON object"),
        ("42", "not a JSON object"),
        ("true", "not a JSON object"),
        ('{"expectedFinalizers": {"Service/ns/a": 1}}', "not a map of strings"),
        ('{"expectedFinalizers": {"Service/ns/a": null}}', "not a map of strings"),
        ('{"expectedFinalizers": {"Service/ns/a": {"x": "y"}}}', "not a map of strings"),
        ('{"expectedFinalizers": {"Service/ns/a": "ok", "Service/ns/b": ["x"]}}', "not a map of strings"),
        ('{"expectedFinalizers": ["Service/ns/a"]}', "not a map of strings"),
        ('{"expectedFinalizers": "Service/ns/a"}', "not a map of strings"),
        ('{"expectedFinalizers": 1}', "not a map of strings"),
    ],
)
def test_malformed_annotation_raises_with_pod_name_and_advice(value: str, reason: str) -> None:
    p = pod("broken-pod", annotations={ANNOTATION: value})
    with pytest.raises(MalformedAvailableConditions) as excinfo:
        expected_finalizers(p)
    message = str(excinfo.value)
    assert "broken-pod" in message
    assert ANNOTATION in message
    assert reason in message
    assert "fix or remove the annotation" in message


@pytest.mark.parametrize("value", ["[]", "0", '""', "false"])
def test_falsy_non_map_expected_finalizers_is_malformed(value: str) -> None:
    # Go's json.Unmarshal rejects these ("cannot unmarshal array/number/string/bool into Go
    # struct field PodAvailableConditions.expectedFinalizers of type map[string]string"), and
    # so must we: they are not a map of strings, whatever their truthiness.
    p = pod("falsy-pod", annotations={ANNOTATION: '{"expectedFinalizers": ' + value + "}"})
    with pytest.raises(MalformedAvailableConditions, match="falsy-pod"):
        expected_finalizers(p)


def test_malformed_error_is_a_value_error_and_truncates_long_values() -> None:
    assert issubclass(MalformedAvailableConditions, ValueError)
    long_value = "x" * 500
    with pytest.raises(MalformedAvailableConditions) as excinfo:
        expected_finalizers(pod("p", annotations={ANNOTATION: long_value}))
    message = str(excinfo.value)
    assert "x" * 117 + "..." in message
    assert "x" * 118 not in message


def test_malformed_annotation_also_raises_on_update() -> None:
    p = pod("broken", annotations={ANNOTATION: "nope"})
    with pytest.raises(MalformedAvailableConditions, match="broken"):
        updated_available_conditions(p, add={"Service/ns/a": "fa"})
    with pytest.raises(MalformedAvailableConditions, match="broken"):
        updated_available_conditions(p, remove=["Service/ns/a"])


# --- merging ------------------------------------------------------------------------------


def test_add_to_pod_without_annotation() -> None:
    key = expected_finalizer_key("Service", "default", "demo-svc")
    value = updated_available_conditions(pod(), add={key: lifecycle_finalizer("demo-svc")})
    assert value == (
        '{"expectedFinalizers":{"Service/default/demo-svc":'
        '"prot.podopslifecycle.kusionstack.io/ccccca6af890783e"}}'
    )


def test_add_keeps_other_employers_entries() -> None:
    p = with_entries({"Service/ns/z-other": "fz", "Service/ns/a-other": "fa"})
    value = updated_available_conditions(p, add={"Service/ns/mine": "fm"})
    assert value == (
        '{"expectedFinalizers":{"Service/ns/a-other":"fa","Service/ns/mine":"fm","Service/ns/z-other":"fz"}}'
    )


def test_add_replaces_a_stale_value_of_our_own_entry() -> None:
    p = with_entries({"Service/ns/mine": "old", "Service/ns/other": "fo"})
    value = updated_available_conditions(p, add={"Service/ns/mine": "new"})
    assert value == '{"expectedFinalizers":{"Service/ns/mine":"new","Service/ns/other":"fo"}}'


def test_remove_keeps_other_employers_entries() -> None:
    p = with_entries({"Service/ns/mine": "fm", "Service/ns/other": "fo"})
    value = updated_available_conditions(p, remove=["Service/ns/mine"])
    assert value == '{"expectedFinalizers":{"Service/ns/other":"fo"}}'


def test_removing_the_last_entry_writes_empty_object() -> None:
    p = with_entries({"Service/ns/mine": "fm"})
    assert updated_available_conditions(p, remove=["Service/ns/mine"]) == "{}"


def test_add_and_remove_together() -> None:
    p = with_entries({"Service/ns/old": "fo", "Service/ns/keep": "fk"})
    value = updated_available_conditions(p, add={"Service/ns/new": "fn"}, remove=["Service/ns/old"])
    assert value == '{"expectedFinalizers":{"Service/ns/keep":"fk","Service/ns/new":"fn"}}'


@pytest.mark.parametrize(
    ("p", "kwargs"),
    [
        # Entry already there with the same value (even written non-canonically).
        (
            with_entries({"Service/ns/mine": "fm", "Service/ns/other": "fo"}),
            {"add": {"Service/ns/mine": "fm"}},
        ),
        (
            pod(annotations={ANNOTATION: '{ "expectedFinalizers" : { "Service/ns/mine" : "fm" } }'}),
            {"add": {"Service/ns/mine": "fm"}},
        ),
        # Removing an entry that is not there.
        (with_entries({"Service/ns/other": "fo"}), {"remove": ["Service/ns/mine"]}),
        (pod(), {"remove": ["Service/ns/mine"]}),
        (pod(annotations={"unrelated": "x"}), {"remove": ["Service/ns/mine"]}),
        (pod(annotations={ANNOTATION: "{}"}), {"remove": ["Service/ns/mine"]}),
        # Nothing asked.
        (with_entries({"Service/ns/other": "fo"}), {}),
        (pod(), {"add": {}, "remove": []}),
    ],
)
def test_no_op_returns_none(p: dict[str, Any], kwargs: dict[str, Any]) -> None:
    assert updated_available_conditions(p, **kwargs) is None


def test_update_does_not_mutate_the_pod() -> None:
    p = with_entries({"Service/ns/other": "fo"})
    before = copy.deepcopy(p)
    updated_available_conditions(p, add={"Service/ns/mine": "fm"}, remove=["Service/ns/other"])
    assert p == before


def test_remove_accepts_any_iterable() -> None:
    p = with_entries({"Service/ns/a": "fa", "Service/ns/b": "fb"})
    value = updated_available_conditions(p, remove=(k for k in ["Service/ns/a"]))
    assert value == '{"expectedFinalizers":{"Service/ns/b":"fb"}}'


# --- finalizers ---------------------------------------------------------------------------


def test_updated_finalizers_appends_and_keeps_order() -> None:
    p = pod(finalizers=["z", "a", "m"])
    assert updated_finalizers(p, add=["new"]) == ["z", "a", "m", "new"]


def test_updated_finalizers_removes_and_keeps_order() -> None:
    p = pod(finalizers=["z", "a", "m"])
    assert updated_finalizers(p, remove=["a"]) == ["z", "m"]


def test_updated_finalizers_add_and_remove() -> None:
    p = pod(finalizers=["keep-1", "drop", "keep-2"])
    assert updated_finalizers(p, add=["new-1", "keep-1", "new-2"], remove=["drop"]) == [
        "keep-1",
        "keep-2",
        "new-1",
        "new-2",
    ]


def test_updated_finalizers_adds_each_once() -> None:
    assert updated_finalizers(pod(), add=["f", "f"]) == ["f"]


def test_updated_finalizers_on_pod_without_finalizers() -> None:
    assert updated_finalizers(pod(), add=[md5_finalizer("demo-svc")]) == [
        "prot.podopslifecycle.kusionstack.io/ccccca6af890783e"
    ]
    assert updated_finalizers({}, add=["f"]) == ["f"]
    assert updated_finalizers(pod(finalizers=["only"]), remove=["only"]) == []


@pytest.mark.parametrize(
    ("finalizers", "kwargs"),
    [
        (["a", "b"], {"add": ["b"]}),
        (["a", "b"], {"remove": ["c"]}),
        (["a", "b"], {"add": ["a"], "remove": ["c"]}),
        (["a", "b"], {}),
        (None, {"remove": ["a"]}),
        ([], {"remove": ["a"]}),
    ],
)
def test_updated_finalizers_unchanged_returns_none(
    finalizers: list[str] | None, kwargs: dict[str, Any]
) -> None:
    assert updated_finalizers(pod(finalizers=finalizers), **kwargs) is None


def test_updated_finalizers_does_not_mutate_the_object() -> None:
    p = pod(finalizers=["a", "b"])
    result = updated_finalizers(p, add=["c"], remove=["a"])
    assert result == ["b", "c"]
    assert p["metadata"]["finalizers"] == ["a", "b"]


# --- readiness ----------------------------------------------------------------------------


def ready(status: str) -> dict[str, str]:
    return {"type": "Ready", "status": status}


def service_ready(status: str) -> dict[str, str]:
    return {"type": SERVICE_READY, "status": status}


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (pod(conditions=[ready("True")]), True),
        (pod(conditions=[ready("True"), service_ready("True")]), True),
        (pod(conditions=[service_ready("True"), ready("True")]), True),
        (pod(conditions=[{"type": "PodScheduled", "status": "False"}, ready("True")]), True),
        (pod(conditions=[ready("False")]), False),
        (pod(conditions=[ready("Unknown")]), False),
        (pod(conditions=[ready("True"), service_ready("False")]), False),
        (pod(conditions=[service_ready("False"), ready("True")]), False),
        (pod(conditions=[ready("True"), service_ready("Unknown")]), False),
        (pod(conditions=[ready("True"), {"type": SERVICE_READY}]), False),
        (pod(conditions=[service_ready("True")]), False),  # no Ready condition
        (pod(conditions=[]), False),
        (pod(), False),  # no status
        (pod(conditions=[ready("True")], deleting=True), False),
        (pod(conditions=[ready("True"), service_ready("True")], deleting=True), False),
    ],
)
def test_is_lifecycle_ready(p: dict[str, Any], expected: bool) -> None:
    assert is_lifecycle_ready(p) is expected


def test_is_deleting() -> None:
    assert is_deleting(pod(deleting=True))
    assert not is_deleting(pod())
    assert not is_deleting({"metadata": {"deletionTimestamp": None}})
    assert not is_deleting({})


# --- admission patch ----------------------------------------------------------------------


def unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal RFC 6902 ``add``/``replace`` on object members (enough for these patches)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [unescape(s) for s in op["path"].split("/")[1:]]
        target = doc
        for segment in parents:
            target = target[segment]
        if op["op"] == "replace":
            assert last in target, "replace needs an existing member"
        else:
            assert op["op"] == "add"
        target[last] = op["value"]
    return doc


def test_json_pointer_escape() -> None:
    assert json_pointer_escape(ANNOTATION) == "pod.kusionstack.io~1available-conditions"
    assert json_pointer_escape("a~b/c~/d") == "a~0b~1c~0~1d"
    assert json_pointer_escape("~1") == "~01"  # "~" first, so "~1" is not read back as "/"
    assert json_pointer_escape("plain") == "plain"


@pytest.mark.parametrize("p", [pod(), pod(annotations={}), {"metadata": {"name": "x", "annotations": None}}])
def test_admission_patch_without_annotations_adds_the_map(p: dict[str, Any]) -> None:
    ops = admission_patch(p, "{}")
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: "{}"}}]
    assert apply_patch(p, ops)["metadata"]["annotations"] == {ANNOTATION: "{}"}


def test_admission_patch_adds_the_key_next_to_other_annotations() -> None:
    p = pod(annotations={"team": "a"})
    value = '{"expectedFinalizers":{"Service/ns/a":"fa"}}'
    ops = admission_patch(p, value)
    assert ops == [
        {
            "op": "add",
            "path": "/metadata/annotations/pod.kusionstack.io~1available-conditions",
            "value": value,
        }
    ]
    assert apply_patch(p, ops)["metadata"]["annotations"] == {"team": "a", ANNOTATION: value}


def test_admission_patch_replaces_an_existing_annotation() -> None:
    p = pod(annotations={"team": "a", ANNOTATION: '{"expectedFinalizers":{"Service/ns/a":"fa"}}'})
    value = '{"expectedFinalizers":{"Service/ns/a":"fa","Service/ns/b":"fb"}}'
    ops = admission_patch(p, value)
    assert ops == [
        {
            "op": "replace",
            "path": "/metadata/annotations/pod.kusionstack.io~1available-conditions",
            "value": value,
        }
    ]
    assert apply_patch(p, ops)["metadata"]["annotations"] == {"team": "a", ANNOTATION: value}


def test_admission_patch_replaces_even_an_empty_existing_value() -> None:
    p = pod(annotations={ANNOTATION: ""})
    ops = admission_patch(p, "{}")
    assert [op["op"] for op in ops] == ["replace"]


def test_get_helpers_tolerate_missing_metadata() -> None:
    assert lifecycle.get_annotations({}) == {}
    assert lifecycle.get_finalizers({}) == []
    assert lifecycle.get_finalizers(pod(finalizers=["a"])) == ["a"]
