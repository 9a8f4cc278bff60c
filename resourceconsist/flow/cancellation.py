"""What lets a reconcile pass be abandoned: its cancellation signal, and the threads it runs in.

``Cancellation`` is the signal of one pass: the frame cancels it when the controller stops (or
its deadline passes), and an adapter sees it as ``ctx.cancellation`` or, from any code running
for the pass (worker threads included: ``asyncio.to_thread`` copies context variables),
``current_cancellation()``. Blocking adapter code checks it between steps, sleeps with
``wait()`` so that a stop wakes it, and caps its own timeouts by ``remaining()``.

``DaemonThreadExecutor`` runs blocking adapter calls in daemon threads. A request already sent
cannot be taken back, but the thread waiting for its answer must not keep the process alive
after a stop: the frame abandons it (docs/concepts.md, "Stopping within the shutdown timeout").

One rule for sync and async (docs/concepts.md, "The runtime"):

- Every blocking operation has one, synchronous, form: the kube client, the provider clients,
  a plain adapter method. No module keeps an ``a*`` twin of it.
- Async code that needs one calls it through ``call_adapter``, the one "call this whether it is
  sync or async" helper: a coroutine function is awaited on the loop, a plain function runs in
  an ``ADAPTER_THREADS`` daemon thread in a copy of the caller's context (so it sees
  ``current_cancellation()``), and an awaitable it returns is awaited. Adapter methods, provider
  clients and the testing kit go through it.
- The frame's own API-server calls (Events, leader election, the webhook's certificate bootstrap,
  stopping informers) use ``asyncio.to_thread``: the loop's default executor, which the manager
  makes a daemon pool of its own. A provider that hangs fills ``ADAPTER_THREADS`` only, never
  the pool that renews the leader lease.
- The hot path is the one exception: a pass's pod writes, the employer's finalizers and record
  annotations and the readiness gates go out on the event loop through
  ``resourceconsist.cluster.aiokube``, which sends ``KubeClient``'s own requests (its counters, errors
  and conflict loop) without a thread per request, and falls back to ``asyncio.to_thread``
  where it cannot serve the client (docs/concepts.md, "The runtime").
- Nothing that runs on the event loop waits on a threading primitive (``Event.wait``, a lock,
  ``time.sleep``); where such a wait is the only way, it raises instead of blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from resourceconsist.errors import PassCancelled, frames_dropped
from resourceconsist.flow.fence import check_fence

T = TypeVar("T")


class Cancellation:
    """A cancellation signal with an optional deadline (a ``time.monotonic()`` value); thread-safe."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def stopped(self) -> bool:
        """``cancel()`` was called: the controller is stopping (not: the deadline passed)."""
        return self._event.is_set()

    @property
    def cancelled(self) -> bool:
        """``cancel()`` was called, or the deadline has passed."""
        if self._event.is_set():
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def remaining(self) -> float | None:
        """Seconds left before the deadline (0 once cancelled); ``None``: no deadline."""
        if self._event.is_set():
            return 0.0
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise ``PassCancelled`` when cancelled or past the deadline."""
        if self._event.is_set():
            raise PassCancelled("the reconcile pass was cancelled: the controller is stopping")
        if self.cancelled:
            raise PassCancelled("the reconcile pass ran past its deadline")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (less when the deadline comes first); wake at once on ``cancel()``.

        Returns whether the pass is cancelled by then.
        """
        left = self.remaining()
        timeout = max(0.0, seconds if left is None else min(seconds, left))
        self._event.wait(timeout)
        return self.cancelled

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled else "live"
        return f"Cancellation({state}, remaining={self.remaining()})"


_CURRENT: contextvars.ContextVar[Cancellation | None] = contextvars.ContextVar(
    "resourceconsist_pass_cancellation", default=None
)


def current_cancellation() -> Cancellation:
    """The running pass's cancellation; outside a pass, a fresh one that is never cancelled."""
    found = _CURRENT.get()
    return Cancellation() if found is None else found


@contextmanager
def running_pass(cancellation: Cancellation) -> Iterator[Cancellation]:
    """Make ``cancellation`` the current one for the code run inside (and the threads it starts)."""
    token = _CURRENT.set(cancellation)
    try:
        yield cancellation
    finally:
        _CURRENT.reset(token)


class DaemonThreadExecutor(ThreadPoolExecutor):
    """An executor whose worker threads are daemons and whose ``shutdown`` never waits on a call.

    ``ThreadPoolExecutor`` joins its workers at interpreter exit, so one call stuck in a hung
    provider request holds a stopped process open. Here, calls still running at shutdown are
    abandoned; queued ones are cancelled. Idle workers exit after ``idle_seconds``. It is a
    ``ThreadPoolExecutor`` by type only (none of its machinery runs), because asyncio accepts
    nothing else as a loop's default executor, the one ``asyncio.to_thread`` uses.

    A hand-off is made cheap where calls come in bursts (docs/benchmarks.md, "Thread
    hand-offs"): calls wait in a ``queue.SimpleQueue``, whose ``put`` wakes a waiting worker
    without Python-level bookkeeping, and a worker that finds more calls queued takes the next
    without sleeping; ``run_soon`` hands an event loop the outcomes of the calls that finished
    while it was busy in one wake-up, where ``run_in_executor`` wakes it once per call.
    """

    _ids = itertools.count(1)

    def __init__(
        self, max_workers: int = 32, *, name: str = "resourceconsist", idle_seconds: float = 60.0
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._max_workers = max_workers
        self._name = name
        self._idle_seconds = idle_seconds
        #: Queued calls, each with what cancels it; None tells a worker to leave (shutdown).
        self._queue: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()
        # Guarded by the lock: the workers, how many of them run a call now, how many calls
        # wait in the queue (so a put knows whether a worker will take it or one must start).
        self._lock = threading.Lock()
        self._workers: set[threading.Thread] = set()
        self._busy = 0
        self._pending = 0
        self._closed = False
        self._outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = (
            weakref.WeakKeyDictionary()
        )

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()

        def work() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as err:
                    # The future keeps the error, and this frame the future (frames_dropped says why).
                    future.set_exception(frames_dropped(err))
                else:
                    future.set_result(result)

        self._put(_Queued(work, future.cancel))
        return future

    def run_soon(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn`` in a worker; its outcome on the running loop's future. Outcomes that
        come while the loop is busy reach it in one wake-up. A call whose future is cancelled
        before a worker takes it does not run; one already running is abandoned."""
        loop = asyncio.get_running_loop()
        outbox = self._outboxes.get(loop)
        if outbox is None:
            outbox = self._outboxes.setdefault(loop, _Outbox(loop))
        future: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            # Read from this thread: a stale "not cancelled" only runs a call nobody awaits.
            if future.cancelled():
                return
            try:
                result = fn()
            except BaseException as err:
                # The future keeps the error, and this frame the future (frames_dropped says why).
                outbox.post(future, None, frames_dropped(err))
            else:
                outbox.post(future, result, None)

        self._put(_Queued(work, lambda: outbox.cancel(future)))
        return future

    def _put(self, queued: _Queued) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._pending += 1
            self._queue.put(queued)
            # Workers not running a call are waiting for one (or about to): a new one starts
            # only when the calls waiting outnumber them.
            if self._pending > len(self._workers) - self._busy and len(self._workers) < self._max_workers:
                name = f"{self._name}-{next(self._ids)}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                self._workers.add(thread)
                thread.start()
            # else: a waiting worker takes it, or the first busy one to finish.

    def _next(self) -> _Queued | None:
        """The next call to run; None when this worker should leave (idle too long, or closed)."""
        me = threading.current_thread()
        while True:
            try:
                queued = self._queue.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._pending and not self._closed:
                        continue  # a call came as the wait ended: it is this worker's to take
                    self._workers.discard(me)
                    return None
            with self._lock:
                if queued is None:
                    self._workers.discard(me)
                    return None
                self._pending -= 1
                self._busy += 1
                return queued

    def _work(self) -> None:
        while (queued := self._next()) is not None:
            try:
                queued.work()
            finally:
                with self._lock:
                    self._busy -= 1
            del queued  # drop the call and its outcome before waiting for the next

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls and cancel queued ones; running calls are abandoned, never awaited."""
        with self._lock:
            self._closed = True
            queued: list[_Queued] = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    queued.append(item)
            self._pending = 0
            for _ in self._workers:
                self._queue.put(None)
        for item in queued:
            item.cancel()


@dataclass(frozen=True, slots=True)
class _Queued:
    """A call waiting for a worker: what runs it and delivers its outcome, and what cancels it."""

    work: Callable[[], None]
    cancel: Callable[[], object]


class _Outbox:
    """The outcomes of ``run_soon`` calls on their way to one event loop: the first of a batch
    schedules the delivery; those that come before it runs ride along."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the pool keeps an outbox per loop in a weak mapping, which a strong reference
        # from the value back to its key would keep alive for ever.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []

    def post(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        if isinstance(error, StopIteration):  # an asyncio future refuses it (as a coroutine does)
            error = RuntimeError(f"the call raised StopIteration: {error!r}")
        with self._lock:
            first = not self._ready
            self._ready.append((future, result, error))
        if first:
            self._schedule(self._deliver)

    def cancel(self, future: asyncio.Future[Any]) -> None:
        self._schedule(future.cancel)

    def _schedule(self, callback: Callable[[], object]) -> None:
        loop = self._loop()
        if loop is None:
            return  # the loop is gone, and with it whatever awaited its futures
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing awaits its futures
            loop.call_soon_threadsafe(callback)

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for future, result, error in ready:
            if future.done():
                continue  # cancelled while the call ran
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)


def _fenced(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in its worker thread, unless the Lease the caller acts for is no longer
    surely held (checked in the thread, right before the call: no hand-off in between)."""
    check_fence()
    return fn(*args)


#: Where plain (blocking) calls run: daemon threads, so that a call stuck in a hung provider is
#: abandoned on stop instead of holding the process open (docs/concepts.md, "Stopping within the
#: shutdown timeout").
ADAPTER_THREADS: Final = DaemonThreadExecutor(name="resourceconsist-adapter")


async def call_adapter(fn: Callable[..., Any], *args: Any) -> Any:
    """Await a coroutine function on the loop; run a plain one in a worker thread, never on the loop.

    The thread runs in a copy of the caller's context, so it sees the pass's
    ``current_cancellation()``; cancelling the awaiting task abandons the thread's call. An
    awaitable that a plain function returns is awaited too.
    """
    if inspect.iscoroutinefunction(fn):
        # Acting for a Lease no longer surely held, no provider call starts
        # (resourceconsist/flow/fence.py); checked where the call is made, no await between.
        check_fence()
        return await fn(*args)
    context = contextvars.copy_context()
    result = await ADAPTER_THREADS.run_soon(functools.partial(context.run, _fenced, fn, *args))
    if inspect.isawaitable(result):
        return await result
    return result


@dataclass(frozen=True)
class Outcome:
    """What one adapter call of ``call_adapter_in_turn`` came to: its value, or the error it raised
    (its frames dropped: the pass that keeps the outcome is in them, ``frames_dropped``)."""

    value: Any = None
    error: BaseException | None = None


async def call_adapter_in_turn(fns: Sequence[Callable[..., Any]], *args: Any) -> list[Outcome]:
    """``call_adapter(fn, *args)`` for each of ``fns`` in turn, until one raises: the outcome of
    each one called, the last an error when one raised. Plain functions run one after the other
    in one worker thread: one hand-off instead of one each (a pass reads both sides' expected and
    current items this way; a hand-off costs tens of microseconds of CPU, docs/benchmarks.md,
    "Thread hand-offs"). Each call is fenced as ``call_adapter``'s is, right before it; an
    awaitable a plain function returns is awaited on the loop before the next is called."""
    if not fns or any(inspect.iscoroutinefunction(fn) for fn in fns):
        return await _in_turn(fns, *args)  # nothing to hand off, or some run on the loop
    context = contextvars.copy_context()

    def each() -> list[Outcome]:
        outcomes: list[Outcome] = []
        for fn in fns:
            try:
                value = _fenced(fn, *args)
            except Exception as err:
                outcomes.append(Outcome(error=frames_dropped(err)))
                break
            outcomes.append(Outcome(value))
            if inspect.isawaitable(value):
                break  # awaited on the loop before the next is called
        return outcomes

    outcomes: list[Outcome] = await ADAPTER_THREADS.run_soon(functools.partial(context.run, each))
    last = outcomes[-1]
    if last.error is None and inspect.isawaitable(last.value):
        try:
            outcomes[-1] = Outcome(await last.value)
        except Exception as err:
            outcomes[-1] = Outcome(error=frames_dropped(err))
            return outcomes
        outcomes += await _in_turn(fns[len(outcomes) :], *args)
    return outcomes


async def _in_turn(fns: Sequence[Callable[..., Any]], *args: Any) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for fn in fns:
        outcomes.append(await _outcome(fn, *args))
        if outcomes[-1].error is not None:
            break
    return outcomes


async def _outcome(fn: Callable[..., Any], *args: Any) -> Outcome:
    if not inspect.iscoroutinefunction(fn):
        # Its error is caught in its worker, where it was raised: raised again on the loop, it
        # would have its frames dropped twice, the second note (this module's frames) replacing
        # the first (the adapter's).
        return (await call_adapter_in_turn((fn,), *args))[0]
    try:
        return Outcome(await call_adapter(fn, *args))
    except Exception as err:
        return Outcome(error=frames_dropped(err))
