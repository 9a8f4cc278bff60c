"""The async tests run on the event loop ``--event-loop`` names (tests/conftest.py): uvloop's by
default, the loop ``run`` and ``webhook`` serve on; the standard library's with ``--event-loop
asyncio``, as CI's unit runs on Python 3.12 and 3.13 do (docs/testing.md, "The event loop")."""

from __future__ import annotations

import asyncio

import pytest


async def test_async_tests_run_on_the_loop_the_option_names(pytestconfig: pytest.Config) -> None:
    made_by = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    assert made_by == pytestconfig.getoption("--event-loop")
