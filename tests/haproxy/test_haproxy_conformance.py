"""The provider-neutral conformance suite (resourceconsist.testing.conformance) on the ``haproxy``
adapter and a real HAProxy, with faults from the proxy in front of its runtime API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from resourceconsist.testing.conformance import AdapterConformance, ProviderHarness
from resourceconsist.testing.haproxy import LocalHAProxy, PodServers, SocketProxy

from .harness import BACKENDS, HAProxyHarness


class TestHAProxyConformance(AdapterConformance):
    @pytest.fixture
    def harness(self) -> Iterator[ProviderHarness]:
        with LocalHAProxy(BACKENDS) as haproxy, PodServers() as servers, SocketProxy(haproxy.socket) as proxy:
            yield HAProxyHarness(haproxy, servers, proxy)
