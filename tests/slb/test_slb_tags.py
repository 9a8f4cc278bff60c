"""The SLB adapter's tags and garbage search (docs/alibabacloudslb.md, "Tags and the garbage
search"), through the real SDK to the SLB emulator: the cluster name manage mode needs, the tags
a created group carries, groups from before the tags adopted on their Service's next pass, groups
of another cluster never listed or changed, the search's call budget counted at the emulator, and
the CLI flags that set the same settings as the environment."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import click
import pytest

from resourceconsist.adapter import ReconcileContext
from resourceconsist.adapters import registry
from resourceconsist.adapters.alibabacloudslb import (
    CLUSTER_NAME_ENV,
    CLUSTER_TAG,
    GARBAGE_CALL_BUDGET_ENV,
    LOAD_BALANCER_ID_LABEL,
    LOAD_BALANCERS_ENV,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SERVICE_NAME_TAG,
    SERVICE_NAMESPACE_TAG,
    SERVICE_UID_TAG,
    SLBAdapter,
    SLBConfigError,
    SLBSettings,
)
from resourceconsist.adapters.alibabacloudslb.credentials import (
    SLB_ACCESS_KEY_ENV,
    SLB_ACCESS_SECRET_ENV,
    SLB_ENDPOINT_ENV,
)
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import BackendServer, SLBClient, SLBError
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.commands.cli import _adapter_environ
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, async_wait_for, finalizers

CLUSTER = "prod-a"
OTHER = "prod-b"
UID = "3f6c1a52-7d7e-4d5e-9a53-0d8f2a1b9c11"


class ServicesReader:
    """The frame's cache as the SLB adapter reads it: Services (and no pods)."""

    def __init__(self, *services: KubeObject) -> None:
        self.services = list(services)

    def list(self, resource: Resource, *_: Any) -> list[KubeObject]:
        return list(self.services) if resource is kube.SERVICE else []

    def pods_selected_by(self, service: KubeObject) -> list[KubeObject]:
        return []

    def pods_with_finalizer(self, namespace: str, finalizer: str) -> list[KubeObject]:
        return []

    def pods_with_readiness_gate(self, namespace: str, condition_type: str) -> list[KubeObject]:
        return []


def _service(lb: str, name: str = "web", namespace: str = "ns", uid: str = UID) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": {"kusionstack.io/control": "true", LOAD_BALANCER_ID_LABEL: lb},
            "annotations": {MODE_ANNOTATION: "manage"},
        },
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def _ctx(*services: KubeObject, key: str = "") -> ReconcileContext:
    return ReconcileContext(reader=ServicesReader(*services), controller="c", employer_key=key)  # type: ignore[arg-type]


def _tags(cluster: str, name: str = "web", uid: str = UID) -> dict[str, str]:
    return {CLUSTER_TAG: cluster, SERVICE_NAMESPACE_TAG: "ns", SERVICE_NAME_TAG: name, SERVICE_UID_TAG: uid}


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(seed=3) as emulator:
        yield emulator


@pytest.fixture
def client(slb: SLBEmulator) -> Iterator[SLBClient]:
    with SLBClient(slb.credentials()) as sdk_client:
        yield sdk_client


async def test_manage_mode_without_a_cluster_name_says_what_to_set_and_calls_nothing(
    slb: SLBEmulator, client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    adapter = SLBAdapter(client)
    service = _service(lb)
    ctx = _ctx(service, key="ns/web")
    with pytest.raises(SLBConfigError) as raised:
        await adapter.get_expected_employer(ctx, service)
    assert CLUSTER_NAME_ENV in str(raised.value) and "--slb-cluster-name" in str(raised.value)
    with pytest.raises(SLBConfigError):
        await adapter.get_current_employee(ctx, service)
    assert await adapter.list_owned(_ctx(service)) == []
    assert slb.calls == [], "nothing is read or written without a cluster name"


def test_a_bad_cluster_name_or_budget_is_refused_at_start_naming_the_setting(client: SLBClient) -> None:
    with pytest.raises(SLBConfigError, match="cluster_name='prod a'"):
        SLBAdapter(client, cluster_name="prod a")
    with pytest.raises(SLBConfigError, match=CLUSTER_NAME_ENV):
        SLBSettings.from_env({CLUSTER_NAME_ENV: "-bad-"})
    with pytest.raises(SLBConfigError, match=GARBAGE_CALL_BUDGET_ENV):
        SLBSettings.from_env({GARBAGE_CALL_BUDGET_ENV: "0"})
    with pytest.raises(SLBConfigError, match="garbage_call_budget"):
        SLBAdapter(client, cluster_name=CLUSTER, garbage_call_budget=0)
    settings = SLBSettings.from_env(
        {CLUSTER_NAME_ENV: " prod-a ", LOAD_BALANCERS_ENV: "lb-1, lb-2,", GARBAGE_CALL_BUDGET_ENV: "7"}
    )
    assert settings == SLBSettings(
        cluster_name=CLUSTER, load_balancers=("lb-1", "lb-2"), garbage_call_budget=7
    )


async def test_a_created_group_carries_the_cluster_and_service_tags(
    slb: SLBEmulator, client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    adapter = SLBAdapter(client, cluster_name=CLUSTER)
    service = _service(lb)
    ctx = _ctx(service, key="ns/web")
    expected = await adapter.get_expected_employer(ctx, service)
    assert await adapter.get_current_employer(ctx, service) == []
    done, failed = await adapter.create_employer(ctx, service, expected)
    assert done == expected and failed == []
    (group,) = slb.vserver_groups(lb)
    assert group.name == "resourceconsist/ns/web"
    assert group.tags == _tags(CLUSTER)
    (create,) = slb.calls_of("CreateVServerGroup")
    # One call: the group never exists untagged.
    assert {create.params[f"Tag.{n}.Key"]: create.params[f"Tag.{n}.Value"] for n in range(1, 5)} == _tags(
        CLUSTER
    )


async def test_a_group_from_before_the_tags_is_tagged_on_its_services_next_pass(
    slb: SLBEmulator, client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    legacy = slb.add_vserver_group(lb, "resourceconsist/ns/web")
    adapter = SLBAdapter(client, cluster_name=CLUSTER)
    service = _service(lb)
    ctx = _ctx(service, key="ns/web")
    (current,) = await adapter.get_current_employer(ctx, service)
    assert current.statuses.vserver_group_id == legacy  # type: ignore[union-attr]
    assert slb.vserver_group_tags(legacy) == _tags(CLUSTER)
    assert [g.id for g in slb.vserver_groups(lb)] == [legacy], "adopted, not duplicated"
    (tag_call,) = slb.calls_of("TagResources")
    assert tag_call.params["ResourceId.1"] == legacy
    # The next pass finds the tags in place and writes nothing.
    slb.reset_calls()
    await adapter.get_current_employer(_ctx(service, key="ns/web"), service)
    assert slb.mutating_calls() == []


async def test_a_refused_tagging_never_stops_the_service_and_is_said_once(
    slb: SLBEmulator, client: SLBClient, caplog: pytest.LogCaptureFixture
) -> None:
    # SLB's documentation names no ResourceType for VServer groups in TagResources: if an
    # account's API refuses it, the group must keep serving (docs/alibabacloudslb.md).
    lb = slb.add_load_balancer()
    legacy = slb.add_vserver_group(lb, "resourceconsist/ns/web")
    adapter = SLBAdapter(client, cluster_name=CLUSTER)
    # What an adapter has said is its own: another adapter of the process (another controller
    # name) says the refusal once too.
    other = SLBAdapter(client, cluster_name=CLUSTER, name="other-slb")
    service = _service(lb)
    slb.fail_next("TagResources", times=4, code="InvalidParameter.ResourceType", status=400)
    with caplog.at_level(logging.INFO):
        for each in (adapter, adapter, other, other):
            (current,) = await each.get_current_employer(_ctx(service, key="ns/web"), service)
            assert current.statuses.vserver_group_id == legacy  # type: ignore[union-attr]
    assert slb.vserver_group_tags(legacy) == {}, "the refused call changed nothing"
    refusals = [r for r in caplog.records if "refused tagging" in r.getMessage()]
    assert len(refusals) == 2 and all(r.levelno == logging.WARNING for r in refusals)
    assert [r.getMessage().split()[0] for r in refusals] == [adapter.name, "other-slb"]
    assert legacy in refusals[0].getMessage() and "--slb-load-balancer" in refusals[0].getMessage()


async def test_a_group_of_another_cluster_is_never_listed_collected_or_changed(
    slb: SLBEmulator, client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    theirs = slb.add_vserver_group(lb, "resourceconsist/ns/web", tags=_tags(OTHER))
    theirs_gone = slb.add_vserver_group(lb, "resourceconsist/ns/gone", tags=_tags(OTHER, "gone"))
    service = _service(lb)
    for narrowed in ((), (lb,)):
        adapter = SLBAdapter(client, cluster_name=CLUSTER, load_balancers=narrowed)
        assert await adapter.list_owned(_ctx()) == [], f"listed with load_balancers={narrowed}"
        assert await adapter.list_owned(_ctx(service)) == []
    # The live Service of the same name in this cluster: ours is created beside theirs.
    adapter = SLBAdapter(client, cluster_name=CLUSTER)
    ctx = _ctx(service, key="ns/web")
    assert await adapter.get_current_employer(ctx, service) == []
    await adapter.create_employer(ctx, service, await adapter.get_expected_employer(ctx, service))
    ours = [g for g in slb.vserver_groups(lb) if g.id not in (theirs, theirs_gone)]
    assert len(ours) == 1 and ours[0].tags[CLUSTER_TAG] == CLUSTER
    assert slb.vserver_group_tags(theirs) == _tags(OTHER)
    touched = {
        call.params.get("VServerGroupId") or call.params.get("ResourceId.1") for call in slb.mutating_calls()
    }
    assert touched.isdisjoint({theirs, theirs_gone})
    # Deleting our Service deletes ours only.
    deleting = {**service, "metadata": {**service["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    ctx = _ctx(key="ns/web")
    current = await adapter.get_current_employer(ctx, deleting)
    assert [c.statuses.vserver_group_id for c in current] == [ours[0].id]  # type: ignore[union-attr]
    await adapter.delete_employer(ctx, deleting, current)
    assert {g.id for g in slb.vserver_groups(lb)} == {theirs, theirs_gone}


async def test_the_search_pages_every_load_balancer_within_its_call_budget_per_pass(
    slb: SLBEmulator, client: SLBClient, caplog: pytest.LogCaptureFixture
) -> None:
    lbs = [slb.add_load_balancer(f"lb-{i:02d}") for i in range(25)]
    orphan = slb.add_vserver_group(lbs[-1], "resourceconsist/ns/gone", tags=_tags(CLUSTER, "gone"))
    slb.add_vserver_group(lbs[3], "resourceconsist/ns/other", tags=_tags(OTHER, "other"))
    slb.add_vserver_group(lbs[4], "resourceconsist/ns/legacy")  # untagged: found only when narrowed
    adapter = SLBAdapter(client, cluster_name=CLUSTER, garbage_call_budget=7)
    adapter.search.page_size = 10
    found: list[str] = []
    per_pass: list[int] = []
    caplog.set_level(logging.INFO)
    for _ in range(4):
        before = sum(slb.call_counts().values())
        found += [item.id for item in await adapter.list_owned(_ctx())]
        per_pass.append(sum(slb.call_counts().values()) - before)
    # 3 pages and 25 load balancers: 28 calls, 7 a pass, the sweep ends with the fourth pass.
    assert per_pass == [7, 7, 7, 7]
    assert sum(n for (action, _), n in slb.call_counts().items() if action == "DescribeLoadBalancers") == 3
    assert len(found) == 1 and orphan in found[0]
    assert sum("used its budget of 7 SLB calls" in r.getMessage() for r in caplog.records) == 3
    # A new sweep starts at the next pass.
    items = await adapter.list_owned(_ctx())
    assert items == [] and slb.calls[-1].action == "DescribeVServerGroups"
    (owned,) = [i for i in await _sweep(adapter) if orphan in i.id]
    assert owned.owner == "ns/gone" and owned.labels == {LOAD_BALANCER_ID_LABEL: lbs[-1]}


async def _sweep(adapter: SLBAdapter) -> list[Any]:
    """The rest of the current sweep, pass after pass."""
    found = []
    for _ in range(10):
        found += await adapter.list_owned(_ctx())
        if not adapter.search._sweeping:
            return found
    raise AssertionError("the sweep never ended")


async def test_a_narrowed_search_looks_at_its_load_balancers_and_finds_groups_from_before_the_tags(
    slb: SLBEmulator, client: SLBClient
) -> None:
    listed, named, elsewhere = (slb.add_load_balancer(lb) for lb in ("lb-listed", "lb-named", "lb-else"))
    legacy = slb.add_vserver_group(listed, "resourceconsist/ns/legacy")
    tagged = slb.add_vserver_group(named, "resourceconsist/ns/gone", tags=_tags(CLUSTER, "gone"))
    slb.add_vserver_group(elsewhere, "resourceconsist/ns/far", tags=_tags(CLUSTER, "far"))
    slb.add_vserver_group(listed, "k8s/80/web/ns/clusterid")  # CCM's
    adapter = SLBAdapter(client, cluster_name=CLUSTER, load_balancers=[listed])
    live = _service(named, name="live")
    owned = await adapter.list_owned(_ctx(live))
    assert sorted(i.owner for i in owned) == ["ns/gone", "ns/legacy"]
    assert any(legacy in i.id for i in owned) and any(tagged in i.id for i in owned)
    assert not slb.calls_of("DescribeLoadBalancers"), "narrowed: no account-wide listing"
    assert {c.params["LoadBalancerId"] for c in slb.calls_of("DescribeVServerGroups")} == {listed, named}


def test_the_cli_flags_set_the_adapters_settings_the_environment_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        SLB_ACCESS_KEY_ENV: "LTAI5tFlagsKeyId",
        SLB_ACCESS_SECRET_ENV: "flags-secret-value",
        SLB_ENDPOINT_ENV: "slb.cn-hangzhou.aliyuncs.com",
        CLUSTER_NAME_ENV: "from-env",
    }.items():
        monkeypatch.setenv(name, value)
    flags = {"slb_cluster_name": "from-flag", "slb_load_balancers": ("lb-1", "lb-2")}
    adapter = registry.controller("alibabacloudslb", _adapter_environ(["alibabacloudslb"], flags))
    assert isinstance(adapter, SLBAdapter)
    assert adapter.cluster_name == "from-flag" and adapter.load_balancers == ("lb-1", "lb-2")
    adapter.client.close()
    unset = {"slb_cluster_name": None, "slb_load_balancers": ()}
    adapter = registry.controller("alibabacloudslb", _adapter_environ(["alibabacloudslb"], unset))
    assert isinstance(adapter, SLBAdapter) and adapter.cluster_name == "from-env"
    adapter.client.close()
    with pytest.raises(click.UsageError, match="add --adapter alibabacloudslb"):
        _adapter_environ(["demo"], flags)


async def test_on_the_control_plane_a_group_from_before_the_tags_is_adopted_and_tagged(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, client: SLBClient
) -> None:
    """Upgrade: the group the adapter made before it tagged groups, already serving web-0, is
    tagged on the Service's first pass and keeps serving; no second group is made."""
    lb = slb.add_load_balancer()
    await cluster.pod(
        "web-0", {"app": "web"}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: "eni-0"}
    )
    await cluster.set_status("web-0", ready=True, service_ready=True)
    served = BackendServer(
        server_id="eni-0",
        port=80,
        server_type="eni",
        server_ip=cluster.ip_of("web-0"),
        description="resourceconsist/web-0",
    )
    legacy = slb.add_vserver_group(lb, f"resourceconsist/{cluster.namespace}/web", backends=[served])
    service = await cluster.service(
        "web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"}
    )
    async with run_manager(SLBAdapter(client, cluster_name=CLUSTER, load_balancers=[lb])):

        async def tagged_and_guarded() -> bool:
            pod = await cluster.get(kube.POD, "web-0")
            return bool(slb.vserver_group_tags(legacy)) and lifecycle.lifecycle_finalizer(
                "web"
            ) in finalizers(pod)

        await async_wait_for(tagged_and_guarded, timeout=60, message="the old group tagged, web-0 guarded")
        assert slb.vserver_group_tags(legacy) == {
            CLUSTER_TAG: CLUSTER,
            SERVICE_NAMESPACE_TAG: cluster.namespace,
            SERVICE_NAME_TAG: "web",
            SERVICE_UID_TAG: service["metadata"]["uid"],
        }
        assert [g.id for g in slb.vserver_groups(lb)] == [legacy]
        assert slb.backends(legacy) == [served], "served all along, never re-added"
        assert not slb.calls_of("CreateVServerGroup") and not slb.calls_of("AddVServerGroupBackendServers")


async def test_on_the_control_plane_a_missing_cluster_name_is_a_warning_event_and_nothing_is_touched(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    await cluster.service("web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"})
    async with run_manager(SLBAdapter(client)):

        async def warned() -> str:
            events = await cluster.events("web")
            return "\n".join(m for kind, _, m in events if kind == "Warning" and CLUSTER_NAME_ENV in m)

        message = await async_wait_for(warned, timeout=60, message="a Warning event naming the setting")
        assert "--slb-cluster-name" in message
    assert slb.vserver_groups(lb) == [] and slb.mutating_calls() == []


def test_the_emulator_keeps_tags_as_slb_does(slb: SLBEmulator, client: SLBClient) -> None:
    lb = slb.add_load_balancer()
    group = client.create_vserver_group(lb, "g", tags={"team": "a", CLUSTER_TAG: CLUSTER})
    other = slb.add_vserver_group(lb, "h", tags={"team": "b"})
    # Filtered by SLB: every given tag must match.
    assert [g.id for g in client.describe_vserver_groups(lb, tags={"team": "a"})] == [group]
    (found,) = client.describe_vserver_groups(lb, tags={CLUSTER_TAG: CLUSTER, "team": "a"})
    assert found.tags == {"team": "a", CLUSTER_TAG: CLUSTER}
    assert client.describe_vserver_groups(lb, tags={CLUSTER_TAG: OTHER}) == []
    assert {g.id for g in client.describe_vserver_groups(lb)} == {group, other}
    # TagResources overwrites a key's value and keeps the other tags.
    client.tag_vserver_group(other, {"team": "c", "env": "prod"})
    assert slb.vserver_group_tags(other) == {"team": "c", "env": "prod"}
    with pytest.raises(SLBError, match="InvalidParameter"):
        client.tag_vserver_group(other, {"aliyun-reserved": "x"})
    with pytest.raises(SLBError, match="at most 20 tags"):
        client.tag_vserver_group(other, {f"k{i}": "v" for i in range(19)})
    assert slb.vserver_group_tags(other) == {"team": "c", "env": "prod"}, "a refused call changes nothing"
    page = client.describe_load_balancers(1, page_size=10)
    assert page.load_balancer_ids == (lb,) and page.total_count == 1 and page.last
