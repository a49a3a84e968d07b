"""The start's window (launch/run/supervised/admission.py): how many tasks are in flight at once."""
import threading
import time

from launch.run.supervised.admission import Gate, window_for


def test_a_start_that_fits_the_window_has_none():
    assert window_for(None, 1000) is None
    assert window_for(8, 8) is None and window_for(8, 9) == 8


def test_no_window_admits_at_once():
    gate = Gate(None, threading.Event())
    for _ in range(100):
        gate.admit(threading.Event())
    assert gate.waited < 0.5


def test_the_next_task_waits_until_one_in_flight_serves():
    gate = Gate(2, threading.Event(), patience=30)
    first, second = threading.Event(), threading.Event()
    gate.admit(first)                       # one in flight: room
    threading.Timer(0.3, first.set).start()
    t0 = time.monotonic()
    gate.admit(second)                      # two in flight: waits for the first to serve
    assert 0.2 < time.monotonic() - t0 < 5
    assert first.is_set()


def test_a_task_never_heard_holds_the_start_up_only_for_the_patience():
    gate = Gate(1, threading.Event(), patience=0.3)
    t0 = time.monotonic()
    gate.admit(threading.Event())           # never serves (it died, or never says so)
    assert 0.25 < time.monotonic() - t0 < 5


def test_a_stopped_start_waits_no_more():
    stop = threading.Event()
    stop.set()
    gate = Gate(1, stop, patience=30)
    t0 = time.monotonic()
    gate.admit(threading.Event())
    assert time.monotonic() - t0 < 1
