"""What a pod's marks say about the employers that hold it (resourceconsist/rules/marks.py): the entry
names its employer's finalizers, a bare finalizer is named by a known name or a gate, another
kind's entry keeps its finalizers, the hand-release patch tests what it removes, and
sharding's employer label only widens.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.rules import lifecycle, marks

FLZ = lifecycle.lifecycle_finalizer("web")
GUARD = lifecycle.guard_finalizer("web")


def _pod(finalizer_list: list[str], entries: dict[str, str], gates: Sequence[str] = ()) -> dict[str, Any]:
    annotations = {wire.AVAILABLE_CONDITIONS_ANNOTATION: lifecycle.render_available_conditions(entries)}
    return {
        "metadata": {
            "name": "web-0",
            "namespace": "ns",
            "finalizers": finalizer_list,
            "annotations": annotations,
        },
        "spec": {"readinessGates": [{"conditionType": g} for g in gates]},
    }


def test_the_entry_names_the_employer_of_its_finalizers() -> None:
    pod = _pod(["other/x", GUARD, FLZ], {"Service/ns/web": FLZ})
    (hold,) = marks.holds(pod, "Service")
    assert (hold.key, hold.entry, hold.finalizers) == ("ns/web", "Service/ns/web", (GUARD, FLZ))


def test_a_bare_finalizer_is_named_by_a_known_name_or_a_gate_else_by_its_hash_only() -> None:
    bare = _pod([GUARD], {})
    assert marks.holds(bare, "Service", ["api", "web"])[0].employer == "web"
    gated = _pod([GUARD], {}, gates=[lifecycle.readiness_gate("web")])
    assert marks.holds(gated, "Service")[0].employer == "web"
    (unknown,) = marks.holds(bare, "Service", ["api"])
    assert (unknown.employer, unknown.key, unknown.digest) == ("", "", marks.name_digest("web"))


def test_a_finalizer_another_kind_s_entry_explains_is_not_this_kind_s() -> None:
    pod = _pod([FLZ], {"Gateway/ns/web": FLZ})
    assert marks.holds(pod, "Service") == []
    assert marks.holds(pod, "Gateway")[0].key == "ns/web"


def test_an_entry_without_finalizers_is_a_mark_too() -> None:
    (hold,) = marks.holds(_pod([], {"Service/ns/web": FLZ}), "Service")
    assert (hold.key, hold.finalizers) == ("ns/web", ())


def test_the_release_patch_tests_what_it_removes_and_keeps_other_entries() -> None:
    other = lifecycle.lifecycle_finalizer("api")
    pod = _pod([GUARD, "x/y", FLZ], {"Service/ns/web": FLZ, "Service/ns/api": other})
    (hold,) = [h for h in marks.holds(pod, "Service") if h.employer == "web"]
    ops = marks.release_patch(pod, hold)
    assert ops[:4] == [
        {"op": "test", "path": "/metadata/finalizers/2", "value": FLZ},
        {"op": "remove", "path": "/metadata/finalizers/2"},
        {"op": "test", "path": "/metadata/finalizers/0", "value": GUARD},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    assert ops[5]["value"] == lifecycle.render_available_conditions({"Service/ns/api": other})
    command = shlex.split(marks.release_command(pod, hold))
    assert command[:6] == ["kubectl", "patch", "pod", "web-0", "-n", "ns"]
    assert json.loads(command[-1]) == ops


def test_events_name_the_objects_of_a_kind_they_are_about() -> None:
    events = [
        {"involvedObject": {"kind": "Service", "name": "web"}},
        {"involvedObject": {"kind": "Pod", "name": "web-0"}},
        {"involvedObject": {"kind": "Service"}},
    ]
    assert marks.event_names(events, "Service") == {"web"}


@pytest.mark.parametrize(
    ("current", "names", "widened"),
    [
        (None, ["web"], "web"),  # a first employer: its name
        (None, ["web", "api"], wire.EMPLOYER_LABEL_SHARED),  # several at once
        ("web", ["web"], "web"),  # covered: unchanged
        ("web", ["api"], wire.EMPLOYER_LABEL_SHARED),  # another: shared, never moved
        (wire.EMPLOYER_LABEL_SHARED, ["web"], wire.EMPLOYER_LABEL_SHARED),  # never narrowed
        ("", ["web"], wire.EMPLOYER_LABEL_SHARED),  # a value no shard watches: shared
        (None, [], None),  # no employer: no label
        ("web", [], "web"),
    ],
)
def test_the_employer_label_only_widens(current: str | None, names: list[str], widened: str | None) -> None:
    assert marks.widened_employer_label(current, names) == widened


def test_a_shards_pod_selector_names_its_employers_and_shared_in_one_order() -> None:
    selector = marks.employer_label_selector(["web", "api", "web"])
    assert selector == f"{wire.EMPLOYER_LABEL} in (Shared,api,web)"
    assert marks.employer_label_selector([]) == f"{wire.EMPLOYER_LABEL} in (Shared)"
    assert marks.unlabelled_for("web") == f"{wire.EMPLOYER_LABEL} notin (web,Shared)"
