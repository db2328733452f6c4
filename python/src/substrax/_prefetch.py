"""The background thread behind ``substrax.spmd.prefetch_to_device``.

A bounded hand-over between one producer thread and one consumer: a semaphore of ``size`` slots is
acquired before each pull from the pipeline and released when the consumer takes a batch, so the
pipeline is never more than ``size`` batches ahead. Failures travel to the consumer as values.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Failure:
    """An exception raised in the background thread, to be raised again in the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()
_JOIN_TIMEOUT_S = 10.0


class DevicePrefetcher(Generic[T], Iterator[T]):
    """What ``prefetch_to_device`` returns: an iterator for one consumer, and a context manager.

    At most ``size`` batches are taken from the pipeline beyond those the consumer has taken: a
    semaphore of ``size`` slots is acquired before each pull and released when the consumer
    takes a batch.
    """

    def __init__(self, pipeline: Iterable[Any], size: int, transfer: Callable[[Any], T]) -> None:
        self._source = iter(pipeline)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._slots = threading.Semaphore(size)
        self._stop = threading.Event()
        self._done = False
        # The thread gets no reference to self, so an abandoned prefetcher is collected and
        # __del__ stops the thread.
        self._thread = threading.Thread(
            target=_fill,
            args=(self._source, transfer, self._queue, self._slots, self._stop),
            name="substrax-prefetch",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> DevicePrefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        self._slots.release()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread and drop the batches placed ahead; idempotent.

        Waits up to 10 s for the thread, which may be inside a slow ``next(pipeline)``; the
        pipeline is closed (generators run their ``finally``) once the thread has ended.
        """
        self._done = True
        self._stop.set()
        self._slots.release()  # wakes the thread if it waits for a slot
        self._thread.join(_JOIN_TIMEOUT_S)
        while not self._queue.empty():
            self._queue.get_nowait()
        if not self._thread.is_alive():
            close_source = getattr(self._source, "close", None)
            if close_source is not None:
                close_source()

    @property
    def running(self) -> bool:
        """Whether the background thread is still alive."""
        return self._thread.is_alive()

    def __enter__(self) -> DevicePrefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Never join here (the collector may run on any thread); the thread sees the event.
        self._stop.set()
        self._slots.release()


def _fill(
    source: Iterator[Any],
    transfer: Callable[[Any], Any],
    out: queue.SimpleQueue[Any],
    slots: threading.Semaphore,
    stop: threading.Event,
) -> None:
    """The background thread: pull, place, hand over, until the end, an error, or stop."""
    try:
        while True:
            slots.acquire()
            if stop.is_set():
                return
            try:
                batch = next(source)
            except StopIteration:
                out.put(_END)
                return
            if stop.is_set():
                return
            out.put(transfer(batch))
    except BaseException as error:  # noqa: BLE001 -- every failure goes to the consumer
        out.put(_Failure(error))
