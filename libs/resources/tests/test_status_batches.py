"""How controllers cut their status writes into calls, and remember their own writes."""

from __future__ import annotations

from enmasse.resources.status_batches import OwnWrites, batch_request, status_batches
from enmasse.v1 import resources_pb2


def _address(name: str, version: int) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop", "resource_version": version}
    )


def _status(phase: str) -> resources_pb2.AddressStatus:
    status = resources_pb2.AddressStatus()
    status.status.phase = phase
    return status


def test_writes_go_in_calls_of_at_most_the_batch_size_with_the_version_read() -> None:
    writes = [(_address(f"a{n}", 10 + n), _status("Active")) for n in range(2_500)]
    batches = list(status_batches(writes, size=1_000))
    assert [len(batch) for batch in batches] == [1_000, 1_000, 500]
    assert [a.metadata.name for a, _ in batches[1]] == [f"a{n}" for n in range(1_000, 2_000)]
    request = batch_request(batches[2])
    assert len(request.entries) == 500
    last = request.entries[-1]
    assert (last.ref.space, last.ref.name, last.resource_version) == ("shop", "a2499", 2_509)
    assert last.status.status.phase == "Active"
    assert list(status_batches([])) == []


def test_own_writes_are_left_out_until_the_informer_shows_them() -> None:
    own = OwnWrites()
    read = _address("a", 10)
    own.note(read, _status("Active"), version=15)
    assert own.pending(read, _status("Active")), "the informer still shows version 10"
    assert not own.pending(read, _status("Configuring")), "another status is written"
    assert own.pending(read, _status("Active"))
    assert not own.pending(_address("a", 15), _status("Active")), "caught up"
    assert len(own) == 0, "forgotten once the informer caught up"
    assert not own.pending(read, _status("Active"))
