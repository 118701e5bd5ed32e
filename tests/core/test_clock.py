import pytest

from edgesched.core.clock import EventQueue


def _drain(q: EventQueue, until: float) -> list:
    out = []
    while (due := q.pop_next(until)) is not None:
        out.append((due.time, due.item))
    return out


def test_items_come_out_in_time_then_scheduling_order():
    q = EventQueue()
    q.schedule(5.0, "upload 1")
    q.schedule(2.0, "download 2")
    q.schedule(5.0, "deadline")
    q.schedule(2.0, "download 1")
    assert _drain(q, 10.0) == [(2.0, "download 2"), (2.0, "download 1"), (5.0, "upload 1"), (5.0, "deadline")]
    assert q.now == 10.0 and len(q) == 0


def test_later_items_stay_and_time_never_goes_back():
    q = EventQueue()
    q.schedule(3.0, "a")
    q.schedule(7.0, "b")
    assert _drain(q, 4.0) == [(3.0, "a")]
    assert q.now == 4.0 and len(q) == 1
    with pytest.raises(ValueError, match="before now"):
        q.schedule(1.0, "late")
