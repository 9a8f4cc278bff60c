"""Credentials of the Alibaba Cloud SLB adapter: where they come from and where requests go.

``SLBAccess.from_env()`` picks the key source (RRSA through Alibaba Cloud's credentials library,
a credentials file re-read on change, the ECS RAM role, or a static pair) and the endpoint;
``SLBClient`` asks the source before every request, so rotated credentials are used without a
restart (docs/alibabacloudslb.md, "Credentials").

``SLBCredentials.from_env()`` reads the Go adapter's variables (``ALIYUN_SLB_AK_KEY``,
``ALIYUN_SLB_AK_SECRET``, ``ALIYUN_SLB_ENDPOINT``) and falls back to Alibaba Cloud's standard
``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET``. Both halves of the key are
``SecretStr``: no ``repr``, ``str``, log line or exception message built from this module shows them.
"""

from __future__ import annotations

import configparser
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, Self

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator

from resourceconsist.errors import ResourceConsistError

#: The Go adapter's credential variables (wire names, pinned by tests/api/test_wire.py).
SLB_ACCESS_KEY_ENV: Final = "ALIYUN_SLB_AK_KEY"
SLB_ACCESS_SECRET_ENV: Final = "ALIYUN_SLB_AK_SECRET"
SLB_ENDPOINT_ENV: Final = "ALIYUN_SLB_ENDPOINT"
#: Alibaba Cloud's standard credential variables, used when the SLB-specific pair is not set.
STANDARD_ACCESS_KEY_ENV: Final = "ALIBABA_CLOUD_ACCESS_KEY_ID"
STANDARD_ACCESS_SECRET_ENV: Final = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
#: Region variables, read first; without them the region comes from the endpoint's host name.
STANDARD_REGION_ENV: Final = "ALIBABA_CLOUD_REGION_ID"
SLB_REGION_ENV: Final = "ALIYUN_SLB_REGION"

# The SDK validates region ids against this pattern before it builds a request.
_REGION_RE: Final = re.compile(r"^[a-zA-Z0-9_-]+$")
# slb.<region>.aliyuncs.com, slb-vpc.<region>.aliyuncs.com; slb.aliyuncs.com carries no region.
_ENDPOINT_REGION_RE: Final = re.compile(r"^slb(?:-vpc)?\.([a-z0-9-]+)\.aliyuncs\.com$")


class CredentialsError(ResourceConsistError):
    """The SLB credentials or endpoint settings are missing or unusable."""


class MissingCredentials(CredentialsError):
    """A required credential or endpoint setting is absent from the environment."""


def _endpoint_host(endpoint: str) -> str:
    host = endpoint.strip()
    host = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", "", host)
    return host.split("/", 1)[0].lower()


def region_from_endpoint(endpoint: str) -> str | None:
    """The region id in an SLB endpoint host name (``slb.cn-hangzhou.aliyuncs.com``), if it has one."""
    match = _ENDPOINT_REGION_RE.match(_endpoint_host(endpoint))
    return match.group(1) if match else None


class SLBCredentials(BaseModel):
    """An access key pair plus the SLB endpoint and region the requests go to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    access_key_id: SecretStr
    access_key_secret: SecretStr
    region_id: str
    endpoint: str

    @field_validator("region_id")
    @classmethod
    def _check_region(cls, value: str) -> str:
        if not _REGION_RE.match(value):
            raise ValueError(f"region id {value!r} is not of the form [a-zA-Z0-9_-]+")
        return value

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str) -> str:
        host = _endpoint_host(value)
        if not host or any(ch.isspace() for ch in host):
            raise ValueError("endpoint must be a host name such as slb.cn-hangzhou.aliyuncs.com")
        return host

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the credentials from ``environ`` (default: the process environment).

        The SLB-specific pair wins when either of its variables is set, so a key id from one pair
        is never combined with the secret of the other. The region comes from
        ``ALIBABA_CLOUD_REGION_ID`` or ``ALIYUN_SLB_REGION``, else from the endpoint's host name;
        without an endpoint, the regional one (``slb.<region>.aliyuncs.com``) is used.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            return env.get(name, "").strip()

        if get(SLB_ACCESS_KEY_ENV) or get(SLB_ACCESS_SECRET_ENV):
            key_names = (SLB_ACCESS_KEY_ENV, SLB_ACCESS_SECRET_ENV)
        else:
            key_names = (STANDARD_ACCESS_KEY_ENV, STANDARD_ACCESS_SECRET_ENV)
        key_id, secret = get(key_names[0]), get(key_names[1])
        missing = [name for name, value in zip(key_names, (key_id, secret), strict=True) if not value]
        if missing:
            raise MissingCredentials(
                f"Alibaba Cloud SLB credentials are incomplete: {' and '.join(missing)} not set. "
                f"Set {SLB_ACCESS_KEY_ENV} and {SLB_ACCESS_SECRET_ENV} (or {STANDARD_ACCESS_KEY_ENV} "
                f"and {STANDARD_ACCESS_SECRET_ENV}), plus {SLB_ENDPOINT_ENV} "
                f"(e.g. slb.cn-hangzhou.aliyuncs.com) or {STANDARD_REGION_ENV}."
            )

        region, endpoint = resolve_endpoint(env)
        return cls(
            access_key_id=SecretStr(key_id),
            access_key_secret=SecretStr(secret),
            region_id=region,
            endpoint=endpoint,
        )


# --------------------------------------------------------------------------------------------
# Key sources: where the access key of every request comes from (docs/alibabacloudslb.md,
# "Credentials"). The SDK signs with fixed credentials, so ``SLBClient`` asks its source before
# each request and re-signs with whatever the source answers now.

#: RRSA (OIDC → STS): the variables ACK's pod identity webhook or the chart sets.
ROLE_ARN_ENV: Final = "ALIBABA_CLOUD_ROLE_ARN"
OIDC_PROVIDER_ARN_ENV: Final = "ALIBABA_CLOUD_OIDC_PROVIDER_ARN"
OIDC_TOKEN_FILE_ENV: Final = "ALIBABA_CLOUD_OIDC_TOKEN_FILE"
ROLE_SESSION_NAME_ENV: Final = "ALIBABA_CLOUD_ROLE_SESSION_NAME"
#: Where ``AssumeRoleWithOIDC`` goes: an explicit endpoint (host[:port]) wins, else the region's.
STS_ENDPOINT_ENV: Final = "ALIBABA_CLOUD_STS_ENDPOINT"
STS_REGION_ENV: Final = "ALIBABA_CLOUD_STS_REGION"
STS_VPC_ENV: Final = "ALIBABA_CLOUD_VPC_ENDPOINT_ENABLED"
#: Seconds an STS session lasts (900 s at least; the library renews 15 minutes before the end).
ROLE_SESSION_SECONDS_ENV: Final = "ALIBABA_CLOUD_ROLE_SESSION_EXPIRATION"
#: An access key in the library's credentials file format (an INI file, profile sections).
CREDENTIALS_FILE_ENV: Final = "ALIBABA_CLOUD_CREDENTIALS_FILE"
PROFILE_ENV: Final = "ALIBABA_CLOUD_PROFILE"
#: The ECS instance RAM role's name (the credentials come from the instance metadata service).
ECS_ROLE_ENV: Final = "ALIBABA_CLOUD_ECS_METADATA"

_DEFAULT_SESSION_SECONDS: Final = 3600
_STS_CONNECT_MS: Final = 2000
_STS_READ_MS: Final = 5000
_RRSA_ENVS: Final = (ROLE_ARN_ENV, OIDC_PROVIDER_ARN_ENV, OIDC_TOKEN_FILE_ENV)


@dataclass(frozen=True)
class AccessKey:
    """One set of credentials to sign with: a key pair, plus the STS token of a temporary one."""

    access_key_id: str = field(repr=False)
    access_key_secret: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)


class AccessKeySource(Protocol):
    """Answers the credentials to sign the next request with; cheap when nothing changed."""

    @property
    def kind(self) -> str:
        """What the credentials come from, for logs (``rrsa``, ``credentials-file``, ...)."""
        ...

    def current(self) -> AccessKey:
        """The credentials valid now; ``CredentialsError`` when they cannot be had."""
        ...


class StaticAccessKeySource:
    """A fixed key pair (the ``ALIYUN_SLB_AK_*`` variables): rotating it takes a restart."""

    kind = "static"

    def __init__(self, key: AccessKey) -> None:
        self._key = key

    def current(self) -> AccessKey:
        return self._key


class CredentialsFileSource:
    """An ``access_key`` profile of the library's credentials file, re-read whenever the file
    changes on disk (a rotated Secret mounted as a file is used without a restart).

    The library's own profile provider reads the file once per process, so it is not used here.
    """

    kind = "credentials-file"

    def __init__(self, path: str, profile: str = "default") -> None:
        self._path = path
        self._profile = profile
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._key: AccessKey | None = None

    def current(self) -> AccessKey:
        try:
            stat = os.stat(self._path)
        except OSError as exc:
            raise CredentialsError(
                f"cannot read the credentials file {self._path} ({CREDENTIALS_FILE_ENV}): {exc.strerror}"
            ) from None
        # A Secret volume swaps a symlink, so inode, size and mtime all change on rotation.
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if self._key is None or seen != self._seen:
                self._key = self._read()
                self._seen = seen
            return self._key

    def _read(self) -> AccessKey:
        parser = configparser.ConfigParser()
        try:
            with open(self._path, encoding="utf-8") as file:
                parser.read_file(file)
        except (OSError, configparser.Error) as exc:
            raise CredentialsError(
                f"cannot parse the credentials file {self._path} ({CREDENTIALS_FILE_ENV}): "
                f"{type(exc).__name__}; it must be an INI file with a [{self._profile}] section"
            ) from None
        if not parser.has_section(self._profile):
            raise CredentialsError(
                f"the credentials file {self._path} has no [{self._profile}] profile "
                f"(set {PROFILE_ENV} to the profile to use)"
            )
        section = parser[self._profile]
        kind = section.get("type", "access_key").strip()
        key_id = section.get("access_key_id", "").strip()
        secret = section.get("access_key_secret", "").strip()
        if kind != "access_key" or not key_id or not secret:
            raise CredentialsError(
                f"profile [{self._profile}] of {self._path} must be type = access_key with "
                "access_key_id and access_key_secret (use the RRSA variables for a role)"
            )
        return AccessKey(key_id, secret)


class LibraryAccessKeySource:
    """A provider of Alibaba Cloud's credentials library (RRSA/OIDC, ECS RAM role): it caches
    temporary credentials and fetches new ones before they expire (docs/alibabacloudslb.md)."""

    def __init__(self, kind: str, provider: Any) -> None:
        self.kind = kind
        self.provider = provider

    def current(self) -> AccessKey:
        try:
            credentials = self.provider.get_credentials()
        except Exception as exc:
            # The library's texts carry no secret (they quote HTTP status and response bodies).
            raise CredentialsError(
                f"cannot get {self.kind} credentials: {type(exc).__name__}: {exc}"
            ) from None
        return AccessKey(
            credentials.get_access_key_id(),
            credentials.get_access_key_secret(),
            credentials.get_security_token() or None,
        )


def _quiet_library_logger() -> None:
    # The library's ECS module puts its own stderr handler on the "credentials" logger; the
    # process's logging setup decides where lines go (docs/observability.md).
    library_log = logging.getLogger("credentials")
    for handler in list(library_log.handlers):
        library_log.removeHandler(handler)


def rrsa_source(environ: Mapping[str, str]) -> LibraryAccessKeySource:
    """RRSA: the pod's projected service-account token exchanged at STS for a role's temporary
    key (``AssumeRoleWithOIDC``); the token file is re-read at every exchange."""
    from alibabacloud_credentials.http import HttpOptions
    from alibabacloud_credentials.provider.oidc import OIDCRoleArnCredentialsProvider

    _quiet_library_logger()
    env = {name: environ.get(name, "").strip() for name in (*_RRSA_ENVS, STS_ENDPOINT_ENV, STS_REGION_ENV)}
    seconds_text = environ.get(ROLE_SESSION_SECONDS_ENV, "").strip()
    try:
        seconds = int(seconds_text) if seconds_text else _DEFAULT_SESSION_SECONDS
        provider = OIDCRoleArnCredentialsProvider(
            role_arn=env[ROLE_ARN_ENV],
            oidc_provider_arn=env[OIDC_PROVIDER_ARN_ENV],
            oidc_token_file_path=env[OIDC_TOKEN_FILE_ENV],
            role_session_name=environ.get(ROLE_SESSION_NAME_ENV, "").strip() or "resourceconsist",
            duration_seconds=seconds,
            sts_endpoint=env[STS_ENDPOINT_ENV] or None,
            sts_region_id=env[STS_REGION_ENV] or None,
            enable_vpc=environ.get(STS_VPC_ENV, "").strip().lower() == "true",
            # A renewal runs inside an SLB call: shorter than the library's 5 s + 10 s, so it fits
            # the call's deadline (ALIYUN_SLB_CALL_DEADLINE_SECONDS, 10 s by default).
            http_options=HttpOptions(connect_timeout=_STS_CONNECT_MS, read_timeout=_STS_READ_MS),
        )
    except ValueError as exc:
        raise CredentialsError(
            f"invalid RRSA settings: {exc} ({ROLE_SESSION_SECONDS_ENV} must be a whole number of "
            "seconds, 900 or more)"
        ) from None
    return LibraryAccessKeySource("rrsa", provider)


def ecs_role_source(role_name: str) -> LibraryAccessKeySource:
    """The ECS instance's RAM role, from the metadata service at 100.100.100.200.

    Built without the library's background refresh (``async_update_enabled=False``): that one
    starts a scheduler thread and an exit hook of its own; here credentials are fetched when a
    request needs them, and the process's signal handling stays the controller's.
    """
    from alibabacloud_credentials.provider.ecs_ram_role import EcsRamRoleCredentialsProvider

    _quiet_library_logger()
    provider = EcsRamRoleCredentialsProvider(role_name=role_name, async_update_enabled=False)
    return LibraryAccessKeySource("ecs-ram-role", provider)


@dataclass(frozen=True)
class SLBAccess:
    """Where SLB requests go (region, endpoint) and where their credentials come from."""

    region_id: str
    endpoint: str
    source: AccessKeySource

    @classmethod
    def from_credentials(cls, credentials: SLBCredentials) -> SLBAccess:
        key = AccessKey(
            credentials.access_key_id.get_secret_value(), credentials.access_key_secret.get_secret_value()
        )
        return cls(credentials.region_id, credentials.endpoint, StaticAccessKeySource(key))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SLBAccess:
        """The first configured source, in this order: RRSA (all of ``ALIBABA_CLOUD_ROLE_ARN``,
        ``ALIBABA_CLOUD_OIDC_PROVIDER_ARN``, ``ALIBABA_CLOUD_OIDC_TOKEN_FILE``), a credentials
        file (``ALIBABA_CLOUD_CREDENTIALS_FILE``), the ECS RAM role (``ALIBABA_CLOUD_ECS_METADATA``),
        and last the static key pair of ``SLBCredentials.from_env``. Short-lived credentials come
        first so that a leftover static Secret never overrides a configured role."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            return env.get(name, "").strip()

        rrsa_set = [name for name in _RRSA_ENVS if get(name)]
        if rrsa_set:
            missing = [name for name in _RRSA_ENVS if not get(name)]
            if missing:
                raise MissingCredentials(
                    f"RRSA credentials are incomplete: {' and '.join(missing)} not set "
                    f"(RRSA needs all of {', '.join(_RRSA_ENVS)})."
                )
            region, endpoint = resolve_endpoint(env)
            return cls(region, endpoint, rrsa_source(env))
        if get(CREDENTIALS_FILE_ENV):
            region, endpoint = resolve_endpoint(env)
            source = CredentialsFileSource(get(CREDENTIALS_FILE_ENV), get(PROFILE_ENV) or "default")
            return cls(region, endpoint, source)
        if get(ECS_ROLE_ENV):
            region, endpoint = resolve_endpoint(env)
            return cls(region, endpoint, ecs_role_source(get(ECS_ROLE_ENV)))
        if not any(
            get(name)
            for name in (
                SLB_ACCESS_KEY_ENV,
                SLB_ACCESS_SECRET_ENV,
                STANDARD_ACCESS_KEY_ENV,
                STANDARD_ACCESS_SECRET_ENV,
            )
        ):
            raise MissingCredentials(
                "Alibaba Cloud SLB credentials are not configured. Recommended: RRSA, set "
                f"{', '.join(_RRSA_ENVS)} (the chart's credentials.rrsa values do). Otherwise set "
                f"{CREDENTIALS_FILE_ENV} (an access_key profile file), {ECS_ROLE_ENV} (the ECS "
                f"instance's RAM role), or {SLB_ACCESS_KEY_ENV} and {SLB_ACCESS_SECRET_ENV}, plus "
                f"{SLB_ENDPOINT_ENV} (e.g. slb.cn-hangzhou.aliyuncs.com) or {STANDARD_REGION_ENV}."
            )
        return cls.from_credentials(SLBCredentials.from_env(env))


def resolve_endpoint(environ: Mapping[str, str]) -> tuple[str, str]:
    """(region id, endpoint host) from the environment, as ``SLBCredentials.from_env`` reads them."""

    def get(name: str) -> str:
        return environ.get(name, "").strip()

    endpoint = get(SLB_ENDPOINT_ENV)
    region = get(STANDARD_REGION_ENV) or get(SLB_REGION_ENV)
    if not region and endpoint:
        region = region_from_endpoint(endpoint) or ""
    if not region:
        raise MissingCredentials(
            "Alibaba Cloud SLB region is unknown: set "
            f"{SLB_ENDPOINT_ENV} to a regional endpoint such as slb.cn-hangzhou.aliyuncs.com, "
            f"or set {STANDARD_REGION_ENV} (or {SLB_REGION_ENV})."
        )
    if not _REGION_RE.match(region):
        raise CredentialsError(
            f"region id {region!r} is not of the form [a-zA-Z0-9_-]+ ({STANDARD_REGION_ENV})"
        )
    host = _endpoint_host(endpoint or f"slb.{region}.aliyuncs.com")
    if not host or any(ch.isspace() for ch in host):
        raise CredentialsError(f"{SLB_ENDPOINT_ENV} must be a host name such as slb.cn-hangzhou.aliyuncs.com")
    return region, host
