"""A sender's credit window in messages, bounded in bytes (`enmasse.amqp.windows`): the rule
the router's producers and neighbours and the broker's producers are given credit by."""

from __future__ import annotations

from enmasse.amqp.windows import first_window, window


def test_a_window_holds_its_messages_while_they_are_small() -> None:
    assert window(messages=1000, budget=16 << 20, taken=500, taken_bytes=500 * 150) == 1000
    assert window(messages=1000, budget=16 << 20, taken=0, taken_bytes=0) == 1000


def test_a_window_shrinks_to_its_byte_budget_as_messages_grow() -> None:
    # 64 kB messages: 16 MB holds 256 of them; 1 MB messages: 16.
    assert window(messages=1000, budget=16 << 20, taken=500, taken_bytes=500 << 16) == 256
    assert window(messages=1000, budget=16 << 20, taken=10, taken_bytes=10 << 20) == 16
    # Never below one message: a sender of huge messages still gets on, one at a time.
    assert window(messages=1000, budget=16 << 20, taken=2, taken_bytes=2 << 30) == 1


def test_the_first_window_is_bounded_only_by_a_configured_max_message_size() -> None:
    assert first_window(messages=1000, budget=16 << 20, max_message_size=0) == 1000
    assert first_window(messages=1000, budget=16 << 20, max_message_size=2 << 20) == 8
    assert first_window(messages=1000, budget=16 << 20, max_message_size=1024) == 1000
    assert first_window(messages=1000, budget=16 << 20, max_message_size=1 << 30) == 1
