"""Credentials of the Alibaba Cloud SLB adapter: the access key pair and where to send requests.

``SLBCredentials.from_env()`` reads the Go adapter's variables (``ALIYUN_SLB_AK_KEY``,
``ALIYUN_SLB_AK_SECRET``, ``ALIYUN_SLB_ENDPOINT``) and falls back to Alibaba Cloud's standard
``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET``. Both halves of the key are
``SecretStr``: no ``repr``, ``str``, log line or exception message built from this module shows them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Final, Self

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
        if not endpoint:
            endpoint = f"slb.{region}.aliyuncs.com"
        try:
            return cls(
                access_key_id=SecretStr(key_id),
                access_key_secret=SecretStr(secret),
                region_id=region,
                endpoint=endpoint,
            )
        except ValueError as exc:
            # pydantic's message quotes the offending input; only region and endpoint can fail
            # here, and neither is secret, but say which settings to check rather than echo it.
            raise CredentialsError(
                f"invalid SLB endpoint or region settings ({SLB_ENDPOINT_ENV}, {STANDARD_REGION_ENV}, "
                f"{SLB_REGION_ENV}): {exc}"
            ) from None
