"""Tests of the SLB adapter's credentials: RRSA through Alibaba Cloud's credentials library and the
emulator's STS over real TLS, a rotated key file picked up without a restart, STS keys refused
once expired, the ECS RAM role provider built without side effects, and clear errors.

Every SLB call goes through the real SDK (``SLBClient``) and every STS call through the real
credentials library to the emulator (docs/alibabacloudslb.md, "Credentials")."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.adapters.alibabacloudslb import controller_from_env
from resourceconsist.adapters.alibabacloudslb.credentials import (
    AccessKey,
    CredentialsFileSource,
    LibraryAccessKeySource,
    MissingCredentials,
    SLBAccess,
    StaticAccessKeySource,
)
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.emulator_server import EmulatorServer
from resourceconsist.adapters.alibabacloudslb.slbclient import (
    CREDENTIALS_UNAVAILABLE,
    RetryPolicy,
    SLBAuthError,
    SLBClient,
    SLBError,
)
from resourceconsist.testing import Cluster
from resourceconsist.testing.controlplane import free_port
from resourceconsist.testing.wait import wait_for

LB = "lb-credentials-1"
NO_RETRY = RetryPolicy(max_attempts=1)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorServer]:
    """The emulator served over HTTPS in this process (SLB and STS on one endpoint); its test CA is
    trusted by the SDK (``ALIBABA_CLOUD_CA_BUNDLE``) and by the credentials library, whose HTTP
    client builds its TLS context from the default verify paths (``SSL_CERT_FILE``)."""
    emulator = SLBEmulator(max_session_seconds=43200)
    emulator.add_load_balancer(LB)
    server = EmulatorServer(emulator, tmp_path / "emulator")
    server.start()
    monkeypatch.setenv("ALIBABA_CLOUD_CA_BUNDLE", str(server.ca_bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_bundle))
    try:
        yield server
    finally:
        server.stop()


def _rrsa_env(server: EmulatorServer, token_file: Path, session_seconds: int) -> dict[str, str]:
    return {
        "ALIBABA_CLOUD_ROLE_ARN": server.emulator.role_arn,
        "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": server.emulator.oidc_provider_arn,
        "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(token_file),
        "ALIBABA_CLOUD_STS_ENDPOINT": server.endpoint,
        "ALIBABA_CLOUD_ROLE_SESSION_EXPIRATION": str(session_seconds),
        "ALIYUN_SLB_ENDPOINT": server.endpoint,
        "ALIBABA_CLOUD_REGION_ID": server.emulator.region_id,
    }


def _write(path: Path, text: str) -> None:
    """Replace ``path`` the way the kubelet updates a projected volume: write aside, then rename."""
    aside = path.with_suffix(".new")
    aside.write_text(text)
    os.replace(aside, path)


def test_rrsa_keys_come_from_sts_and_renew_from_a_rewritten_token_file(
    served: EmulatorServer, tmp_path: Path
) -> None:
    emulator = served.emulator
    token_file = tmp_path / "token"
    _write(token_file, "service-account-token-1")
    emulator.accept_oidc_token("service-account-token-1")
    # The library keeps a key until 15 minutes before it expires: a 902 s session is renewed
    # after about 2 s, so the renewal happens within the test.
    access = SLBAccess.from_env(_rrsa_env(served, token_file, session_seconds=902))
    assert isinstance(access.source, LibraryAccessKeySource)
    assert access.source.kind == "rrsa"

    with SLBClient(access, retry=NO_RETRY) as client:
        assert client.describe_vserver_groups(LB) == []
        first_keys = emulator.issued_temporary_keys()
        assert len(first_keys) == 1
        assert emulator.key_uses() == {first_keys[0]: 1}

        # The kubelet rotates the projected token; STS refuses the old one from now on.
        _write(token_file, "service-account-token-2")
        emulator.accept_oidc_token("service-account-token-2")
        emulator.revoke_oidc_token("service-account-token-1")

        def renewed() -> bool:
            client.describe_vserver_groups(LB)  # must keep succeeding meanwhile
            return len(emulator.issued_temporary_keys()) >= 2

        wait_for(renewed, timeout=60, interval=0.5, message="the STS key to be renewed with the new token")
        second_key = emulator.issued_temporary_keys()[-1]
        before = emulator.key_uses().get(second_key, 0)

        # The first key's validity ends: the client no longer signs with it.
        emulator.expire_temporary_key(first_keys[0])
        assert client.describe_vserver_groups(LB) == []
        assert emulator.key_uses().get(second_key, 0) >= before + 1

    exchanges = emulator.calls_of("AssumeRoleWithOIDC")
    assert [call.code for call in exchanges] == [None] * len(exchanges)
    assert all("OIDCToken" not in call.params for call in exchanges)  # never recorded


def test_a_token_sts_refuses_fails_the_call_before_sending_it(served: EmulatorServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    _write(token_file, "a-token-sts-does-not-know")
    access = SLBAccess.from_env(_rrsa_env(served, token_file, session_seconds=3600))
    with SLBClient(access, retry=NO_RETRY) as client, pytest.raises(SLBError) as failed:
        client.describe_vserver_groups(LB)
    assert failed.value.code == CREDENTIALS_UNAVAILABLE and failed.value.transient
    assert "AuthenticationFail.OIDCToken.Invalid" in failed.value.message
    assert "a-token-sts-does-not-know" not in str(failed.value)
    assert served.emulator.key_uses() == {}  # no SLB request went out


def test_an_expired_sts_key_is_refused_with_the_real_code() -> None:
    now = [1_800_000_000.0]
    emulator = SLBEmulator(clock=lambda: now[0], timestamp_tolerance_seconds=10**10)
    emulator.add_load_balancer(LB)
    with emulator:
        key, expires_at = emulator.issue_temporary_key(900)
        assert expires_at == now[0] + 900
        access = SLBAccess(emulator.region_id, emulator.endpoint, StaticAccessKeySource(key))
        with SLBClient(access, retry=NO_RETRY) as client:
            assert client.describe_vserver_groups(LB) == []
            now[0] = expires_at
            with pytest.raises(SLBAuthError) as expired:
                client.describe_vserver_groups(LB)
        assert expired.value.code == "InvalidSecurityToken.Expired"
        assert not expired.value.transient

        # The key id without its token (or with another key's token) is refused too.
        other, _ = emulator.issue_temporary_key(900)
        wrong = AccessKey(other.access_key_id, other.access_key_secret, key.security_token)
        access = SLBAccess(emulator.region_id, emulator.endpoint, StaticAccessKeySource(wrong))
        with SLBClient(access, retry=NO_RETRY) as client, pytest.raises(SLBAuthError) as mismatch:
            client.describe_vserver_groups(LB)
        assert mismatch.value.code == "InvalidSecurityToken.MismatchWithAccessKey"


def test_a_rewritten_credentials_file_is_used_without_a_restart(tmp_path: Path) -> None:
    emulator = SLBEmulator(access_key_id="key-one", access_key_secret="secret-one")
    emulator.add_load_balancer(LB)
    key_file = tmp_path / "credentials.ini"
    _write(
        key_file, "[default]\ntype = access_key\naccess_key_id = key-one\naccess_key_secret = secret-one\n"
    )
    env = {
        "ALIBABA_CLOUD_CREDENTIALS_FILE": str(key_file),
        "ALIYUN_SLB_ENDPOINT": emulator.endpoint,
    }
    with emulator:
        access = SLBAccess.from_env(env)
        assert isinstance(access.source, CredentialsFileSource)
        with SLBClient(access, retry=NO_RETRY) as client:
            assert client.describe_vserver_groups(LB) == []
            # The key is rotated at the provider and the mounted Secret is rewritten.
            emulator.rotate_access_key("key-two", "secret-two")
            _write(
                key_file,
                "[default]\ntype = access_key\naccess_key_id = key-two\naccess_key_secret = secret-two\n",
            )
            assert client.describe_vserver_groups(LB) == []
        assert emulator.key_uses() == {"key-one": 1, "key-two": 1}
        # The old key is refused by the provider, so the second call really used the new file.
        stale = SLBAccess(
            emulator.region_id, emulator.endpoint, StaticAccessKeySource(AccessKey("key-one", "secret-one"))
        )
        with SLBClient(stale, retry=NO_RETRY) as client, pytest.raises(SLBAuthError) as refused:
            client.describe_vserver_groups(LB)
        assert refused.value.code == "InvalidAccessKeyId.NotFound"


def test_the_controller_factory_takes_rrsa_before_a_leftover_static_pair(
    served: EmulatorServer, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    _write(token_file, "service-account-token")
    served.emulator.accept_oidc_token("service-account-token")
    env = {
        **_rrsa_env(served, token_file, session_seconds=3600),
        "ALIYUN_SLB_AK_KEY": "leftover-key",
        "ALIYUN_SLB_AK_SECRET": "leftover-secret",
    }
    adapter = controller_from_env(env)
    assert adapter.client.describe_vserver_groups(LB) == []
    assert list(served.emulator.key_uses()) == served.emulator.issued_temporary_keys()


def test_the_ecs_ram_role_provider_is_built_without_threads_or_signal_handlers() -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    threads = {t.ident for t in threading.enumerate()}
    # No request is made: the metadata address (100.100.100.200) is asked only for credentials.
    access = SLBAccess.from_env(
        {"ALIBABA_CLOUD_ECS_METADATA": "resourceconsist-role", "ALIBABA_CLOUD_REGION_ID": "cn-hangzhou"}
    )
    assert isinstance(access.source, LibraryAccessKeySource)
    assert access.source.kind == "ecs-ram-role"
    assert type(access.source.provider).__name__ == "EcsRamRoleCredentialsProvider"
    assert access.source.provider._role_name == "resourceconsist-role"
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert {t.ident for t in threading.enumerate()} <= threads


def test_static_keys_from_the_environment_still_work() -> None:
    emulator = SLBEmulator()
    emulator.add_load_balancer(LB)
    creds = emulator.credentials()
    env = {
        "ALIYUN_SLB_AK_KEY": creds.access_key_id.get_secret_value(),
        "ALIYUN_SLB_AK_SECRET": creds.access_key_secret.get_secret_value(),
        "ALIYUN_SLB_ENDPOINT": emulator.endpoint,
    }
    with emulator:
        access = SLBAccess.from_env(env)
        assert isinstance(access.source, StaticAccessKeySource)
        with SLBClient(access, retry=NO_RETRY) as client:
            assert client.describe_vserver_groups(LB) == []


def test_missing_credentials_name_what_to_set() -> None:
    with pytest.raises(MissingCredentials) as none:
        SLBAccess.from_env({"ALIBABA_CLOUD_REGION_ID": "cn-hangzhou"})
    for name in (
        "ALIBABA_CLOUD_ROLE_ARN",
        "ALIBABA_CLOUD_OIDC_TOKEN_FILE",
        "ALIBABA_CLOUD_CREDENTIALS_FILE",
        "ALIBABA_CLOUD_ECS_METADATA",
        "ALIYUN_SLB_AK_KEY",
    ):
        assert name in str(none.value)
    with pytest.raises(MissingCredentials) as partial:
        SLBAccess.from_env(
            {"ALIBABA_CLOUD_REGION_ID": "cn-hangzhou", "ALIBABA_CLOUD_ROLE_ARN": "acs:ram::1:role/x"}
        )
    assert "ALIBABA_CLOUD_OIDC_PROVIDER_ARN and ALIBABA_CLOUD_OIDC_TOKEN_FILE not set" in str(partial.value)


def test_run_with_the_ecs_ram_role_still_drains_on_sigterm(control_plane: Any, cluster: Cluster) -> None:
    """``resourceconsist run`` with the SLB adapter on the ECS RAM role: SIGTERM still stops it
    gracefully (the library's provider installs no handler). Any HTTP request the provider could
    make goes to a local listener through ``HTTP_PROXY``, which must see no connection: nothing
    is sent towards the metadata address."""
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.settimeout(0.2)
        connections: list[object] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                try:
                    conn, _ = trap.accept()
                except OSError:
                    continue
                connections.append(conn)
                conn.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        health = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("ALIYUN_", "ALIBABA_CLOUD_"))},
            "ALIBABA_CLOUD_ECS_METADATA": "resourceconsist-role",
            "ALIBABA_CLOUD_REGION_ID": "cn-hangzhou",
            "HTTP_PROXY": f"http://127.0.0.1:{trap.getsockname()[1]}",
            "http_proxy": f"http://127.0.0.1:{trap.getsockname()[1]}",
            "NO_PROXY": "",
            "no_proxy": "",
            "POD_NAMESPACE": cluster.namespace,
        }
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "resourceconsist",
                "run",
                "--adapter",
                "alibabacloudslb",
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "--namespace",
                cluster.namespace,
                "--health-probe-bind-address",
                f"127.0.0.1:{health}",
                "--metrics-bind-address",
                "0",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:

            def ready() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as resp:
                        return resp.status == 200
                except OSError:
                    return False

            wait_for(ready, timeout=60, message="/readyz of the manager")
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            stop.set()
            watcher.join(timeout=5)
    output = process.stdout.read() if process.stdout else ""
    assert "manager stopped" in output, output
    assert connections == [], output
