"""tests.utils.run_threads itself: a thread that never finishes, or raises, fails the test."""

import threading
import time

import pytest

from tests.utils import run_threads


def test_results_come_back_in_thread_order():
    assert run_threads(lambda i, barrier: (barrier.wait(), i * 10)[1], 4) == [0, 10, 20, 30]


def test_a_deadlocked_thread_fails_the_test():
    never = threading.Event()
    started = time.monotonic()

    def work(i, barrier):
        barrier.wait()
        if i == 1:
            never.wait()  # as a thread blocked on a lock that is never released
        return i

    with pytest.raises(AssertionError, match=r"thread\(s\) \[1\] of 3 still running"):
        run_threads(work, 3, timeout=0.5)
    assert time.monotonic() - started < 10
    never.set()


def test_an_exception_in_a_thread_is_raised_and_the_others_are_let_go():
    def work(i, barrier):
        if i == 0:
            raise ValueError("boom")
        barrier.wait()  # aborted by the failing thread, so this does not hang
        return i

    with pytest.raises(ValueError, match="boom"):
        run_threads(work, 3, timeout=30)
