"""The webhook's pure parts: the path convention, employer references, AdmissionReview parsing,
and the pod mutation, which must be byte-identical to what ``resourceconsist.rules.lifecycle`` (the
controller's implementation) computes for the same employers."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.rules import lifecycle
from resourceconsist.webhook import (
    ControlledServiceAdapter,
    EmployerRef,
    InvalidAdapterName,
    WebhookAdapter,
    pod_mutation,
    webhook_path,
)
from resourceconsist.webhook.admission import (
    BadReview,
    MalformedPod,
    Verdict,
    field_path,
    parse_review,
    read_pod,
    review_response,
    spec_mutation,
    validate_pod,
)

EMPLOYERS = (EmployerRef("Service", "ns", "web"), EmployerRef("Service", "ns", "api"))


def _pod(annotations: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "labels": {"app": "web"}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}


def _apply(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply the two JSON-patch shapes ``lifecycle.admission_patch`` emits (RFC 6902 add/replace
    on the annotations map or one key of it), as the API server does."""
    out = json.loads(json.dumps(pod))
    for op in patch:
        assert op["op"] in ("add", "replace")
        if op["path"] == "/metadata/annotations":
            out["metadata"]["annotations"] = op["value"]
        else:
            prefix = "/metadata/annotations/"
            assert op["path"].startswith(prefix)
            key = op["path"][len(prefix) :].replace("~1", "/").replace("~0", "~")
            out["metadata"]["annotations"][key] = op["value"]
    return out


EXISTING = json.dumps({"expectedFinalizers": {"Service/ns/old": "prot.podopslifecycle.kusionstack.io/x"}})


@pytest.mark.parametrize(
    "annotations",
    [
        None,
        {},
        {"other": "kept"},
        {wire.AVAILABLE_CONDITIONS_ANNOTATION: ""},
        {wire.AVAILABLE_CONDITIONS_ANNOTATION: EXISTING, "other": "kept"},
        # Go-style spacing and key order of a value another writer left: merged, not copied.
        {wire.AVAILABLE_CONDITIONS_ANNOTATION: '{ "expectedFinalizers" : { "Z/ns/z": "f" } }'},
    ],
    ids=["no-annotations", "empty-map", "other-annotation", "empty-value", "existing-entry", "go-formatted"],
)
def test_the_mutation_is_byte_identical_to_the_lifecycle_module(annotations: dict[str, str] | None) -> None:
    pod = _pod(annotations)
    expected = lifecycle.updated_available_conditions(
        pod, add={e.expected_finalizer_key: e.lifecycle_finalizer for e in EMPLOYERS}
    )
    assert expected is not None
    patched = _apply(pod, pod_mutation(pod, EMPLOYERS))
    assert patched["metadata"]["annotations"][wire.AVAILABLE_CONDITIONS_ANNOTATION] == expected
    # Everything else on the pod is untouched, entries already there included.
    for key, value in (annotations or {}).items():
        if key != wire.AVAILABLE_CONDITIONS_ANNOTATION:
            assert patched["metadata"]["annotations"][key] == value
    entries = lifecycle.expected_finalizers(patched)
    assert entries["Service/ns/web"] == lifecycle.lifecycle_finalizer("web")
    assert entries["Service/ns/api"] == lifecycle.lifecycle_finalizer("api")
    if annotations and annotations.get(wire.AVAILABLE_CONDITIONS_ANNOTATION):
        assert lifecycle.expected_finalizers(pod).items() <= entries.items()


def test_no_patch_when_nothing_changes_and_no_read_of_a_foreign_value_without_employers() -> None:
    full = _apply(_pod(None), pod_mutation(_pod(None), EMPLOYERS))
    assert pod_mutation(full, EMPLOYERS) == []
    assert pod_mutation(_pod(None), []) == []
    # No employers: the annotation is none of our business, even when it is malformed.
    assert pod_mutation(_pod({wire.AVAILABLE_CONDITIONS_ANNOTATION: "{oops"}), []) == []
    with pytest.raises(lifecycle.MalformedAvailableConditions, match="not JSON"):
        pod_mutation(_pod({wire.AVAILABLE_CONDITIONS_ANNOTATION: "{oops"}), EMPLOYERS)


def test_employer_refs_build_the_wire_key_and_finalizer() -> None:
    ref = EmployerRef.of({"kind": "Service", "metadata": {"namespace": "ns", "name": "web"}})
    assert ref.expected_finalizer_key == "Service/ns/web"
    # md5("web") = 2567a5ec9705eb7ac2c984033e06189d; characters 8..24
    assert ref.lifecycle_finalizer == "prot.podopslifecycle.kusionstack.io/9705eb7ac2c98403"
    assert EmployerRef.of({"metadata": {"namespace": "n", "name": "x"}}, kind="Service").kind == "Service"
    with pytest.raises(ValueError, match="no kind"):
        EmployerRef.of({"metadata": {"namespace": "n", "name": "x"}})


def test_path_convention() -> None:
    assert webhook_path("alibabacloudslb") == "/mutating-alibabacloudslb"
    for bad in ("", "Upper", "with/slash", "-lead", "a" * 64, "under_score"):
        with pytest.raises(InvalidAdapterName):
            webhook_path(bad)
    with pytest.raises(InvalidAdapterName):
        ControlledServiceAdapter("Bad Name")
    assert isinstance(ControlledServiceAdapter("generic"), WebhookAdapter)


def _review(**request: Any) -> bytes:
    base: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "ns",
        "object": _pod(None),
    }
    base.update(request)
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}
    ).encode()


def test_parse_review_names_what_is_wrong() -> None:
    review = parse_review(_review(dryRun=None, futureField={"x": 1}))
    assert review.request.uid == "u-1" and not review.request.dry_run
    with pytest.raises(BadReview, match="not JSON"):
        parse_review(b"\x00\xffgarbage")
    with pytest.raises(BadReview, match="apiVersion"):
        parse_review(_review().replace(b"admission.k8s.io/v1", b"admission.k8s.io/v1beta1"))
    with pytest.raises(BadReview, match="request"):
        parse_review(b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}')
    with pytest.raises(BadReview, match=r"request\.uid"):
        parse_review(_review(uid=""))
    with pytest.raises(ValueError, match=r"metadata\.labels"):
        validate_pod({"metadata": {"labels": {"a": 1}}})
    with pytest.raises(ValueError, match="missing"):
        validate_pod(None)
    # Strict: the API server writes a bool as a bool; "yes" is a broken review, not a dry run.
    with pytest.raises(BadReview, match=r"request\.dryRun: must be true or false, got \"yes\""):
        parse_review(_review(dryRun="yes"))
    with pytest.raises(BadReview, match="the body: must be an object, got null"):
        parse_review(b"null")


def test_field_paths_are_json_paths_that_quote_keys_with_dots_and_slashes() -> None:
    assert (
        field_path(("spec", "readinessGates", 0, "conditionType"), "x")
        == "spec.readinessGates[0].conditionType"
    )
    assert field_path(("metadata", "labels", "kusionstack.io/control"), "x") == (
        'metadata.labels["kusionstack.io/control"]'
    )
    assert field_path((), "request.object") == "request.object"


def test_a_malformed_pod_names_each_field_and_counts_the_rest() -> None:
    pod = _pod(None)
    pod["metadata"]["annotations"] = {"a": 1}
    pod["spec"] = {"readinessGates": [1, "x", {}], "containers": [{"lifecycle": {"preStop": 3}}]}
    with pytest.raises(MalformedPod) as err:
        read_pod(pod)
    assert err.value.path == "metadata.annotations.a"
    assert [path for path, _ in err.value.problems] == [
        "metadata.annotations.a",
        "spec.readinessGates[0]",
        "spec.readinessGates[1]",
        "spec.readinessGates[2].conditionType",
        "spec.containers[0].lifecycle.preStop",
    ]
    assert str(err.value) == (
        "request.object is not a valid Pod: metadata.annotations.a: must be a string, got 1; "
        "spec.readinessGates[0]: must be an object, got 1; "
        'spec.readinessGates[1]: must be an object, got "x"; and 2 more'
    )
    # The spec mutation reads through the same reader: it refuses rather than crashes.
    with pytest.raises(MalformedPod, match=r"spec\.readinessGates\[0\]"):
        spec_mutation({**_pod(None), "spec": {"readinessGates": [1]}}, EMPLOYERS)
    # Fields the webhook does not read are the API server's business.
    assert (
        read_pod({**_pod(None), "status": 1, "spec": {"containers": [], "nodeName": 7}}).spec.containers == []
    )


def test_an_annotation_escaping_a_lone_surrogate_is_refused_not_patched() -> None:
    pod = _pod({wire.AVAILABLE_CONDITIONS_ANNOTATION: '{"expectedFinalizers": {"\\ud800": "f"}}'})
    with pytest.raises(lifecycle.MalformedAvailableConditions, match="lone surrogate") as err:
        pod_mutation(pod, EMPLOYERS)
    named = MalformedPod.from_annotation(err.value)
    assert named.path == f'metadata.annotations["{wire.AVAILABLE_CONDITIONS_ANNOTATION}"]'
    assert str(named).startswith(f"request.object is not a valid Pod: {named.path}: pod p: annotation ")


def test_review_response_shapes() -> None:
    patch = ({"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}},)
    allowed = review_response("u", Verdict.allow("ok", patch))["response"]
    assert allowed["allowed"] is True and allowed["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(allowed["patch"])) == list(patch)
    denied = review_response("u", Verdict.deny(500, "boom"))["response"]
    assert denied == {
        "uid": "u",
        "allowed": False,
        "status": {"status": "Failure", "message": "boom", "reason": "InternalError", "code": 500},
    }
