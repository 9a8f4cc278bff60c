"""The haproxy adapter's parts that need no control plane: reading ``show stat`` of a real HAProxy,
the annotations and server names, the settings from the environment, the registry and the
command line naming the adapter, and commands that could carry a second command."""

from __future__ import annotations

import pytest

from resourceconsist.adapters import registry
from resourceconsist.adapters.haproxy import (
    OPTIONS_ANNOTATION,
    RUNTIME_API_ENV,
    HAProxyConfigError,
    HAProxySettings,
    Refusal,
    RuntimeAddress,
    RuntimeAPI,
    RuntimeAPIRefused,
    RuntimeAPIUnavailable,
    config,
    owner_of,
    server_name,
)
from resourceconsist.testing import run_cli
from resourceconsist.testing.haproxy import Backend, LocalHAProxy, SocketProxy


def _service(**annotations: str) -> dict[str, object]:
    return {"kind": "Service", "metadata": {"namespace": "ns", "name": "web", "annotations": annotations}}


def test_server_names_say_whose_they_are() -> None:
    name = server_name("shop", "web", "web-7c9d.x")
    assert name == "rc:shop:web:web-7c9d.x"
    assert owner_of(name) == ("shop", "web", "web-7c9d.x")
    for foreign in ("web-1", "rc:only:two", "rc:a::c", "srv1"):
        assert owner_of(foreign) is None


def test_server_options_pass_only_what_a_service_author_may_set() -> None:
    assert config.server_options(_service()) == ("check",)
    given = _service(**{OPTIONS_ANNOTATION: "check inter 1s rise 2 fall 3 slowstart 10s"})
    assert config.server_options(given) == (
        "check",
        "inter",
        "1s",
        "rise",
        "2",
        "fall",
        "3",
        "slowstart",
        "10s",
    )
    for bad, words in (
        ("check crt /etc/haproxy/key.pem", "'crt' is not a server option"),
        ("check inter", "needs 1 value"),
        ("check inter 1s;del", "needs 1 value"),
        ("track web/other", "'track' is not a server option"),
    ):
        with pytest.raises(HAProxyConfigError, match=words):
            config.server_options(_service(**{OPTIONS_ANNOTATION: bad}))
    assert config.health_checked(("check",)) and not config.health_checked(("check", "no-check"))


def test_a_command_line_never_carries_a_second_command() -> None:
    api = RuntimeAPI("unix:/nonexistent.sock")
    with pytest.raises(ValueError, match="one command a line"):
        api.run("show info; del server web/x")
    with pytest.raises(ValueError, match="not allow"):
        api.set_state("web", "x;del", "maint")
    with pytest.raises(ValueError, match="cannot carry"):
        api.add_server("web", "x", "127.0.0.1:80", ["check;", "del"])


def test_addresses_and_settings_from_the_environment() -> None:
    assert str(RuntimeAddress.parse("/run/haproxy/admin.sock")) == "unix:/run/haproxy/admin.sock"
    assert RuntimeAddress.parse("tls://[::1]:9999") == RuntimeAddress("tls", host="::1", port=9999)
    with pytest.raises(ValueError, match="unix:/path"):
        RuntimeAddress.parse("http://x:1")
    with pytest.raises(HAProxyConfigError, match=RUNTIME_API_ENV):
        HAProxySettings.from_env({})
    with pytest.raises(HAProxyConfigError, match="HAPROXY_RUNTIME_TLS_CA"):
        HAProxySettings.from_env({RUNTIME_API_ENV: "tls://10.0.0.5:9999"})
    with pytest.raises(HAProxyConfigError, match="HAPROXY_RESYNC_SECONDS"):
        HAProxySettings.from_env({RUNTIME_API_ENV: "unix:/a", "HAPROXY_RESYNC_SECONDS": "soon"})
    found = HAProxySettings.from_env(
        {RUNTIME_API_ENV: "unix:/a.sock, unix:/b.sock", "HAPROXY_RESYNC_SECONDS": "3"}
    )
    assert [str(a) for a in found.addresses] == ["unix:/a.sock", "unix:/b.sock"] and found.resync == 3


def test_the_registry_and_the_command_line_name_the_adapter() -> None:
    assert "haproxy" in registry.names()
    adapter = registry.controller("haproxy", {RUNTIME_API_ENV: "unix:/run/haproxy/admin.sock"})
    assert adapter.get_controller_name() == "haproxy-controller"
    done = run_cli("adapters", timeout=60)
    assert done.returncode == 0 and "haproxy" in done.stdout


def test_show_stat_of_a_real_haproxy_and_its_refusals() -> None:
    with LocalHAProxy([Backend("web"), Backend("st", balance="static-rr")]) as haproxy:
        api = RuntimeAPI(haproxy.address)
        stat = api.stat()
        assert dict(stat.backends) == {"web": "roundrobin", "st": "static-rr"}
        assert stat.servers == ()
        api.add_server("web", "rc:ns:web:p", "127.0.0.9:80", ["check", "weight", "3"])
        (server,) = api.stat().servers
        assert (server.backend, server.name, server.addr, server.weight) == (
            "web",
            "rc:ns:web:p",
            "127.0.0.9:80",
            3,
        )
        assert server.maintenance and not server.up and server.checked is False
        api.enable_health("web", "rc:ns:web:p")
        for reason, call in (
            (Refusal.ALREADY_EXISTS, lambda: api.add_server("web", "rc:ns:web:p", "127.0.0.9:80", [])),
            (Refusal.STATIC_BACKEND, lambda: api.add_server("st", "x", "127.0.0.9:80", [])),
            (Refusal.NO_SUCH_BACKEND, lambda: api.add_server("nope", "x", "127.0.0.9:80", [])),
            (
                Refusal.NOT_IN_MAINTENANCE,
                lambda: (api.set_state("web", "rc:ns:web:p", "ready"), api.del_server("web", "rc:ns:web:p")),
            ),
        ):
            with pytest.raises(RuntimeAPIRefused) as refused:
                call()
            assert refused.value.reason is reason, refused.value.message
        api.set_state("web", "rc:ns:web:p", "maint")
        api.del_server("web", "rc:ns:web:p")
        assert api.stat().servers == ()


def test_a_connection_dropped_before_the_answer_is_unknown_not_success() -> None:
    with LocalHAProxy(["web"]) as haproxy, SocketProxy(haproxy.socket) as proxy:
        api = RuntimeAPI(proxy.address, timeout=2)
        api.add_server("web", "rc:ns:web:p", "127.0.0.9:80", [])
        proxy.fault("drop_answer", match="set server")
        # HAProxy acted, the answer was lost: that is no success, whatever the command.
        with pytest.raises(RuntimeAPIUnavailable, match="without an answer"):
            api.set_state("web", "rc:ns:web:p", "drain")
        assert api.stat().servers[0].draining
        proxy.clear()
        proxy.fault("refuse")
        with pytest.raises(RuntimeAPIUnavailable, match=r"no such socket|refused"):
            api.stat()
