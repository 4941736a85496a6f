from __future__ import annotations

from node.routing.load import DispatchCredit, is_imbalanced, request_loads
from tests.routing.helpers import FakeWorker, report


def test_imbalance_needs_both_the_absolute_and_the_relative_gap() -> None:
    assert is_imbalanced([100, 10], 64, 1.5)
    assert not is_imbalanced([60, 0], 64, 1.5)  # gap 60 <= 64
    assert not is_imbalanced([300, 220], 64, 1.5)  # 300 <= 1.5 * 220


def test_credit_counts_only_what_was_sent_after_the_report_was_sampled() -> None:
    credit = DispatchCredit(max_entries=3)
    for t, tokens in ((1.0, 10), (2.0, 20), (3.0, 30), (4.0, 40)):
        credit.record("a", t, tokens)
    assert credit.since("a", 0.0) == (3, 90)  # the bound dropped the oldest
    assert credit.since("a", 2.5) == (2, 70)
    credit.retain(["b"])
    assert credit.since("a", 0.0) == (0, 0)


def test_loads_are_compared_on_one_basis() -> None:
    credit = DispatchCredit()
    a = FakeWorker("a", in_flight=1, load=report(5, 3, at=0.0))
    b = FakeWorker("b", in_flight=4, load=report(1, 0, at=0.0))
    credit.record("b", 1.0, 100)
    assert request_loads([a, b], credit, 2.0, 30.0) == [8.0, 2.0]
    b.load = None
    assert request_loads([a, b], credit, 2.0, 30.0) == [1.0, 4.0]


def test_credit_counts_only_requests_still_open_so_a_frozen_report_is_no_running_total() -> None:
    # Reports sampled at 0 and never refreshed (a KV-event stream replaced the polls but carries no loads):
    # 90 requests went to a and 10 to b since, and all but 2 and 1 of them have finished.
    credit = DispatchCredit()
    a = FakeWorker("a", in_flight=2, load=report(0, 0, at=0.0))
    b = FakeWorker("b", in_flight=1, load=report(0, 0, at=0.0))
    for i in range(100):
        credit.record("a" if i % 10 else "b", 1.0 + i / 10, 500)
    assert request_loads([a, b], credit, 12.0, 30.0) == [2.0, 1.0]
    assert not is_imbalanced(request_loads([a, b], credit, 12.0, 30.0), 64, 1.5)


def test_open_credit_is_the_latest_dispatches_up_to_what_is_still_open() -> None:
    credit = DispatchCredit()
    for t, tokens in ((1.0, 10), (2.0, 20), (3.0, 30), (4.0, 40)):
        credit.record("a", t, tokens)
    assert credit.open_since("a", 0.0, 10) == (4, 100)
    assert credit.open_since("a", 0.0, 2) == (2, 70)  # the two latest are taken as the open ones
    assert credit.open_since("a", 2.5, 1) == (1, 40)
    assert credit.open_since("a", 2.5, 0) == (0, 0)
    assert credit.since("a", 0.0) == (2, 70), "only what was sent before the report is forgotten"
