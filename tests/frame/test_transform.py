"""Lean pod caches (resourceconsist.cluster.transform): what the pod informer keeps, that everything the
frame and the built-in adapter read of a pod reads the same from the lean copy as from the whole
pod the API server sends, and that fields an adapter declares are kept (and filled in when
declared while the cache runs)."""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import CachedPodFieldsOptions, pod_employee_statuses
from resourceconsist.adapters.alibabacloudslb import SLBAdapter, config
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.manage import _pod_rank, _waits_on
from resourceconsist.adapters.alibabacloudslb.slbclient import SLBClient
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import InformerFactory, WatchEvent
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.cluster.transform import FRAME_POD_FIELDS, field_tree, keeping
from resourceconsist.reconcile.profile import AdapterProfile, declared_pod_fields
from resourceconsist.rules import gates, lifecycle, marks
from resourceconsist.testing import LocalControlPlane, async_wait_for

GATE = lifecycle.readiness_gate("web")
GUARD = lifecycle.guard_finalizer("web")
LIFECYCLE = lifecycle.lifecycle_finalizer("web")


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    yield client
    client.close()


# -- the transform ---------------------------------------------------------------------------------


def test_a_path_through_a_list_keeps_its_rest_in_each_element_and_a_shorter_path_keeps_all() -> None:
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "managedFields": [{"manager": "x"}], "labels": {"a": "b"}},
        "spec": {
            "containers": [
                {"name": "a", "image": "i", "ports": [{"name": "http", "containerPort": 80}]},
                {"name": "b", "image": "j"},
            ],
            "volumes": [{"name": "v"}],
            "nodeName": "n",
        },
        "status": {"containerStatuses": [{"name": "a"}], "podIP": "10.0.0.1"},
    }
    kept = keeping(["spec.containers.ports", "spec.containers.name", "status.podIP"])(pod)
    assert kept == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {
            "containers": [{"name": "a", "ports": [{"name": "http", "containerPort": 80}]}, {"name": "b"}]
        },
        "status": {"podIP": "10.0.0.1"},
    }
    assert field_tree(["spec.containers.ports", "spec"]) == field_tree(["spec"]) == {"spec": None}
    assert field_tree(["spec", "spec.containers.ports"]) == {"spec": None}


@pytest.mark.parametrize("path", ["", "spec..ports", ".spec", "spec."])
def test_a_path_that_is_not_dotted_field_names_is_refused_naming_it(path: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"field path {path!r} is not a dotted path")):
        field_tree([path])


def test_what_pods_repeat_is_one_object_in_memory() -> None:
    lean = keeping(FRAME_POD_FIELDS)

    def decoded(name: str) -> KubeObject:
        text = json.dumps(
            {
                "metadata": {"name": name, "labels": {"app": "web-frontend"}, "finalizers": [LIFECYCLE]},
                "status": {"conditions": [{"type": GATE, "status": "True"}]},
            }
        )
        return lean(json.loads(text))  # each its own decode, as each watch event is

    a, b = decoded("a"), decoded("b")
    assert a["metadata"]["labels"]["app"] is b["metadata"]["labels"]["app"]
    assert a["metadata"]["finalizers"][0] is b["metadata"]["finalizers"][0]
    assert a["status"]["conditions"][0]["type"] is b["status"]["conditions"][0]["type"]
    assert next(iter(a["metadata"]["labels"])) is next(iter(b["metadata"]["labels"]))


# -- the lean decoders -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "paths",
    [
        FRAME_POD_FIELDS,
        # An adapter's: through a list of objects, a whole list, a scalar.
        (*FRAME_POD_FIELDS, "spec.containers.ports", "spec.tolerations", "status.hostIP"),
        # Through a list of scalars (``args``): a shape a struct cannot take, decoded whole.
        (*FRAME_POD_FIELDS, "spec.containers.args.x", "spec.containers.name"),
    ],
    ids=["frame", "adapter", "scalars"],
)
def test_the_lean_decoders_keep_what_the_transform_keeps_of_the_whole_object(paths: tuple[str, ...]) -> None:
    pod = {"kind": "Pod", "apiVersion": "v1", **_rich_pod("web-0"), **_status(ready=True, gate=True)}
    pod["metadata"] |= {"namespace": "ns", "uid": "u-1", "resourceVersion": "7", "managedFields": [{"a": 1}]}
    pod["spec"]["containers"][0]["args"] = ["--serve"]
    lean = keeping(paths)
    whole = lean(json.loads(json.dumps(pod)))
    assert "managedFields" not in whole["metadata"] and "volumes" not in whole["spec"]

    for kind in ("ADDED", "MODIFIED", "DELETED"):
        line = json.dumps({"type": kind, "object": pod}).encode()
        assert lean.decode_event(line) == {"type": kind, "object": whole}
    item = {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}  # as LIST items come
    page = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": [item, item]})
    listed = lean.decode_list(page.encode())
    assert listed["metadata"] == {"resourceVersion": "9"}
    assert listed["items"] == [lean(json.loads(json.dumps(item)))] * 2
    assert lean.decode_list(b'{"metadata":{"resourceVersion":"1"},"items":null}')["items"] == []


def test_the_lean_decoders_pass_errors_whole_and_share_what_pods_repeat() -> None:
    lean = keeping(FRAME_POD_FIELDS)
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    assert lean.decode_event(json.dumps({"type": "ERROR", "object": gone}).encode()) == {
        "type": "ERROR",
        "object": gone,
    }
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "12"}}
    assert lean.decode_event(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode()) == {
        "type": "BOOKMARK",
        "object": bookmark,
    }

    def decoded(name: str) -> KubeObject:
        pod = {"metadata": {"name": name, "labels": {"app": "web-frontend"}, "finalizers": [LIFECYCLE]}}
        return lean.decode_event(json.dumps({"type": "ADDED", "object": pod}).encode())["object"]

    a, b = decoded("a"), decoded("b")
    assert a["metadata"]["labels"]["app"] is b["metadata"]["labels"]["app"]
    assert a["metadata"]["finalizers"][0] is b["metadata"]["finalizers"][0]


# -- what the frame reads, on a real pod -----------------------------------------------------------


def _rich_pod(name: str) -> KubeObject:
    """A pod with what a Deployment's pods carry besides what the frame reads."""
    return {
        "metadata": {
            "name": name,
            "labels": {"app": "web", "pod-template-hash": "abc"},
            "annotations": {
                wire.AVAILABLE_CONDITIONS_ANNOTATION: lifecycle.render_available_conditions(
                    {lifecycle.expected_finalizer_key("Service", "ns", "web"): LIFECYCLE}
                ),
                "example.com/note": "kept",
            },
            "finalizers": [GUARD, LIFECYCLE],
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": "0b8e8c4e-0000-4000-8000-000000000001",
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example.com/web:1",
                    "ports": [{"name": "http", "containerPort": 9090}],
                    "env": [{"name": "A", "value": "b"}],
                    "resources": {"requests": {"cpu": "100m"}},
                    "readinessProbe": {"httpGet": {"path": "/", "port": 9090}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            "readinessGates": [{"conditionType": GATE}, {"conditionType": "example.com/other"}],
        },
    }


def _status(ready: bool, gate: bool) -> dict[str, Any]:
    now = "2026-11-24T05:00:00Z"

    def condition(type_: str, status: bool) -> dict[str, Any]:
        return {
            "type": type_,
            "status": str(status),
            "lastTransitionTime": now,
            "reason": "R",
            "message": "m",
        }

    return {
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "podIPs": [{"ip": "10.0.0.7"}, {"ip": "fd00::7"}],
            "hostIP": "192.168.0.1",
            "conditions": [
                condition("ContainersReady", ready),
                condition("Ready", ready and gate),
                condition(GATE, gate),
                condition("example.com/other", True),
            ],
        }
    }


def _reads(pod: KubeObject) -> dict[str, Any]:
    """Everything the frame, explain's pod view and the SLB adapter read of one pod."""
    named_port = {
        "metadata": {"name": "web", "namespace": "ns", "annotations": {config.PORT_ANNOTATION: "http"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    now = datetime.datetime(2026, 11, 24, 5, 10, tzinfo=datetime.UTC)
    decisions = {
        (serving, timeout): gates.decide(
            pod,
            GATE,
            employer="ns/web",
            employer_deleting=False,
            employed=True,
            serving=serving,
            timeout=timeout,
            now=now,
        )
        for serving in (True, False, None)
        for timeout in (None, 60.0)
    }
    return {
        "key": kube.object_key(pod),
        "name_namespace": (pod["metadata"]["name"], pod["metadata"]["namespace"]),
        "labels": pod["metadata"]["labels"],
        "uid_rv": (pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]),
        "owners": pod["metadata"]["ownerReferences"],
        "gates": lifecycle.readiness_gates(pod),
        "conditions": {t: lifecycle.pod_condition(pod, t) for t in ("Ready", "ContainersReady", GATE)},
        "finalizers": lifecycle.get_finalizers(pod),
        "annotations": lifecycle.get_annotations(pod),
        "expected": lifecycle.expected_finalizers(pod),
        "deleting": lifecycle.is_deleting(pod),
        "deletion": pod["metadata"].get("deletionTimestamp"),
        "lifecycle_ready": lifecycle.is_lifecycle_ready(pod),
        "statuses": pod_employee_statuses(pod),
        "holds": marks.holds(pod, "Service"),
        "gate_names": marks.gate_names(pod),
        "waiting_since": gates.waiting_since(pod, GATE),
        "decisions": decisions,
        "patch": gates.condition_patch(pod, GATE, gates.GateState(True, wire.GateReason.SERVING, "m"), now),
        "phase": (pod.get("status") or {}).get("phase"),
        "slb_ip": config.pod_ip(pod),
        "slb_port": config.backend_port(named_port, pod),
        "slb_waits": _waits_on(pod, GATE),
        "slb_rank": _pod_rank(pod, {pod["metadata"]["name"]}),
    }


def _started_recording(factory: InformerFactory) -> list[WatchEvent]:
    """Start the factory's pod informer; the events it sends, as they come."""
    seen: list[WatchEvent] = []
    factory.informer(kube.POD).add_handler(seen.append)
    factory.start(asyncio.get_running_loop())
    return seen


async def test_the_frame_reads_of_a_lean_pod_what_it_reads_of_the_whole_pod(
    kc: KubeClient, namespace: str
) -> None:
    factory = InformerFactory(kc)
    with SLBEmulator() as emulator:
        client = SLBClient(emulator.credentials())
        factory.keep_pod_fields(AdapterProfile.of(SLBAdapter(client)).pod_fields)
        client.close()
    seen = _started_recording(factory)
    try:
        await factory.wait_synced()
        reader = factory.reader()
        for name, ready, gate in (
            ("ready", True, True),
            ("waiting", True, False),
            ("starting", False, False),
        ):
            await asyncio.to_thread(kc.create, kube.POD, namespace, _rich_pod(name))
            await asyncio.to_thread(
                kc.patch, kube.POD, namespace, name, _status(ready, gate), subresource="status"
            )
        # Deleting: the finalizers hold it, with its deletionTimestamp set.
        await asyncio.to_thread(kc.delete, kube.POD, namespace, "starting")
        for name in ("ready", "waiting", "starting"):
            whole = await asyncio.to_thread(kc.get, kube.POD, namespace, name)
            rv = whole["metadata"]["resourceVersion"]
            await async_wait_for(
                lambda name=name, rv=rv: _rv(reader.get(kube.POD, namespace, name)) == rv,
                timeout=10,
                message=f"pod {name} at resourceVersion {rv} in the cache",
            )
            lean = reader.get(kube.POD, namespace, name)
            assert lean is not None
            assert "volumes" not in lean["spec"] and "hostIP" not in lean["status"], "the lean copy is lean"
            assert "managedFields" not in lean["metadata"]
            assert _reads(lean) == _reads(whole), name
            assert _reads(whole)["slb_port"] == 9090  # the declared field, found in the cache
        assert lifecycle.is_deleting(reader.get(kube.POD, namespace, "starting") or {})
        # A watch event carries the lean pod too: adapters' predicates and handlers read it.
        assert all("volumes" not in e.obj.get("spec", {}) for e in seen)
    finally:
        for name in ("ready", "waiting", "starting"):
            await asyncio.to_thread(kc.patch, kube.POD, namespace, name, {"metadata": {"finalizers": None}})
        factory.stop()


def _rv(pod: KubeObject | None) -> str | None:
    return None if pod is None else pod["metadata"].get("resourceVersion")


class _ReadsNodes(CachedPodFieldsOptions):
    def get_cached_pod_fields(self) -> list[str]:
        return ["spec.nodeName"]


async def test_a_field_declared_while_the_cache_runs_is_filled_in_without_events(
    kc: KubeClient, namespace: str
) -> None:
    pod = _rich_pod("bound")
    pod["spec"]["nodeName"] = "node-a"
    pod["metadata"]["finalizers"] = []
    await asyncio.to_thread(kc.create, kube.POD, namespace, pod)
    factory = InformerFactory(kc)
    informer = factory.informer(kube.POD)
    seen = _started_recording(factory)
    try:
        await factory.wait_synced()
        reader = factory.reader()
        assert "nodeName" not in (reader.get(kube.POD, namespace, "bound") or {})["spec"]
        relists = informer.relists
        factory.keep_pod_fields(declared_pod_fields(_ReadsNodes()))
        await factory.wait_synced()  # waits for the list that fills the field in
        assert (reader.get(kube.POD, namespace, "bound") or {})["spec"]["nodeName"] == "node-a"
        assert informer.relists == relists + 1
        factory.keep_pod_fields(["spec.nodeName", "spec.readinessGates"])  # nothing new: no list
        await factory.wait_synced()
        assert informer.relists == relists + 1
        assert [e.type for e in seen if e.obj["metadata"]["name"] == "bound"] == ["ADDED"], (
            "an unchanged pod listed again sends no event"
        )
        # The watch runs on after the list: a change still arrives, with the new field.
        await asyncio.to_thread(
            kc.patch, kube.POD, namespace, "bound", {"metadata": {"labels": {"app": "x"}}}
        )
        await async_wait_for(
            lambda: (reader.get(kube.POD, namespace, "bound") or {})["metadata"]["labels"].get("app") == "x",
            timeout=10,
            message="the relabelled pod in the cache",
        )
        assert (reader.get(kube.POD, namespace, "bound") or {})["spec"]["nodeName"] == "node-a"
    finally:
        factory.stop()


def test_a_bad_declared_path_is_refused_before_anything_changes(kc: KubeClient) -> None:
    factory = InformerFactory(kc)
    with pytest.raises(ValueError, match=re.escape("'spec..nodeName' is not a dotted path")):
        factory.keep_pod_fields(["spec.containers.ports", "spec..nodeName"])
    kept = factory.informer(kube.POD).transform({"spec": {"containers": [{"ports": [], "image": "i"}]}})
    assert kept == {"spec": {}}, "nothing of the refused declaration is kept"
