"""Waiting for a condition with a deadline: the only way tests here wait.

``wait_for`` polls a function until it returns something truthy and returns that value, or
raises ``WaitTimeout`` (an AssertionError, so pytest shows it as a failure) naming what was
awaited and the last value or error seen. ``async_wait_for`` does the same inside an event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not hold before the deadline."""


def _timeout(message: str, timeout: float, last: object) -> WaitTimeout:
    return WaitTimeout(f"timed out after {timeout:.1f}s waiting for {message}; last seen: {last!r}")


def wait_for(
    condition: Callable[[], T],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition`` until it returns a truthy value; return that value.

    Exceptions of the types in ``ignore`` count as "not yet" (e.g. a 404 before an object exists).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
            if value:
                return value
            last = value
        except ignore as err:
            last = err
        if time.monotonic() >= deadline:
            raise _timeout(message, timeout, last)
        time.sleep(interval)


@overload
async def async_wait_for(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
    ignore: tuple[type[BaseException], ...] = ...,
) -> T: ...


@overload
async def async_wait_for(
    condition: Callable[[], T],
    *,
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
    ignore: tuple[type[BaseException], ...] = ...,
) -> T: ...


async def async_wait_for(
    condition: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """``wait_for`` for coroutines: ``condition`` may be a plain or an async function."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = condition()
            value = await result if inspect.isawaitable(result) else result
            if value:
                return value
            last = value
        except ignore as err:
            last = err
        if time.monotonic() >= deadline:
            raise _timeout(message, timeout, last)
        await asyncio.sleep(interval)
