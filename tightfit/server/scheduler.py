"""One model session, one worker thread, a bounded queue of requests.

The HTTP handlers run on the asyncio event loop; every generation runs on the worker thread, one at
a time (the model has one sequence). A handler submits a `Job` (a function that yields engine
events, given a `should_stop` callable) and reads its events from an asyncio queue that the worker
fills through `loop.call_soon_threadsafe`, so the event loop never blocks on the model.

* `submit` raises `QueueFull` when `max_queue` jobs are already waiting (the server answers 503
  with Retry-After).
* `Job.cancel()` (a client disconnect) makes `should_stop` true: a running generation stops before
  its next token; a job that has not started yet is dropped without touching the model.
"""
from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable, Iterator


class QueueFull(Exception):
    pass


class SchedulerClosed(Exception):
    pass


_EVENT, _ERROR, _DONE = "event", "error", "done"


class Job:
    def __init__(self, fn: Callable[[Callable[[], bool]], Iterator[Any]],
                 loop: asyncio.AbstractEventLoop):
        self.fn = fn
        self.loop = loop
        self._cancel = threading.Event()
        self._queue: asyncio.Queue = asyncio.Queue()
        self.started = threading.Event()
        self.finished = threading.Event()

    # ---- worker side --------------------------------------------------------------------------
    def should_stop(self) -> bool:
        return self._cancel.is_set()

    def _push(self, kind: str, payload: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, (kind, payload))
        except RuntimeError:   # the event loop is gone (server shutting down)
            self._cancel.set()

    # ---- handler side -------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    async def events(self):
        """Async iterator over the job's events; re-raises the job's exception."""
        while True:
            kind, payload = await self._queue.get()
            if kind == _EVENT:
                yield payload
            elif kind == _ERROR:
                raise payload
            else:
                return


class Scheduler:
    def __init__(self, max_queue: int = 64, on_change: Callable[[int, int], None] | None = None):
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.max_queue = int(max_queue)
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._current: Job | None = None
        self._on_change = on_change
        self._thread = threading.Thread(target=self._run, name="tightfit-worker", daemon=True)
        self._thread.start()

    # ---- counters -----------------------------------------------------------------------------
    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    @property
    def n_processing(self) -> int:
        return 1 if self._current is not None else 0

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.n_processing, self.n_waiting)

    # ---- API ----------------------------------------------------------------------------------
    def submit(self, fn: Callable[[Callable[[], bool]], Iterator[Any]],
               loop: asyncio.AbstractEventLoop | None = None) -> Job:
        job = Job(fn, loop or asyncio.get_running_loop())
        with self._cv:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            # a waiting job whose client is gone does not hold a place
            self._waiting = collections.deque(j for j in self._waiting if not j.cancelled)
            if len(self._waiting) >= self.max_queue and self._current is not None:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting")
            self._waiting.append(job)
            self._changed()
            self._cv.notify()
        return job

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closed = True
            for j in self._waiting:
                j.cancel()
            if self._current is not None:
                self._current.cancel()
            self._cv.notify_all()
        self._thread.join(timeout)

    # ---- worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if not self._waiting and self._closed:
                    return
                job = self._waiting.popleft()
                if job.cancelled:
                    self._changed()
                    job._push(_DONE)
                    job.finished.set()
                    continue
                self._current = job
                self._changed()
            job.started.set()
            try:
                for ev in job.fn(job.should_stop):
                    job._push(_EVENT, ev)
            except BaseException as e:  # noqa: BLE001 - every failure goes back to its request
                job._push(_ERROR, e)
            else:
                job._push(_DONE)
            finally:
                with self._cv:
                    self._current = None
                    self._changed()
                job.finished.set()
