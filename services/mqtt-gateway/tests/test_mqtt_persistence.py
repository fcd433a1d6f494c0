"""Persistent sessions, the pure part (`persistence.py`): the expiry a CONNECT asks for, when a
session has expired, the session record as a message and back, which record wins, the durable
link a persistent subscription attaches with; and `Persistence` over an in-memory sessions queue
and a recording uplink: what a CONNECT finds, what a clean start or an expired session removes,
what the end of a connection writes. The real thing, through routers and brokers, is
tests/test_mqtt_sessions.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from enmasse.amqp import codec
from enmasse.amqp.engine import Outcome
from enmasse.mqtt_gateway import persistence as persistence_module
from enmasse.mqtt_gateway.packets import (
    MQTT_3_1_1,
    MQTT_5,
    PROTOCOL_ERROR,
    SESSION_EXPIRY,
    Connect,
    Disconnect,
    MalformedPacket,
    decode,
)
from enmasse.mqtt_gateway.persistence import (
    CLIENT,
    NEVER,
    REVISION,
    Connected,
    Persistence,
    SessionRecord,
    Sessions,
    SessionUnavailable,
    decode_record,
    durable_name,
    durable_source,
    encode_record,
    expired,
    newest,
    next_revision,
    session_expiry,
)
from enmasse.mqtt_gateway.store import StoreUnavailable


def connect(*, level: int, clean: bool, expiry: int | None = None) -> Connect:
    return Connect(
        level=level,
        client_id="c1",
        clean_start=clean,
        keep_alive=30,
        username=None,
        password=None,
        will=None,
        properties={SESSION_EXPIRY: expiry} if expiry is not None else {},
    )


@pytest.mark.parametrize(
    ("level", "clean", "expiry", "kept"),
    [
        (MQTT_3_1_1, False, None, NEVER),  # clean session 0: kept until the client cleans it
        (MQTT_3_1_1, True, None, 0),
        (MQTT_5, False, None, 0),  # no session expiry interval: ends with the connection
        (MQTT_5, True, 300, 300),  # clean start only says "discard the old one"
        (MQTT_5, False, NEVER, NEVER),
    ],
)
def test_the_expiry_a_connect_asks_for(
    level: int, clean: bool, expiry: int | None, kept: int
) -> None:
    assert session_expiry(connect(level=level, clean=clean, expiry=expiry)) == kept


def test_a_session_expires_its_interval_after_it_ended() -> None:
    ended = SessionRecord("c1", expiry=10, ended_ms=1_000)
    assert not expired(ended, now_ms=10_999)
    assert expired(ended, now_ms=11_000)
    assert not expired(SessionRecord("c1", expiry=10, ended_ms=0), now_ms=10**15)  # connected
    assert not expired(SessionRecord("c1", expiry=NEVER, ended_ms=1), now_ms=10**15)


def test_a_record_is_a_durable_message_selectable_by_client_and_revision() -> None:
    record = SessionRecord("c'1", expiry=60, subscriptions={"a/b": 1, "c": 2}, revision=7)
    message = encode_record(record)
    assert codec.read_header(message).durable
    assert codec.read_application_properties(message) == {CLIENT: "c'1", REVISION: 7}
    assert decode_record(message) == record


def test_a_message_that_is_no_record_is_skipped() -> None:
    assert decode_record(codec.encode_message("not json")) is None
    assert decode_record(codec.encode_message('{"client": "x"}')) is None


def test_the_newest_revision_wins_and_a_new_one_is_newer_than_a_clock_ahead() -> None:
    records = [SessionRecord("c", expiry=1, revision=r) for r in (3, 9, 5)]
    assert newest(records) == records[1]
    assert newest([]) is None
    ahead = time.time_ns() + 10**12  # written by a gateway whose clock is 1000 s ahead
    assert next_revision(ahead) == ahead + 1


def test_a_persistent_subscription_is_a_durable_named_link() -> None:
    source = durable_source("telemetry")
    assert (source.address, source.durable, source.expiry_policy) == ("telemetry", 2, "never")
    assert source.timeout == 0, "a session that never expires: the broker keeps it for ever"
    assert durable_source("telemetry", expiry=3600).timeout == 3600, "the broker's lease"
    assert durable_name("sensors/kitchen") == "mqtt:sensors/kitchen"


# -- Persistence over an in-memory sessions queue ---------------------------------------------


@dataclass
class Entry:
    payload: bytes


@dataclass
class MemoryStore:
    """The `Store` calls `Sessions` makes, over a list; the selector read as client and
    revision bound (the broker evaluates the real one)."""

    entries: list[bytes] = field(default_factory=list)
    broken: bool = False
    browses: int = 0

    async def put(self, address: str, message: bytes) -> None:
        self._check()
        self.entries.append(message)

    async def read(self, address: str, *, selector: str, take: bool) -> list[Entry]:
        self._check()
        self.browses += not take
        picked = [m for m in self.entries if _selected(m, selector)]
        if take:
            self.entries = [m for m in self.entries if m not in picked]
        return [Entry(m) for m in picked]

    def settle(self, deliveries: list[Any], outcome: Outcome) -> None:
        assert outcome is Outcome.ACCEPTED

    def _check(self) -> None:
        if self.broken:
            raise StoreUnavailable(None, what="store connection")

    def records(self) -> list[SessionRecord | None]:
        return [decode_record(m) for m in self.entries]


def _selected(message: bytes, selector: str) -> bool:
    properties = codec.read_application_properties(message)
    client = selector.split("'")[1]
    below = int(selector.rsplit("<", 1)[1]) if "<" in selector else None
    return properties[CLIENT] == client and (below is None or properties[REVISION] < below)


@dataclass
class RecordingUplink:
    """Records the durable links attached and closed (what removes a broker's subscription)."""

    attached: list[tuple[str, str | None]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    async def attach_receiver(self, address: str, **options: Any) -> str:
        self.attached.append((address, options.get("name")))
        return address

    def detach(self, link: str) -> None:
        self.closed.append(link)


@dataclass
class Subscribed:
    """What `Persistence.end` reads of a session's subscription."""

    qos: int
    link: str


def recording() -> Any:
    return RecordingUplink()


def persistence(store: MemoryStore, *, expiry: int) -> Persistence:
    sessions = Sessions(store=store, address="mqtt/sessions")  # type: ignore[arg-type]
    return Persistence(sessions=sessions, client_id="c1", expiry=expiry)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_new_persistent_session_is_recorded_and_not_present() -> None:
    store = MemoryStore()
    session = persistence(store, expiry=60)
    assert run(session.begin(clean_start=False, uplink=recording())) is None
    assert session.link_of("t") == {"name": "mqtt:t", "source": durable_source("t", expiry=60)}
    assert session.link_of("t")["source"].timeout == 60
    assert [(r.subscriptions, r.ended_ms) for r in store.records() if r] == [({}, 0)]


def test_a_session_left_is_resumed_with_its_subscriptions_and_one_record_stays() -> None:
    store = MemoryStore()
    first = persistence(store, expiry=60)
    run(first.begin(clean_start=False, uplink=recording()))
    run(first.save({"t": 1}))
    uplink = recording()
    first.let_go({"t": Subscribed(1, "link-t")}, uplink=uplink)
    assert uplink.closed == []  # persistent: its links are only detached, with the connection
    run(first.end({"t": Subscribed(1, "link-t")}))
    assert [(r.subscriptions, bool(r.ended_ms)) for r in store.records() if r] == [({"t": 1}, True)]
    again = persistence(store, expiry=60)
    assert run(again.begin(clean_start=False, uplink=recording())) == {"t": 1}
    assert len(store.entries) == 1  # the older records were taken


def test_a_clean_start_removes_the_old_sessions_subscriptions_and_records() -> None:
    store = MemoryStore()
    old = persistence(store, expiry=60)
    run(old.begin(clean_start=False, uplink=recording()))
    run(old.save({"a": 1, "b": 0}, ended=True))
    uplink = recording()
    clean = persistence(store, expiry=0)
    assert run(clean.begin(clean_start=True, uplink=uplink)) is None
    assert uplink.attached == [("a", "mqtt:a"), ("b", "mqtt:b")]
    assert uplink.closed == ["a", "b"]
    assert store.entries == []
    assert clean.link_of("a") == {}  # not persistent: a plain link


def test_an_expired_session_is_removed_not_resumed() -> None:
    store = MemoryStore()
    record = SessionRecord("c1", expiry=1, subscriptions={"t": 1}, ended_ms=1, revision=1)
    store.entries.append(encode_record(record))
    uplink = recording()
    assert run(persistence(store, expiry=60).begin(clean_start=False, uplink=uplink)) is None
    assert uplink.closed == ["t"]


def test_a_resumed_session_with_expiry_zero_ends_with_its_connection() -> None:
    store = MemoryStore()
    record = SessionRecord("c1", expiry=NEVER, subscriptions={"t": 1}, ended_ms=5, revision=1)
    store.entries.append(encode_record(record))
    session = persistence(store, expiry=0)
    assert run(session.begin(clean_start=False, uplink=recording())) == {"t": 1}
    uplink = recording()
    session.let_go({"t": Subscribed(1, "link-t")}, uplink=uplink)
    assert uplink.closed == ["link-t"]  # closed before the connection: the broker drops it
    run(session.end({"t": Subscribed(1, "link-t")}))
    assert store.entries == []


def test_a_session_taken_over_meanwhile_does_not_record_its_end() -> None:
    store = MemoryStore()
    old = persistence(store, expiry=60)
    run(old.begin(clean_start=False, uplink=recording()))
    newer = persistence(store, expiry=60)
    assert run(newer.begin(clean_start=False, uplink=recording())) == {}
    run(newer.save({"t": 1}))
    run(old.end({}))  # the old connection ends late: the newer record stands
    assert [(r.subscriptions, r.ended_ms) for r in store.records() if r] == [({"t": 1}, 0)]


def test_a_clean_start_waits_a_bounded_while_for_a_connection_that_never_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record left at "connected" by a gateway that died: the clean start goes on after
    TAKEOVER_WAIT and removes what the session had."""
    monkeypatch.setattr(persistence_module, "TAKEOVER_WAIT", 0.3)
    store = MemoryStore()
    record = SessionRecord("c1", expiry=NEVER, subscriptions={"t": 1}, ended_ms=0, revision=1)
    store.entries.append(encode_record(record))
    uplink = recording()
    assert run(persistence(store, expiry=0).begin(clean_start=True, uplink=uplink)) is None
    assert store.browses >= 2  # it looked again (and then went on)
    assert uplink.closed == ["t"]
    assert store.entries == []


def test_a_broken_store_refuses_a_persistent_session_not_a_clean_one() -> None:
    store = MemoryStore(broken=True)
    with pytest.raises(SessionUnavailable):
        run(persistence(store, expiry=60).begin(clean_start=False, uplink=recording()))
    clean = persistence(store, expiry=0)
    assert run(clean.begin(clean_start=True, uplink=recording())) is None


def test_without_a_store_no_session_is_kept() -> None:
    session = Persistence(sessions=None, client_id="c1", expiry=NEVER)
    assert session.expiry == 0
    assert run(session.begin(clean_start=False, uplink=recording())) is None
    assert session.link_of("t") == {}


def test_a_disconnect_may_end_a_session_at_once_but_not_give_one_where_there_was_none() -> None:
    store = MemoryStore()
    session = persistence(store, expiry=60)
    session.expire_after(None)  # DISCONNECT without the property: as it was
    assert session.expiry == 60
    session.expire_after(0)
    assert session.expiry == 0
    with pytest.raises(MalformedPacket) as refused:
        persistence(store, expiry=0).expire_after(30)
    assert refused.value.reason == PROTOCOL_ERROR


def test_a_disconnect_decodes_its_session_expiry() -> None:
    body = bytes([0x00, 0x05, SESSION_EXPIRY, 0, 0, 0, 0])
    packet = decode(0xE0, body, level=MQTT_5)
    assert isinstance(packet, Disconnect)
    assert (packet.reason, packet.properties) == (0, {SESSION_EXPIRY: 0})
    assert decode(0xE0, b"", level=MQTT_5) == Disconnect()


@dataclass
class Holding:
    ended: int = 0

    def taken_over(self) -> None:
        self.ended += 1


def test_a_client_id_connected_again_ends_the_older_connection_only() -> None:
    connected = Connected()
    older, newer, other = Holding(), Holding(), Holding()
    connected.claim("c1", older)
    connected.claim("c2", other)
    connected.claim("c1", newer)
    assert (older.ended, newer.ended, other.ended) == (1, 0, 0)
    connected.release("c1", older)  # the older one's end does not free the newer one's id
    connected.claim("c1", Holding())
    assert newer.ended == 1
    connected.claim("", Holding())  # no id: nothing to take over
    connected.claim("", Holding())


def test_max_session_expiry_caps_a_session_that_would_never_end() -> None:
    store = MemoryStore()
    sessions = Sessions(store=store, address="mqtt/sessions", max_expiry=600)  # type: ignore[arg-type]
    forever = Persistence(sessions=sessions, client_id="c1", expiry=NEVER)  # 3.1.1, clean 0
    assert forever.granted_expiry == 600
    assert run(forever.begin(clean_start=False, uplink=recording())) is None
    assert forever.link_of("t")["source"].timeout == 600
    shorter = Persistence(sessions=sessions, client_id="c2", expiry=60)
    assert shorter.granted_expiry == 60, "a shorter interval is kept as asked"
