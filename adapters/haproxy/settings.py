"""The ``haproxy`` adapter's settings, from the environment when the registry builds it
(``controller_from_env``): which HAProxy instances, how to reach them, how long a command may
take, how often every Service is looked at again. In Python, build ``RuntimeAPI`` objects and
pass them to ``HAProxyAdapter`` directly. docs/haproxy.md, "Settings".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Self

from .config import HAProxyConfigError
from .runtime import DEFAULT_TIMEOUT_SECONDS, RuntimeAddress, RuntimeAPI, RuntimeTLS

#: Comma-separated runtime API addresses, one per instance (an HA pair: two), e.g.
#: ``unix:/run/haproxy/admin.sock`` or ``tls://10.0.0.5:9999,tls://10.0.0.6:9999``.
RUNTIME_API_ENV: Final = "HAPROXY_RUNTIME_API"
#: For ``tls://`` addresses: the CA of HAProxy's certificate, this controller's certificate and
#: key, and (optional) the name on HAProxy's certificate when it is not the host.
TLS_CA_ENV: Final = "HAPROXY_RUNTIME_TLS_CA"
TLS_CERT_ENV: Final = "HAPROXY_RUNTIME_TLS_CERT"
TLS_KEY_ENV: Final = "HAPROXY_RUNTIME_TLS_KEY"
TLS_SERVER_NAME_ENV: Final = "HAPROXY_RUNTIME_TLS_SERVER_NAME"
#: Seconds one runtime API command may take, connection included (default 5).
TIMEOUT_ENV: Final = "HAPROXY_COMMAND_TIMEOUT_SECONDS"
#: Seconds within which every Service is looked at again when nothing else brings a pass: how
#: long a reloaded HAProxy may miss its runtime servers (default 10).
RESYNC_ENV: Final = "HAPROXY_RESYNC_SECONDS"


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = (env.get(name) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise HAProxyConfigError(f"{name}={text!r} is not a number of seconds above 0 (at most 3600)")
    return value


@dataclass(frozen=True)
class HAProxySettings:
    """Everything ``controller_from_env`` reads (see the module doc)."""

    addresses: tuple[RuntimeAddress, ...]
    tls: RuntimeTLS | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    resync: float = 10.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """``HAProxyConfigError`` naming the variable at fault and what to set."""
        env = os.environ if environ is None else environ
        raw = [a.strip() for a in (env.get(RUNTIME_API_ENV) or "").split(",") if a.strip()]
        if not raw:
            raise HAProxyConfigError(
                f"the haproxy adapter needs {RUNTIME_API_ENV}: the runtime API of each HAProxy instance, "
                "comma-separated (unix:/run/haproxy/admin.sock, tls://host:port)"
            )
        try:
            addresses = tuple(RuntimeAddress.parse(a) for a in raw)
        except ValueError as err:
            raise HAProxyConfigError(f"{RUNTIME_API_ENV}: {err}") from None
        tls = None
        files = {name: (env.get(name) or "").strip() for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV)}
        if any(a.scheme == "tls" for a in addresses):
            missing = [name for name, value in files.items() if not value]
            if missing:
                raise HAProxyConfigError(
                    f"{RUNTIME_API_ENV} names a tls:// address: set {', '.join(missing)} (the CA of "
                    "HAProxy's certificate, this controller's client certificate and key)"
                )
            tls = RuntimeTLS(
                ca_file=files[TLS_CA_ENV],
                cert_file=files[TLS_CERT_ENV],
                key_file=files[TLS_KEY_ENV],
                server_name=(env.get(TLS_SERVER_NAME_ENV) or "").strip() or None,
            )
        return cls(
            addresses=addresses,
            tls=tls,
            timeout=_seconds(env, TIMEOUT_ENV, DEFAULT_TIMEOUT_SECONDS),
            resync=_seconds(env, RESYNC_ENV, 10.0),
        )

    def instances(self) -> tuple[RuntimeAPI, ...]:
        return tuple(RuntimeAPI(a, tls=self.tls, timeout=self.timeout) for a in self.addresses)
