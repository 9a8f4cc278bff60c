"""Tests of the SLB talking layer: ``SLBClient`` on the real Alibaba Cloud SDK, its real HTTP path
answered by the stateful ``SLBEmulator``, and ``SLBCredentials``."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aliyunsdkcore
import pytest
from aliyunsdkcore.acs_exception.exceptions import ServerException
from aliyunsdkcore.client import AcsClient
from aliyunsdkslb.request.v20140515.AddVServerGroupBackendServersRequest import (
    AddVServerGroupBackendServersRequest,
)

from resourceconsist.adapters.alibabacloudslb.credentials import (
    CredentialsError,
    MissingCredentials,
    SLBCredentials,
    region_from_endpoint,
)
from resourceconsist.adapters.alibabacloudslb.emulator import (
    CODE_BACKEND_ALREADY_EXISTS,
    SLBEmulator,
)
from resourceconsist.adapters.alibabacloudslb.slbclient import (
    MUTATING_ACTIONS,
    BackendServer,
    CallRecord,
    RetryPolicy,
    SLBAuthError,
    SLBClient,
    SLBError,
    SLBNotFound,
)
from resourceconsist.testing import collector_finds

ADD = "AddVServerGroupBackendServers"
REMOVE = "RemoveVServerGroupBackendServers"
SET = "SetVServerGroupAttribute"
ATTRIBUTE = "DescribeVServerGroupAttribute"
KEY_ID = "LTAI5tEmulatedKeyId0001"
SECRET = "Emulated/Secret+Value=0001"


# ---- fixtures (module-local: tests/ is shared with other suites) ---------------------------


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(access_key_id=KEY_ID, access_key_secret=SECRET, seed=7) as emulator:
        yield emulator


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(slb: SLBEmulator, sleeps: list[float]) -> Iterator[SLBClient]:
    # Backoff sleeps are recorded, not slept: the tests run at full speed and can check them.
    with SLBClient(slb.credentials(), sleep=sleeps.append, rand=lambda: 0.5) as c:
        yield c


@pytest.fixture
def lb(slb: SLBEmulator) -> str:
    return slb.add_load_balancer()


@pytest.fixture
def group(slb: SLBEmulator, lb: str) -> str:
    return slb.add_vserver_group(lb, "web", listener_ports=[80])


def enis(count: int, *, start: int = 0, weight: int = 100) -> list[BackendServer]:
    return [
        BackendServer(
            server_id=f"eni-{i:04d}",
            port=8080,
            weight=weight,
            server_type="eni",
            server_ip=f"10.1.{i // 250}.{i % 250 + 1}",
            description=f"pod-{i}",
        )
        for i in range(start, start + count)
    ]


def keys(servers: list[BackendServer]) -> set[tuple[str, int, str]]:
    return {s.key for s in servers}


# ---- reads ------------------------------------------------------------------------------


def test_describe_calls_parse_the_api_shapes(slb: SLBEmulator, client: SLBClient, lb: str) -> None:
    ecs = BackendServer(server_id="i-bp1abc", port=80, weight=30, server_ip="192.168.0.9")
    eni = BackendServer(
        server_id="eni-bp1xyz", port=8080, weight=0, server_type="eni", server_ip="10.0.0.7", description="p"
    )
    web = slb.add_vserver_group(lb, "web", backends=[ecs, eni], listener_ports=[80, 443])
    other = slb.add_vserver_group(lb, "other")
    slb.set_health(lb, "eni-bp1xyz", 8080, "abnormal")

    groups = client.describe_vserver_groups(lb)
    assert {(g.id, g.name, g.load_balancer_id) for g in groups} == {(web, "web", lb), (other, "other", lb)}

    backends = client.describe_vserver_group_backends(web)
    assert backends == [
        BackendServer(server_id="i-bp1abc", port=80, weight=30, server_type="ecs", server_ip="192.168.0.9"),
        eni,
    ]
    group_model, _ = client.describe_vserver_group(web)
    assert (group_model.name, group_model.load_balancer_id) == ("web", lb)

    health = client.describe_health_status(lb)
    assert len(health) == 4  # two backends behind two listeners
    by_key = {(h.server_id, h.listener_port): h for h in health}
    assert by_key[("eni-bp1xyz", 443)].health_status == "abnormal"
    assert not by_key[("eni-bp1xyz", 443)].healthy
    assert by_key[("eni-bp1xyz", 443)].server_ip == "10.0.0.7"
    assert by_key[("eni-bp1xyz", 443)].eni_host == "10.0.0.7"
    assert by_key[("i-bp1abc", 80)].healthy
    assert by_key[("i-bp1abc", 80)].port == 80
    assert {h.listener_port for h in client.describe_health_status(lb, listener_port=443)} == {443}
    assert not slb.mutating_calls()


# ---- batching -----------------------------------------------------------------------------


def test_45_servers_are_added_in_three_calls_of_at_most_20(
    slb: SLBEmulator, client: SLBClient, group: str
) -> None:
    servers = enis(45)
    client.add_backend_servers(group, servers)

    adds = slb.calls_of(ADD)
    assert [len(call.backend_servers) for call in adds] == [20, 20, 5]
    assert all(call.ok for call in adds)
    assert keys(slb.backends(group)) == keys(servers)
    assert client.call_counts()[ADD] == 3
    assert set(slb.add_counts(group).values()) == {1}


def test_weights_and_removals_are_batched_and_use_set_vserver_group_attribute(
    slb: SLBEmulator, client: SLBClient, lb: str
) -> None:
    servers = enis(25)
    group = slb.add_vserver_group(lb, "g", backends=servers)

    client.set_backend_weights(group, [s.model_copy(update={"weight": 0}) for s in servers])
    assert [len(call.backend_servers) for call in slb.calls_of(SET)] == [20, 5]
    assert {s.weight for s in slb.backends(group)} == {0}
    assert not slb.calls_of("ModifyVServerGroupBackendServers")

    client.remove_backend_servers(group, servers)
    assert [len(call.backend_servers) for call in slb.calls_of(REMOVE)] == [20, 5]
    assert slb.backends(group) == []


def test_duplicate_inputs_are_sent_once(slb: SLBEmulator, client: SLBClient, group: str) -> None:
    server = enis(1)[0]
    client.add_backend_servers(group, [server, server.model_copy(update={"weight": 5})])
    assert len(slb.calls_of(ADD)) == 1
    assert slb.backends(group) == [server]


# ---- retries, ambiguity -----------------------------------------------------------------


def test_throttled_calls_are_retried_and_converge(
    slb: SLBEmulator, client: SLBClient, group: str, sleeps: list[float]
) -> None:
    slb.throttle(0.4)  # seeded: every action, re-reads included
    servers = enis(45)
    client.add_backend_servers(group, servers)

    throttled = [call for call in slb.calls if call.code == "Throttling"]
    assert throttled, "the seeded throttle should have hit some calls"
    assert keys(slb.backends(group)) == keys(servers)
    assert set(slb.add_counts(group).values()) == {1}, "no server was added twice"
    assert slb.rejected_duplicate_adds == []
    assert len(sleeps) == len(throttled)
    assert all(0 < delay <= RetryPolicy().max_delay_seconds for delay in sleeps)


@pytest.mark.parametrize(
    "inject",
    [
        pytest.param(lambda s: s.fail_after_executing(ADD, code="ServiceUnavailable"), id="503-after-commit"),
        pytest.param(lambda s: s.fail_after_executing(ADD, code="Throttling"), id="throttling-after-commit"),
        pytest.param(
            lambda s: s.fail_after_executing(ADD, code="ProcessingSameRequest"),
            id="same-request-after-commit",
        ),
        pytest.param(lambda s: s.drop_connection(ADD, execute=True), id="connection-lost-after-commit"),
    ],
)
def test_an_add_carried_out_but_reported_failed_is_not_repeated(
    slb: SLBEmulator, client: SLBClient, lb: str, group: str, inject: Callable[[SLBEmulator], None]
) -> None:
    inject(slb)
    servers = enis(5)
    client.add_backend_servers(group, servers, load_balancer_id=lb)

    assert keys(slb.backends(group)) == keys(servers)
    assert set(slb.add_counts(group).values()) == {1}
    assert slb.rejected_duplicate_adds == []
    adds = slb.calls_of(ADD)
    assert len(adds) == 1 and adds[0].executed and not adds[0].ok
    # The client resolved the ambiguity by reading the group once instead of adding again.
    assert len(slb.calls_of(ATTRIBUTE)) == 1


def test_after_an_ambiguous_failure_only_the_missing_part_is_sent(
    slb: SLBEmulator, client: SLBClient, group: str
) -> None:
    present = enis(3)
    # Someone else added three of the batch between the failed attempt and the retry.
    slb.fail_next(ADD, code="ServiceUnavailable")
    slb.set_backends(group, present)
    servers = [*present, *enis(4, start=3)]
    client.add_backend_servers(group, servers)

    adds = slb.calls_of(ADD)
    assert [len(call.backend_servers) for call in adds] == [7, 4]
    assert keys(slb.backends(group)) == keys(servers)
    assert slb.rejected_duplicate_adds == []


def test_ambiguous_remove_and_weight_changes_are_not_repeated(
    slb: SLBEmulator, client: SLBClient, lb: str
) -> None:
    servers = enis(4)
    group = slb.add_vserver_group(lb, "g", backends=servers)

    slb.fail_after_executing(SET)
    client.set_backend_weights(group, [s.model_copy(update={"weight": 0}) for s in servers])
    assert len(slb.calls_of(SET)) == 1
    assert {s.weight for s in slb.backends(group)} == {0}

    slb.fail_after_executing(REMOVE, code="InternalError")
    client.remove_backend_servers(group, servers)
    removes = slb.calls_of(REMOVE)
    assert len(removes) == 1 and removes[0].code == "InternalError"
    assert slb.backends(group) == []


def test_ambiguous_create_adopts_the_group_it_created(slb: SLBEmulator, client: SLBClient, lb: str) -> None:
    slb.add_vserver_group(lb, "web")  # a group of the same name that was there before
    slb.fail_after_executing("CreateVServerGroup")

    created = client.create_vserver_group(lb, "web")

    assert len(slb.calls_of("CreateVServerGroup")) == 1
    assert sorted(g.name for g in slb.vserver_groups(lb)) == ["web", "web"]
    assert created in {g.id for g in slb.vserver_groups(lb)}
    assert created != slb.vserver_groups(lb)[0].id


def test_delete_vserver_group_survives_an_ambiguous_failure(
    slb: SLBEmulator, client: SLBClient, lb: str
) -> None:
    in_use = slb.add_vserver_group(lb, "in-use", listener_ports=[80])
    with pytest.raises(SLBError) as refused:
        client.delete_vserver_group(in_use)
    assert refused.value.code == "RspoolVipExist"

    spare = slb.add_vserver_group(lb, "spare")
    slb.fail_after_executing("DeleteVServerGroup", code="InternalError")
    client.delete_vserver_group(spare, load_balancer_id=lb)
    assert [g.id for g in slb.vserver_groups(lb)] == [in_use]
    assert [c.code for c in slb.calls_of("DeleteVServerGroup")] == ["RspoolVipExist", "InternalError"]

    with pytest.raises(SLBNotFound):
        client.delete_vserver_group(spare, load_balancer_id=lb)


def test_5xx_answers_are_retried(slb: SLBEmulator, client: SLBClient, lb: str, sleeps: list[float]) -> None:
    slb.return_5xx("DescribeVServerGroups", times=2, status=500)
    assert client.describe_vserver_groups(lb) == []
    assert [c.code for c in slb.calls_of("DescribeVServerGroups")] == ["InternalError", "InternalError", None]
    assert sleeps == [RetryPolicy().delay(1, 0.5), RetryPolicy().delay(2, 0.5)]


def test_retries_are_bounded_in_attempts(slb: SLBEmulator, lb: str) -> None:
    delays: list[float] = []
    policy = RetryPolicy(max_attempts=4, base_delay_seconds=1.0, max_delay_seconds=3.0)
    slb.fail_next("DescribeVServerGroups", times=100, code="SystemBusy")
    c = SLBClient(slb.credentials(), retry=policy, sleep=delays.append, rand=lambda: 0.999)
    with pytest.raises(SLBError) as caught:
        c.describe_vserver_groups(lb)
    assert caught.value.code == "SystemBusy" and caught.value.transient
    assert len(slb.calls_of("DescribeVServerGroups")) == 4
    assert len(delays) == 3
    assert delays == sorted(delays) and max(delays) <= 3.0 and delays[0] >= 0.5


def test_failed_calls_leave_nothing_for_the_garbage_collector(slb: SLBEmulator, lb: str) -> None:
    """A failed call's error, and the SDK's, go by reference counting: none is held by a frame its
    own traceback keeps (docs/benchmarks.md, "Garbage a pass leaves")."""
    slb.fail_next("DescribeVServerGroups", times=100, code="SystemBusy")
    c = SLBClient(slb.credentials(), retry=RetryPolicy(max_attempts=4), sleep=lambda _: None)
    with collector_finds() as found:
        for _ in range(3):
            with pytest.raises(SLBError):
                c.describe_vserver_groups(lb)
    assert len(slb.calls_of("DescribeVServerGroups")) == 12
    assert found.count(SLBError, ServerException) == 0, f"failed calls left cycles: {found}"


def test_retries_are_bounded_in_total_time(slb: SLBEmulator, lb: str) -> None:
    now = [0.0]

    def fake_sleep(seconds: float) -> None:
        now[0] += seconds

    policy = RetryPolicy(
        max_attempts=100, base_delay_seconds=1.0, max_delay_seconds=4.0, max_total_seconds=10.0
    )
    slb.fail_next("DescribeVServerGroups", times=1000, code="Throttling.User")
    with (
        SLBClient(
            slb.credentials(), retry=policy, sleep=fake_sleep, clock=lambda: now[0], rand=lambda: 0.0
        ) as c,
        pytest.raises(SLBError),
    ):
        c.describe_vserver_groups(lb)
    assert now[0] <= 10.0
    assert 3 < len(slb.calls_of("DescribeVServerGroups")) < 100


def test_the_sdk_never_retries_slb_calls_itself(slb: SLBEmulator, lb: str) -> None:
    # The SDK's retry table knows ECS actions only ...
    table = json.loads((Path(aliyunsdkcore.__file__).parent / "data" / "retry_config.json").read_text())
    assert "slb" not in {product.lower() for product in table}
    # ... and with the client's own retry off, one throttled call is one HTTP request.
    slb.fail_next("DescribeVServerGroups", code="Throttling")
    c = SLBClient(slb.credentials(), retry=RetryPolicy(max_attempts=1), sleep=lambda _: None)
    with pytest.raises(SLBError, match="Throttling"):
        c.describe_vserver_groups(lb)
    assert len(slb.calls_of("DescribeVServerGroups")) == 1


# ---- errors --------------------------------------------------------------------------------


def test_not_found_raises_slb_not_found_without_retry(
    slb: SLBEmulator, client: SLBClient, lb: str, group: str, sleeps: list[float]
) -> None:
    with pytest.raises(SLBNotFound) as missing_lb:
        client.describe_health_status("lb-doesnotexist")
    assert missing_lb.value.code == "InvalidLoadBalancerId.NotFound"
    assert missing_lb.value.http_status == 404

    with pytest.raises(SLBNotFound) as missing_group:
        client.describe_vserver_group_backends("rsp-doesnotexist")
    assert missing_group.value.code == "InvalidParameter"
    assert "VServerGroupId does not exist" in missing_group.value.message

    with pytest.raises(SLBNotFound):
        client.add_backend_servers("rsp-doesnotexist", enis(1), load_balancer_id=lb)

    with pytest.raises(SLBNotFound) as absent:
        client.remove_backend_servers(group, enis(1))
    assert absent.value.code == "InvalidServerId.NotFound"

    assert sleeps == []  # nothing was retried
    assert [c.action for c in slb.calls] == ["DescribeHealthStatus", ATTRIBUTE, ADD, ATTRIBUTE, REMOVE]


def test_an_unknown_error_raises_slb_error_with_code_message_and_request_id(
    slb: SLBEmulator, client: SLBClient, group: str, sleeps: list[float]
) -> None:
    slb.fail_next(ADD, code="UnsupportedOperation", message="The Loadbalancer doesn't support this function.")
    with pytest.raises(SLBError) as caught:
        client.add_backend_servers(group, enis(2))
    err = caught.value
    assert type(err) is SLBError
    assert err.code == "UnsupportedOperation"
    assert err.message == "The Loadbalancer doesn't support this function."
    assert err.request_id == slb.calls_of(ADD)[0].request_id
    assert err.http_status == 400 and not err.transient
    assert "UnsupportedOperation" in str(err) and err.request_id in str(err)
    assert sleeps == [] and len(slb.calls_of(ADD)) == 1


def test_the_emulator_rejects_what_the_service_rejects(slb: SLBEmulator, client: SLBClient, lb: str) -> None:
    server = enis(1)[0]
    group = slb.add_vserver_group(lb, "g", backends=[server])

    with pytest.raises(SLBError) as duplicate:
        client.add_backend_servers(group, [server])
    assert duplicate.value.code == CODE_BACKEND_ALREADY_EXISTS
    assert slb.rejected_duplicate_adds == [(group, server.key)]

    heavy = BackendServer.model_construct(server_id="i-heavy", port=80, weight=101, server_type="ecs")
    with pytest.raises(SLBError) as bad_weight:
        client.add_backend_servers(group, [heavy])
    assert bad_weight.value.code == "InvalidWeight.Malformed"

    # More than 20 servers in one call, sent through the SDK without the client's batching.
    acs = AcsClient(KEY_ID, SECRET, slb.region_id, auto_retry=False)
    request = AddVServerGroupBackendServersRequest()
    request.set_endpoint(slb.endpoint)
    request.set_VServerGroupId(group)
    request.set_BackendServers(json.dumps([s.to_api() for s in enis(21, start=10)]))
    with pytest.raises(ServerException, match="TooManyBackendServers"):
        acs.do_action_with_exception(request)
    assert slb.backends(group) == [server]


def test_a_wrong_secret_is_rejected_by_the_signature_check(slb: SLBEmulator, lb: str) -> None:
    wrong = slb.credentials(access_key_secret="not-the-secret")
    with SLBClient(wrong, sleep=lambda _: None) as c, pytest.raises(SLBAuthError) as caught:
        c.describe_vserver_groups(lb)
    # The SDK recognises the service's own string to sign and names the secret as the culprit.
    assert caught.value.code == "InvalidAccessKeySecret"
    assert [(call.code, call.executed) for call in slb.calls] == [("SignatureDoesNotMatch", False)]

    c = SLBClient(slb.credentials(access_key_id="LTAI5tSomeoneElse"), sleep=lambda _: None)
    with pytest.raises(SLBAuthError) as unknown_key:
        c.add_backend_servers(slb.add_vserver_group(lb), enis(1), load_balancer_id=lb)
    assert unknown_key.value.code == "InvalidAccessKeyId.NotFound"
    assert all(not call.executed for call in slb.calls)


# ---- concurrency ---------------------------------------------------------------------------


def test_writes_to_one_load_balancer_are_serialized(slb: SLBEmulator, client: SLBClient, lb: str) -> None:
    first, second = slb.add_vserver_group(lb, "a"), slb.add_vserver_group(lb, "b")
    first_in_flight, second_started = threading.Event(), threading.Event()

    def hold_first_add(action: str) -> None:
        if action == ADD and not first_in_flight.is_set():
            first_in_flight.set()
            # Keep the first write in flight until the second writer is inside the client, and a
            # little longer: without the client's lock its write would reach the emulator now.
            second_started.wait(5)
            time.sleep(0.05)

    slb.before_execute = hold_first_add
    errors: list[BaseException] = []

    def write(group_id: str, servers: list[BackendServer]) -> None:
        try:
            client.add_backend_servers(group_id, servers, load_balancer_id=lb)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    a = threading.Thread(target=write, args=(first, enis(3)))
    a.start()
    assert first_in_flight.wait(5)
    second_started.set()
    write(second, enis(3, start=3))
    a.join(10)

    assert errors == []
    assert slb.max_concurrent_writes(lb) == 1
    assert slb.write_conflicts == 0
    assert [c.ok for c in slb.calls_of(ADD)] == [True, True]
    assert len(slb.backends(first)) == 3 and len(slb.backends(second)) == 3


def test_the_emulator_refuses_overlapping_writes_and_the_client_retries(slb: SLBEmulator, lb: str) -> None:
    # Two clients share no lock, like two controller replicas: the service sees both writes.
    first, second = slb.add_vserver_group(lb, "a"), slb.add_vserver_group(lb, "b")
    first_in_flight, first_done = threading.Event(), threading.Event()

    def hold_first_add(action: str) -> None:
        if action == ADD and not first_in_flight.is_set():
            first_in_flight.set()
            deadline = time.monotonic() + 5
            while slb.write_conflicts == 0 and time.monotonic() < deadline:
                time.sleep(0.001)

    slb.before_execute = hold_first_add
    one = SLBClient(slb.credentials(), sleep=lambda _: None)
    two = SLBClient(slb.credentials(), sleep=lambda _: first_done.wait(5))

    def first_writer() -> None:
        one.add_backend_servers(first, enis(2), load_balancer_id=lb)
        first_done.set()

    a = threading.Thread(target=first_writer)
    a.start()
    assert first_in_flight.wait(5)
    two.add_backend_servers(second, enis(2, start=2), load_balancer_id=lb)
    a.join(10)

    assert slb.write_conflicts == 1
    assert [c.code for c in slb.calls_of(ADD)] == ["BackendServer.configuring", None, None]
    assert len(slb.backends(first)) == 2 and len(slb.backends(second)) == 2
    assert set(slb.add_counts(first).values()) == set(slb.add_counts(second).values()) == {1}


# ---- observation ---------------------------------------------------------------------------


def test_every_attempt_is_counted_and_reported(slb: SLBEmulator, group: str) -> None:
    records: list[CallRecord] = []
    slb.fail_next(ADD, code="OperationBusy")
    with SLBClient(slb.credentials(), sleep=lambda _: None, on_call=records.append) as c:
        c.add_backend_servers(group, enis(3))
        assert c.call_counts() == {ATTRIBUTE: 2, ADD: 2}  # group lookup, failed add, re-read, add
        c.reset_call_counts()
        assert c.call_counts() == {}
    assert [(r.action, r.attempt, r.ok, r.code) for r in records] == [
        (ATTRIBUTE, 1, True, None),
        (ADD, 1, False, "OperationBusy"),
        (ATTRIBUTE, 1, True, None),
        (ADD, 2, True, None),
    ]
    assert {c.action for c in slb.mutating_calls()} == {ADD}
    assert {ADD, REMOVE, SET} <= MUTATING_ACTIONS


# ---- credentials and secrecy -----------------------------------------------------------------


def test_credentials_from_the_go_adapters_variables() -> None:
    creds = SLBCredentials.from_env(
        {
            "ALIYUN_SLB_AK_KEY": "LTAI5tGoKey",
            "ALIYUN_SLB_AK_SECRET": " go-secret\n",
            "ALIYUN_SLB_ENDPOINT": "https://slb.cn-shanghai.aliyuncs.com/",
            "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAI5tStandardKey",
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "standard-secret",
        }
    )
    assert creds.access_key_id.get_secret_value() == "LTAI5tGoKey"
    assert creds.access_key_secret.get_secret_value() == "go-secret"
    assert (creds.region_id, creds.endpoint) == ("cn-shanghai", "slb.cn-shanghai.aliyuncs.com")


def test_credentials_fall_back_to_the_standard_variables_and_region() -> None:
    creds = SLBCredentials.from_env(
        {
            "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAI5tStandardKey",
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "standard-secret",
            "ALIBABA_CLOUD_REGION_ID": "eu-central-1",
        }
    )
    assert creds.access_key_id.get_secret_value() == "LTAI5tStandardKey"
    assert (creds.region_id, creds.endpoint) == ("eu-central-1", "slb.eu-central-1.aliyuncs.com")

    global_endpoint = SLBCredentials.from_env(
        {
            "ALIYUN_SLB_AK_KEY": "k" * 8,
            "ALIYUN_SLB_AK_SECRET": "s" * 8,
            "ALIYUN_SLB_ENDPOINT": "slb.aliyuncs.com",
            "ALIYUN_SLB_REGION": "cn-beijing",
        }
    )
    assert (global_endpoint.region_id, global_endpoint.endpoint) == ("cn-beijing", "slb.aliyuncs.com")
    assert region_from_endpoint("slb-vpc.ap-southeast-1.aliyuncs.com") == "ap-southeast-1"


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({}, ["ALIYUN_SLB_AK_KEY", "ALIYUN_SLB_AK_SECRET", "ALIBABA_CLOUD_ACCESS_KEY_ID"]),
        ({"ALIYUN_SLB_AK_KEY": "LTAI5tGoKey"}, ["ALIYUN_SLB_AK_SECRET not set"]),
        ({"ALIBABA_CLOUD_ACCESS_KEY_SECRET": "x" * 8}, ["ALIBABA_CLOUD_ACCESS_KEY_ID not set"]),
        (
            {"ALIYUN_SLB_AK_KEY": "LTAI5tGoKey", "ALIYUN_SLB_AK_SECRET": "go-secret"},
            ["ALIYUN_SLB_ENDPOINT", "ALIBABA_CLOUD_REGION_ID"],
        ),
        (
            {
                "ALIYUN_SLB_AK_KEY": "LTAI5tGoKey",
                "ALIYUN_SLB_AK_SECRET": "go-secret",
                "ALIYUN_SLB_ENDPOINT": "slb.aliyuncs.com",
            },
            ["ALIBABA_CLOUD_REGION_ID", "ALIYUN_SLB_REGION"],
        ),
    ],
)
def test_missing_credentials_name_the_variables_to_set(environ: dict[str, str], named: list[str]) -> None:
    with pytest.raises(MissingCredentials) as caught:
        SLBCredentials.from_env(environ)
    assert isinstance(caught.value, CredentialsError)
    for text in named:
        assert text in str(caught.value)
    assert "go-secret" not in str(caught.value) and "LTAI5tGoKey" not in str(caught.value)


def test_an_unusable_region_is_a_credentials_error() -> None:
    with pytest.raises(CredentialsError, match="ALIBABA_CLOUD_REGION_ID"):
        SLBCredentials.from_env(
            {
                "ALIYUN_SLB_AK_KEY": "k" * 8,
                "ALIYUN_SLB_AK_SECRET": "s" * 8,
                "ALIBABA_CLOUD_REGION_ID": "cn/hz",
            }
        )


def test_credentials_never_show_the_key_pair() -> None:
    creds = SLBCredentials.from_env(
        {
            "ALIYUN_SLB_AK_KEY": KEY_ID,
            "ALIYUN_SLB_AK_SECRET": SECRET,
            "ALIYUN_SLB_ENDPOINT": "slb.cn-hangzhou.aliyuncs.com",
        }
    )
    for text in (repr(creds), str(creds), creds.model_dump_json(), repr(creds.model_dump())):
        assert KEY_ID not in text and SECRET not in text
    with SLBClient(creds) as c:
        assert KEY_ID not in repr(c)


def test_secret_and_key_id_appear_in_no_error_and_no_log_line(
    slb: SLBEmulator, lb: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    group = slb.add_vserver_group(lb, "g")
    errors: list[SLBError] = []
    with SLBClient(slb.credentials(), sleep=lambda _: None) as c:
        # A server message quoting the credentials, as a misbehaving proxy or service might.
        slb.fail_next(ADD, code="SignatureDoesNotMatch", message=f"signature mismatch: {KEY_ID} / {SECRET}")
        # A lost connection, whose text quotes the request URL with AccessKeyId and Signature.
        slb.drop_connection("DescribeVServerGroups", times=10)
        slb.fail_next(REMOVE, code="InternalError", message=f"AccessKeyId={KEY_ID}&x=1")
        for call in (
            lambda: c.add_backend_servers(group, enis(1), load_balancer_id=lb),
            lambda: c.describe_vserver_groups(lb),
            lambda: c.remove_backend_servers(group, enis(1), load_balancer_id=lb),
        ):
            try:
                call()
            except SLBError as err:
                errors.append(err)
    with SLBClient(slb.credentials(access_key_secret="wrong-" + SECRET), sleep=lambda _: None) as bad:
        with pytest.raises(SLBAuthError) as auth:
            bad.describe_vserver_groups(lb)
        errors.append(auth.value)

    assert {e.code for e in errors} >= {"SignatureDoesNotMatch", "SDK.HttpError", "InvalidAccessKeySecret"}
    assert any("AccessKeyId" in r.getMessage() for r in caplog.records), "the SDK did log the URL"
    texts = [str(e) for e in errors] + [repr(e) for e in errors] + [caplog.text]
    texts += [r.getMessage() for r in caplog.records]
    for text in texts:
        assert KEY_ID not in text
        assert SECRET not in text and "Emulated%2FSecret" not in text
