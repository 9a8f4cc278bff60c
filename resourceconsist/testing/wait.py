"""Waiting for a condition with a deadline: the only way tests here wait.

``wait_for`` polls a function until it returns something truthy and returns that value, or
raises ``WaitTimeout`` (an AssertionError, so pytest shows it as a failure) naming what was
awaited and the last value or error seen. ``async_wait_for`` does the same inside an event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not hold before the deadline."""


class _Poll:
    """What both waits share: the deadline, what an attempt saw, and the error at the end."""

    def __init__(self, timeout: float, message: str, ignore: tuple[type[BaseException], ...]) -> None:
        self.timeout = timeout
        self.message = message
        self.ignore = ignore
        self.deadline = time.monotonic() + timeout
        self.last: object = None

    @contextmanager
    def attempt(self) -> Iterator[None]:
        """One call of the condition; an exception of the ``ignore`` types counts as "not yet"."""
        try:
            yield
        except self.ignore as err:
            self.last = err

    def give_up_if_late(self) -> None:
        if time.monotonic() >= self.deadline:
            raise WaitTimeout(
                f"timed out after {self.timeout:.1f}s waiting for {self.message}; last seen: {self.last!r}"
            )


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
    It sleeps between attempts, so it is for code off the event loop; coroutines use
    ``async_wait_for`` (resourceconsist.flow.cancellation: nothing on the loop waits on a thread).
    """
    poll = _Poll(timeout, message, ignore)
    while True:
        with poll.attempt():
            poll.last = value = condition()
            if value:
                return value
        poll.give_up_if_late()
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
    poll = _Poll(timeout, message, ignore)
    while True:
        with poll.attempt():
            result = condition()
            poll.last = value = await result if inspect.isawaitable(result) else result
            if value:
                return value
        poll.give_up_if_late()
        await asyncio.sleep(interval)
