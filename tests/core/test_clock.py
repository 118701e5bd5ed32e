import pytest

from edgesched.clock import EventQueue


def test_events_come_out_in_time_then_scheduling_order():
    q = EventQueue()
    q.schedule(5.0, "upload", device=1)
    q.schedule(2.0, "download", device=2)
    q.schedule(5.0, "deadline")
    q.schedule(2.0, "download", device=1)
    assert [(e.time, e.kind, e.data.get("device")) for e in q.pop_until(10.0)] == [
        (2.0, "download", 2), (2.0, "download", 1), (5.0, "upload", 1), (5.0, "deadline", None)]
    assert q.now == 10.0 and len(q) == 0


def test_pop_until_leaves_later_events_and_time_never_goes_back():
    q = EventQueue()
    q.schedule(3.0, "a")
    q.schedule(7.0, "b")
    assert [e.kind for e in q.pop_until(4.0)] == ["a"]
    assert q.now == 4.0 and len(q) == 1
    with pytest.raises(ValueError, match="before now"):
        q.schedule(1.0, "late")
