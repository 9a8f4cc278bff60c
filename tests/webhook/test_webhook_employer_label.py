"""The employer label the webhook stamps on new pods when asked (``WebhookOptions.pod_employer_label``,
``--pod-employer-label``; docs/scaling.md, "Pods selected by the API server"): the name of the
pod's one Service employer, else ``Shared``, only ever widened; nothing when off, and the
patch byte-identical to the one without the option."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import InformerFactory
from resourceconsist.cluster.kube import ApiError, KubeClient, KubeObject
from resourceconsist.commands import cli
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle, marks
from resourceconsist.testing import LocalControlPlane, async_wait_for
from resourceconsist.webhook import (
    ControlledServiceAdapter,
    EmployerRef,
    WebhookOptions,
    WebhookServer,
    pod_mutation,
)
from resourceconsist.webhook.admission import AdmissionRequest, decide

KEY_PATH = "/metadata/labels/resource-consist.kusionstack.io~1employer"
WEB = EmployerRef("Service", "ns", "web")
API = EmployerRef("Service", "ns", "api")


def _pod(labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}


def _label_ops(patch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [op for op in patch if op["path"].startswith("/metadata/labels")]


def _apply_labels(pod: dict[str, Any], patch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Apply the label operations of ``patch`` as the API server does (RFC 6902 add/replace of
    the labels map or of one key of it)."""
    out: dict[str, Any] = json.loads(json.dumps(pod))
    for op in _label_ops(patch):
        if op["path"] == "/metadata/labels":
            assert op["op"] == "add"
            out["metadata"]["labels"] = op["value"]
            continue
        key = op["path"].removeprefix("/metadata/labels/").replace("~1", "/").replace("~0", "~")
        assert (op["op"] == "replace") == (key in out["metadata"]["labels"])
        out["metadata"]["labels"][key] = op["value"]
    return out


def test_one_service_employer_gives_its_name() -> None:
    pod = _pod({"app": "web"})
    patch = pod_mutation(pod, [WEB], employer_label=True)
    assert _label_ops(patch) == [{"op": "add", "path": KEY_PATH, "value": "web"}]
    assert marks.employer_label(_apply_labels(pod, patch)) == "web"
    assert _apply_labels(pod, patch)["metadata"]["labels"]["app"] == "web"


def test_two_service_employers_give_shared() -> None:
    patch = pod_mutation(_pod({"app": "web"}), [WEB, API], employer_label=True)
    assert _label_ops(patch) == [{"op": "add", "path": KEY_PATH, "value": wire.EMPLOYER_LABEL_SHARED}]


def test_a_pod_labelled_with_its_employer_gets_no_label_op() -> None:
    pod = _pod({"app": "web", wire.EMPLOYER_LABEL: "web"})
    assert _label_ops(pod_mutation(pod, [WEB], employer_label=True)) == []
    shared = _pod({wire.EMPLOYER_LABEL: wire.EMPLOYER_LABEL_SHARED})
    assert _label_ops(pod_mutation(shared, [WEB, API], employer_label=True)) == []


def test_a_pod_labelled_with_another_employer_is_widened_to_shared() -> None:
    pod = _pod({"app": "web", wire.EMPLOYER_LABEL: "api"})
    patch = pod_mutation(pod, [WEB], employer_label=True)
    assert _label_ops(patch) == [{"op": "replace", "path": KEY_PATH, "value": wire.EMPLOYER_LABEL_SHARED}]
    assert marks.employer_label(_apply_labels(pod, patch)) == wire.EMPLOYER_LABEL_SHARED


def test_no_employers_no_label_op() -> None:
    assert pod_mutation(_pod({"app": "web"}), [], employer_label=True) == []
    assert pod_mutation(_pod(), [], employer_label=True) == []


def test_only_service_employers_count() -> None:
    widget = EmployerRef("Widget", "ns", "w")
    patch = pod_mutation(_pod({"app": "web"}), [widget], employer_label=True)
    # The widget's entry is merged; the label is for the shards of Services only.
    assert patch and _label_ops(patch) == []
    patch = pod_mutation(_pod({"app": "web"}), [widget, WEB], employer_label=True)
    assert _label_ops(patch) == [{"op": "add", "path": KEY_PATH, "value": "web"}]


@pytest.mark.parametrize("labels", [None, {}], ids=["no-labels", "empty-labels"])
def test_a_pod_without_labels_gets_the_whole_map(labels: dict[str, str] | None) -> None:
    pod = _pod(labels)
    patch = pod_mutation(pod, [WEB], employer_label=True)
    assert _label_ops(patch) == [
        {"op": "add", "path": "/metadata/labels", "value": {wire.EMPLOYER_LABEL: "web"}}
    ]
    assert _apply_labels(pod, patch)["metadata"]["labels"] == {wire.EMPLOYER_LABEL: "web"}


@pytest.mark.parametrize(
    "labels",
    [None, {"app": "web"}, {"app": "web", wire.EMPLOYER_LABEL: "api"}],
    ids=["no-labels", "labels", "labelled"],
)
def test_off_the_patch_is_the_one_without_the_option(labels: dict[str, str] | None) -> None:
    gating = EmployerRef("Service", "ns", "web", readiness_gate=True, drain_seconds=5)
    pod = {**_pod(labels), "spec": {"containers": [{"name": "c"}]}}
    patch = pod_mutation(pod, [gating, API])
    assert _label_ops(patch) == []
    assert pod_mutation(pod, [gating, API], employer_label=False) == patch
    # On, the same operations and the label's, nothing else.
    on = pod_mutation(pod, [gating, API], employer_label=True)
    assert [op for op in on if op not in _label_ops(on)] == patch
    assert len(_label_ops(on)) == 1


def _request(pod: KubeObject) -> AdmissionRequest:
    return AdmissionRequest.model_validate(
        {
            "uid": "u",
            "kind": {"kind": "Pod", "version": "v1"},
            "operation": "CREATE",
            "namespace": "ns",
            "object": pod,
        }
    )


async def test_decide_stamps_the_label_only_when_asked() -> None:
    async def employers_of(pod: KubeObject) -> tuple[EmployerRef, ...]:
        return (WEB,)

    pod = _pod({"app": "web"})
    off = await decide(_request(pod), "generic", employers_of, 1.0)
    on = await decide(_request(pod), "generic", employers_of, 1.0, employer_label=True)
    assert _label_ops(off.verdict.patch) == []
    assert _label_ops(on.verdict.patch) == [{"op": "add", "path": KEY_PATH, "value": "web"}]
    assert [op for op in on.verdict.patch if op not in _label_ops(on.verdict.patch)] == list(
        off.verdict.patch
    )


def test_the_webhook_command_takes_the_flag() -> None:
    def options(*argv: str) -> WebhookOptions:
        with cli.webhook.make_context("webhook", ["--adapter", "demo", *argv]) as ctx:
            flags = dict(ctx.params)
        # What the webhook command builds from its flags.
        return dataclasses.replace(
            cli._webhook_options(flags), pod_employer_label=flags["pod_employer_label"]
        )

    assert WebhookOptions().pod_employer_label is False
    assert options().pod_employer_label is False
    assert options("--pod-employer-label").pod_employer_label is True
    assert options("--no-pod-employer-label").pod_employer_label is False


# -- against the real API server ------------------------------------------------------------------

CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
POD_CREATE = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> KubeClient:
    return KubeClient.from_kubeconfig(str(control_plane.kubeconfig))


def _service(name: str, selector: dict[str, str]) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": CONTROLLED},
        "spec": {"selector": selector, "ports": [{"port": 80}]},
    }


def _new_pod(name: str, labels: dict[str, str]) -> KubeObject:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


async def test_pods_created_through_the_api_server_come_out_labelled(
    control_plane: LocalControlPlane, kc: KubeClient, namespace: str, tmp_path: Path
) -> None:
    cert, key = control_plane.webhook_certificate()
    shutil.copy(cert, tmp_path / "tls.crt")
    shutil.copy(key, tmp_path / "tls.key")
    server = WebhookServer(
        [ControlledServiceAdapter("generic")],
        WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path, bootstrap=None, pod_employer_label=True),
        informers=InformerFactory(kc),
        own_informers=True,
    )
    await server.start()
    name = f"rc-test-{namespace}-label"
    try:
        await server.wait_ready(timeout=30)
        for svc in (
            _service("web", {"app": "web"}),
            _service("web-canary", {"app": "web", "track": "canary"}),
        ):
            await call_adapter(kc.create, kube.SERVICE, namespace, svc)
        canary = {**CONTROLLED, "app": "web", "track": "canary"}
        await async_wait_for(
            lambda: (
                len(
                    server.reader.services_selecting({"metadata": {"namespace": namespace, "labels": canary}})
                )
                == 2
            ),
            timeout=10,
            message="the Service cache to hold both Services",
        )
        await asyncio.to_thread(
            control_plane.install_webhook,
            name,
            port=server.port,
            path="/mutating-generic",
            rules=POD_CREATE,
            object_selector={"matchLabels": CONTROLLED},
            namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        )
        names = itertools.count()

        async def labelled() -> bool:
            # The API server reads configurations asynchronously: new pods until one is mutated.
            try:
                pod = await call_adapter(
                    kc.create,
                    kube.POD,
                    namespace,
                    _new_pod(f"web-{next(names)}", {**CONTROLLED, "app": "web"}),
                )
            except ApiError:
                return False
            return marks.employer_label(pod) == "web"

        await async_wait_for(labelled, timeout=30, interval=0.2, message="a pod labelled by the webhook")
        both = await call_adapter(kc.create, kube.POD, namespace, _new_pod("both", canary))
        assert marks.employer_label(both) == wire.EMPLOYER_LABEL_SHARED
        assert len(lifecycle.expected_finalizers(both)) == 2
        # No employer: no label.
        alone = await call_adapter(
            kc.create, kube.POD, namespace, _new_pod("alone", {**CONTROLLED, "app": "db"})
        )
        assert marks.employer_label(alone) is None
    finally:
        with contextlib.suppress(kube.NotFound):
            await asyncio.to_thread(kc.delete, kube.MUTATING_WEBHOOK_CONFIGURATION, None, name)
        await server.stop()
