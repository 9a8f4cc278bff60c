"""Adapter registries by name: unknown names fail listing the known ones and leave the manager
untouched; add-these-names and add-all add controllers; experimental adapters are flagged."""

from __future__ import annotations

import pytest

from resourceconsist import adapters, experimental
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.experimental.demo import DemoAdapter
from resourceconsist.registry import AdapterRegistry, UnknownAdapterError, combined
from resourceconsist.runtime.manager import Manager


def _manager() -> Manager:
    # Nothing here talks to an API server: adding controllers to a stopped manager is local.
    return Manager(KubeClient(api_client=None))


async def test_an_unknown_name_lists_the_known_ones_and_adds_nothing() -> None:
    manager = _manager()
    with pytest.raises(UnknownAdapterError, match=r"no adapter named 'nosuch'; known adapters: demo"):
        await experimental.add_to_manager(manager, ["demo", "nosuch"])
    assert manager.controllers == {}


async def test_add_these_names_and_add_all() -> None:
    manager = _manager()
    added = await experimental.add_to_manager(manager, ["demo"])
    assert [c.name for c in added] == ["demo-controller"]
    assert isinstance(manager.controllers["demo-controller"].adapter, DemoAdapter)

    registry = AdapterRegistry()
    registry.register("a", controller=lambda env: DemoAdapter(name="a"))
    registry.register("b", controller=lambda env: DemoAdapter(name="b"))
    registry.register("hook-only", webhook=lambda env: object())
    other = _manager()
    await registry.add_all_to_manager(other)
    assert sorted(other.controllers) == ["a", "b"]


async def test_missing_settings_fail_before_anything_is_added() -> None:
    manager = _manager()
    with pytest.raises(Exception, match="ALIYUN_SLB_AK_KEY"):
        await adapters.add_to_manager(manager, ["alibabacloudslb"], environ={})
    assert manager.controllers == {}


def test_registries_know_their_adapters_and_flag_experimental_ones() -> None:
    assert "alibabacloudslb" in adapters.registry
    assert not adapters.registry.entry("alibabacloudslb").experimental
    assert experimental.registry.entry("demo").experimental
    merged = combined(adapters.registry, experimental.registry, include_entry_points=False)
    assert not adapters.registry.entry("haproxy").experimental
    assert merged.names() == ["alibabacloudslb", "demo", "haproxy"]
    with pytest.raises(ValueError, match="already registered"):
        experimental.registry.register("demo", controller=lambda env: DemoAdapter())
