"""Tests of the SLB emulator served as its own process: the real SDK (through ``SLBClient``) over
real HTTPS to the server process, and faults and state set and read through its admin HTTP API."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.adapters.alibabacloudslb.credentials import SLBAccess, SLBCredentials
from resourceconsist.adapters.alibabacloudslb.emulator_server import (
    AdminError,
    EmulatorAdmin,
    served_emulator,
)
from resourceconsist.adapters.alibabacloudslb.slbclient import (
    BackendServer,
    RetryPolicy,
    SLBAuthError,
    SLBClient,
    SLBError,
)
from resourceconsist.flow.budget import Priority, ProviderBudget
from resourceconsist.options import ProviderBudgetOptions
from resourceconsist.testing import wait_for

LB = "lb-served-1"
ADD = "AddVServerGroupBackendServers"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The emulator server process; its start-up JSON line (endpoint, admin URL, CA bundle, keys)."""
    with served_emulator(tmp_path_factory.mktemp("slb-emulator"), LB) as (info, _):
        yield info


@pytest.fixture
def admin(served: dict[str, str]) -> Iterator[EmulatorAdmin]:
    client = EmulatorAdmin(served["admin_url"])
    client.clear_faults()
    yield client
    client.clear_faults()


def _client(info: dict[str, str], monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> SLBClient:
    # The SDK's own way to trust a CA: the served endpoint is HTTPS with the emulator's certificate.
    monkeypatch.setenv("ALIBABA_CLOUD_CA_BUNDLE", info["ca_bundle"])
    credentials = SLBCredentials.from_env(
        {
            "ALIYUN_SLB_AK_KEY": info["access_key_id"],
            "ALIYUN_SLB_AK_SECRET": info["access_key_secret"],
            "ALIYUN_SLB_ENDPOINT": info["endpoint"],
            "ALIBABA_CLOUD_REGION_ID": info["region_id"],
        }
    )
    kwargs.setdefault("retry", RetryPolicy(max_attempts=2, base_delay_seconds=0.0, max_total_seconds=5.0))
    return SLBClient(credentials, **kwargs)


def _backend(n: int, weight: int = 100) -> BackendServer:
    return BackendServer(
        server_id=f"eni-{n}",
        port=8080,
        weight=weight,
        server_type="eni",
        server_ip=f"10.0.0.{n}",
        description=f"resourceconsist/pod-{n}",
    )


def _group_backends(admin: EmulatorAdmin, group_id: str) -> list[dict[str, Any]]:
    groups = {g["id"]: g for g in admin.state()["groups"]}
    return list(groups[group_id]["backends"]) if group_id in groups else []


def test_sdk_over_https_changes_state_and_history_read_from_outside(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, last = admin.history()
    started = time.time()
    with _client(served, monkeypatch) as client:
        group = client.create_vserver_group(LB, "resourceconsist/ns/history")
        client.add_backend_servers(group, [_backend(1), _backend(2)], load_balancer_id=LB)
        client.set_backend_weights(group, [_backend(1, weight=0)], load_balancer_id=LB)
        client.remove_backend_servers(group, [_backend(2)], load_balancer_id=LB)
    finished = time.time()

    assert [(b["Description"], b["Weight"]) for b in _group_backends(admin, group)] == [
        ("resourceconsist/pod-1", 0)
    ]
    changes, _ = admin.history(last)
    ours = [c for c in changes if c["vserver_group_id"] == group]
    assert [(c["change"], c["Description"], c["Weight"], c["old_weight"]) for c in ours] == [
        ("added", "resourceconsist/pod-1", 100, None),
        ("added", "resourceconsist/pod-2", 100, None),
        ("weight", "resourceconsist/pod-1", 0, 100),
        ("removed", "resourceconsist/pod-2", 100, 100),
    ]
    times = [c["time"] for c in ours]
    assert times == sorted(times)
    assert started <= times[0] and times[-1] <= finished


def test_deleting_a_group_records_its_backends_as_removed(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served, monkeypatch) as client:
        group = client.create_vserver_group(LB, "resourceconsist/ns/deleted")
        client.add_backend_servers(group, [_backend(6)], load_balancer_id=LB)
        _, last = admin.history()
        client.delete_vserver_group(group, load_balancer_id=LB)
    changes, _ = admin.history(last)
    assert [(c["change"], c["vserver_group_id"], c["Description"]) for c in changes] == [
        ("removed", group, "resourceconsist/pod-6")
    ]
    assert group not in {g["id"] for g in admin.state()["groups"]}


def test_state_outlives_the_client_that_wrote_it(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served, monkeypatch) as first:
        group = first.create_vserver_group(LB, "resourceconsist/ns/outlives")
        first.add_backend_servers(group, [_backend(3)], load_balancer_id=LB)
    with _client(served, monkeypatch) as second:
        assert [b.description for b in second.describe_vserver_group_backends(group)] == [
            "resourceconsist/pod-3"
        ]


def test_write_faults_set_from_outside_fail_writes_not_reads(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served, monkeypatch) as client:
        group = client.create_vserver_group(LB, "resourceconsist/ns/write-faults")
        admin.set_faults({"throttle": 1.0}, actions="writes")
        with pytest.raises(SLBError) as caught:
            client.add_backend_servers(group, [_backend(4)], load_balancer_id=LB)
        assert caught.value.code == "Throttling"
        assert client.describe_vserver_group_backends(group) == []
        admin.clear_faults()
        client.add_backend_servers(group, [_backend(4)], load_balancer_id=LB)
    assert [b["Description"] for b in _group_backends(admin, group)] == ["resourceconsist/pod-4"]


def test_read_faults_set_from_outside_fail_reads(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served, monkeypatch) as client:
        admin.set_faults({"5xx": 1.0}, actions="reads")
        with pytest.raises(SLBError) as caught:
            client.describe_vserver_groups(LB)
        assert caught.value.code == "ServiceUnavailable"
        admin.set_faults({"drop": 1.0}, actions=["DescribeVServerGroups"])
        before = admin.call_counts().get(("DescribeVServerGroups", "ConnectionReset"), 0)
        with pytest.raises(SLBError):
            client.describe_vserver_groups(LB)
        assert admin.call_counts()[("DescribeVServerGroups", "ConnectionReset")] > before
        admin.clear_faults()
        answered = admin.call_counts().get(("DescribeVServerGroups", "ok"), 0)
        client.describe_vserver_groups(LB)
        assert admin.call_counts()[("DescribeVServerGroups", "ok")] == answered + 1


def test_fault_rates_add_up_to_the_share_of_calls_that_fail(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rates summing to 1 fail every call, and each kind gets its turn: the kinds are drawn as one.
    admin.set_faults({"throttle": 0.5, "5xx": 0.5}, actions="reads")
    codes = set()
    with _client(served, monkeypatch, retry=RetryPolicy(max_attempts=1)) as client:
        for _ in range(20):
            with pytest.raises(SLBError) as caught:
                client.describe_vserver_groups(LB)
            codes.add(caught.value.code)
    assert codes == {"Throttling", "ServiceUnavailable"}


def test_did_it_but_reported_failure_changes_state(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served, monkeypatch, retry=RetryPolicy(max_attempts=1)) as client:
        group = client.create_vserver_group(LB, "resourceconsist/ns/ambiguous")
        admin.set_faults({"execute_fail": 1.0}, actions=[ADD])
        with pytest.raises(SLBError) as caught:
            client.add_backend_servers(group, [_backend(5)], load_balancer_id=LB)
        assert caught.value.code == "InternalError"
    assert [b["Description"] for b in _group_backends(admin, group)] == ["resourceconsist/pod-5"]


def test_latency_and_hang_set_from_outside_outlast_the_client_timeout(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served, monkeypatch, read_timeout_seconds=0.5) as client:
        group = client.create_vserver_group(LB, "resourceconsist/ns/after-the-faults")
        admin.set_faults(latency_seconds=2.0, actions="reads")
        with pytest.raises(SLBError):
            client.describe_vserver_groups(LB)
        admin.set_faults(hang=True, actions="reads")
        with pytest.raises(SLBError):
            client.describe_vserver_groups(LB)
        admin.clear_faults()
        # Once cleared, a read is answered within the client's timeout. (The calls the client
        # gave up on are answered too, late, so a count of answered calls here would race them.)
        assert group in [g.id for g in client.describe_vserver_groups(LB)]


def test_rrsa_against_the_served_sts_and_keys_steered_from_outside(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The credentials library exchanges a token at the server process's STS (HTTPS, its test CA
    trusted through SSL_CERT_FILE); the admin API accepts tokens, lists and expires STS keys, and
    rotates the static pair."""
    monkeypatch.setenv("ALIBABA_CLOUD_CA_BUNDLE", served["ca_bundle"])
    monkeypatch.setenv("SSL_CERT_FILE", served["ca_bundle"])
    token_file = tmp_path / "token"
    token_file.write_text("served-token")
    admin.accept_oidc_token("served-token")
    access = SLBAccess.from_env(
        {
            "ALIBABA_CLOUD_ROLE_ARN": served["role_arn"],
            "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": served["oidc_provider_arn"],
            "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(token_file),
            "ALIBABA_CLOUD_STS_ENDPOINT": served["sts_endpoint"],
            "ALIYUN_SLB_ENDPOINT": served["endpoint"],
            "ALIBABA_CLOUD_REGION_ID": served["region_id"],
        }
    )
    issued_before, _ = admin.sts_keys()
    with SLBClient(access, retry=RetryPolicy(max_attempts=1)) as client:
        client.describe_vserver_groups(LB)
        issued, uses = admin.sts_keys()
        (key,) = issued[len(issued_before) :]
        assert uses[key] == 1
        # Expired at the provider while the library still holds it (a 3600 s session): refused.
        admin.expire_key(key)
        with pytest.raises(SLBAuthError) as expired:
            client.describe_vserver_groups(LB)
        assert expired.value.code == "InvalidSecurityToken.Expired"
    with pytest.raises(AdminError, match="is not an STS key the emulator issued"):
        admin.expire_key("STS.unknown")

    # The static pair rotated from outside: the old one is refused, the new one works.
    admin.rotate_access_key("rotated-key", "rotated-secret")
    try:
        with (
            _client(served, monkeypatch, retry=RetryPolicy(max_attempts=1)) as old,
            pytest.raises(SLBAuthError),
        ):
            old.describe_vserver_groups(LB)
        rotated = {**served, "access_key_id": "rotated-key", "access_key_secret": "rotated-secret"}
        with _client(rotated, monkeypatch) as new:
            new.describe_vserver_groups(LB)
    finally:
        admin.rotate_access_key(served["access_key_id"], served["access_key_secret"])


def test_request_log_names_each_calls_sender_and_when_it_arrived(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two callers, the static pair and an STS key issued for the session ``replica-b``: the
    request log (read from outside) names each call's key and session with its arrival and answer
    times, pages on ``since``, and shows a write held by a hang as in flight, with its sender."""
    monkeypatch.setenv("SSL_CERT_FILE", served["ca_bundle"])
    token_file = tmp_path / "token"
    token_file.write_text("replica-b-token")
    admin.accept_oidc_token("replica-b-token")
    # The server is shared by this module's tests: a call an earlier test left held (a latency or
    # hang fault it set) is logged when it is answered. Start once none is in flight, so every
    # call logged from here on is this test's.
    wait_for(lambda: not admin.requests()[1], timeout=30, message="earlier tests' calls answered")
    _, _, since = admin.requests()
    started = time.time()
    with _client(served, monkeypatch) as static:
        group = static.create_vserver_group(LB, "resourceconsist/ns/request-log")
    rrsa = SLBAccess.from_env(
        {
            "ALIBABA_CLOUD_ROLE_ARN": served["role_arn"],
            "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": served["oidc_provider_arn"],
            "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(token_file),
            "ALIBABA_CLOUD_ROLE_SESSION_NAME": "replica-b",
            "ALIBABA_CLOUD_STS_ENDPOINT": served["sts_endpoint"],
            "ALIYUN_SLB_ENDPOINT": served["endpoint"],
            "ALIBABA_CLOUD_REGION_ID": served["region_id"],
        }
    )
    with SLBClient(rrsa, retry=RetryPolicy(max_attempts=1)) as client:
        client.add_backend_servers(group, [_backend(30)], load_balancer_id=LB)
        calls, in_flight, last = admin.requests(since)
        ours = [c for c in calls if c["action"] != "AssumeRoleWithOIDC"]
        *setup, added = ours
        assert "CreateVServerGroup" in [c["action"] for c in setup]
        assert {(c["access_key_id"], c["session"]) for c in setup} == {(served["access_key_id"], "")}
        assert (added["action"], added["session"]) == (ADD, "replica-b")
        assert added["access_key_id"].startswith("STS.")
        assert all(started <= c["received"] <= c["answered"] <= time.time() for c in ours)
        assert [c["seq"] for c in calls] == list(range(since + 1, last + 1))
        assert [c for c in in_flight if c["session"] == "replica-b"] == []
        assert admin.requests(last)[0] == []

        # A write held at the provider is in flight, named by its sender, until it is answered.
        def replica_b_in_flight() -> list[dict[str, Any]]:
            return [c for c in admin.requests(last)[1] if c["session"] == "replica-b"]

        admin.set_faults(hang=True, actions="writes")
        held = threading.Thread(
            target=client.add_backend_servers, args=(group, [_backend(31)]), kwargs={"load_balancer_id": LB}
        )
        held.start()
        try:
            (flying,) = wait_for(replica_b_in_flight, timeout=10, message="a write in flight")
            assert flying["action"] == ADD
            assert [c for c in admin.requests(last)[0] if c["session"]] == []  # not answered yet
        finally:
            admin.clear_faults()
            held.join(timeout=10)
        answered = [c for c in admin.requests(last)[0] if c["session"]]
        assert [(c["action"], c["session"], c["code"]) for c in answered] == [(ADD, "replica-b", None)]
        assert answered[0]["received"] == flying["received"]
        assert replica_b_in_flight() == []


def test_admin_api_rejects_bad_fault_settings_with_a_clear_message(admin: EmulatorAdmin) -> None:
    with pytest.raises(AdminError, match=r"unknown fault kinds \['flood'\]; known: \['5xx', 'drop'"):
        admin.set_faults({"flood": 0.5})
    with pytest.raises(AdminError, match="sum to at most 1"):
        admin.set_faults({"throttle": 0.7, "5xx": 0.7})
    with pytest.raises(AdminError, match="actions 'everything' is none of"):
        admin.set_faults({"throttle": 0.1}, actions="everything")


def test_a_rate_limit_answers_with_slbs_throttling_as_the_sdk_reports_it(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = ProviderBudget("test:emulator-throttle")  # no client-side rate: only counts
    admin.rate_limit(0.2, burst=2)  # a token every 5 s: the third call at once is over
    try:
        with _client(served, monkeypatch, retry=RetryPolicy(max_attempts=1), budget=budget) as client:
            client.describe_vserver_groups(LB)
            client.describe_vserver_groups(LB)
            with pytest.raises(SLBError) as caught:
                client.describe_vserver_groups(LB)
    finally:
        admin.rate_limit(None)
    err = caught.value
    assert (err.code, err.http_status) == ("Throttling.User", 400)
    assert err.message == "Request was denied due to user flow control."
    assert err.transient and err.request_id
    assert budget.snapshot().throttles[Priority.READ] == 1
    assert admin.call_counts()[("DescribeVServerGroups", "Throttling.User")] >= 1


def test_every_call_through_the_budget_lands_under_a_throttling_emulator(
    served: dict[str, str], admin: EmulatorAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget paces the client below the emulator's rate; a throttle that still comes (the
    two clocks differ) pauses the budget and the call is retried: none is lost."""
    budget = ProviderBudget("test:emulator-paced", ProviderBudgetOptions(rate=4.0, burst=1))
    admin.rate_limit(5.0, burst=1)
    try:
        with _client(served, monkeypatch, retry=RetryPolicy(), budget=budget) as client:
            group = client.create_vserver_group(LB, "resourceconsist/ns/paced")
            for n in range(20, 26):
                client.add_backend_servers(group, [_backend(n)], load_balancer_id=LB)
    finally:
        admin.rate_limit(None)
    assert sorted(b["ServerIp"] for b in _group_backends(admin, group)) == [
        f"10.0.0.{n}" for n in range(20, 26)
    ]
    counts = admin.call_counts()
    throttled = sum(n for (_, code), n in counts.items() if code == "Throttling.User")
    assert sum(budget.snapshot().throttles.values()) <= throttled
    assert budget.snapshot().granted[Priority.REGISTER] >= 7  # the create, its read and six adds


def test_admin_api_rejects_bad_rate_limits_with_a_clear_message(admin: EmulatorAdmin) -> None:
    with pytest.raises(AdminError, match="calls_per_second must be a positive number"):
        admin.rate_limit(0.0)
    with pytest.raises(AdminError, match="burst must be a whole number >= 1"):
        admin.rate_limit(1.0, burst=0)


def test_served_emulator_exits_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resourceconsist.adapters.alibabacloudslb.emulator_server",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    assert EmulatorAdmin(info["admin_url"]).healthy()
    proc.terminate()
    assert proc.wait(timeout=10) == 0
