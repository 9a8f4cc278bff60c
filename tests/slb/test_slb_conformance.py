"""The provider-neutral conformance suite (resourceconsist.testing.conformance) on the
``alibabacloudslb`` adapter in manage mode and the SLB emulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.testing.conformance import AdapterConformance, ProviderHarness

from .harness import SLBHarness


class TestSLBConformance(AdapterConformance):
    @pytest.fixture
    def harness(self) -> Iterator[ProviderHarness]:
        with SLBEmulator(seed=36) as slb:
            harness = SLBHarness(slb)
            try:
                yield harness
            finally:
                harness.close()
