"""Worker processes stop at once: on an error, on Ctrl-C, and when ``Pool.terminate()`` hangs."""

from __future__ import annotations

import multiprocessing.pool
import threading
import time

import pytest

from simulator.engines import workers


def _slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("task 3 failed")
    return x


def test_results_come_back_in_task_order():
    assert list(workers.run_tasks(_slow_square, range(8), 2)) == [x * x for x in range(8)]


def test_an_error_in_a_task_stops_the_workers_and_goes_on_to_the_caller():
    with pytest.raises(ValueError, match="task 3 failed"):
        list(workers.run_tasks(_fail_on_three, range(100), 2))
    assert not multiprocessing.active_children()


def test_an_interrupt_kills_the_workers_even_when_pool_terminate_hangs(monkeypatch):
    # CPython's Pool.terminate() can block for ever in _help_stuff_finish, on the task queue's
    # lock that an idle worker holds (issues 73945, 78178, 96995); here it blocks there for
    # certain, and the stop must not wait on it.
    never = threading.Event()
    monkeypatch.setattr(
        multiprocessing.pool.Pool, "_help_stuff_finish", staticmethod(lambda *a: never.wait())
    )
    results = workers.run_tasks(_slow_square, range(10_000), 2)
    next(results)
    running = multiprocessing.active_children()
    assert len(running) >= 2
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        results.throw(KeyboardInterrupt)
    took = time.monotonic() - start
    assert took < workers.STOP_WAIT_S + 2.0, f"took {took:.1f} s"
    assert all(not p.is_alive() for p in running), "workers left running"
    never.set()  # let the stuck stopper thread end
