"""What crosses the wire besides messages: outcomes, error conditions, termini, open-frame
fields and TLS settings, as Python values, and their conversion to and from proton-c structures.

What flows in: raw proton-c pointers (a terminus, a condition, a connection's open fields) or
Python values to write into them. What flows out: `Outcome`, `Condition`, `Terminus`, `Tls`
values, or the proton-c structure filled in.

Why it is built so: these conversions happen at attach, detach, open and close time, never per
message, so they may use proton's `Data` codec for maps and arrays (filters, capabilities,
properties); the engine's per-message path never comes here. Kept apart from the engine so that
the engine module tells only the story of the loop, connections, links and deliveries.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import cproton
from cproton_ffi import ffi, lib

NULL = ffi.NULL

EXPIRY_NAMES = {
    lib.PN_EXPIRE_WITH_LINK: "link-detach",
    lib.PN_EXPIRE_WITH_SESSION: "session-end",
    lib.PN_EXPIRE_WITH_CONNECTION: "connection-close",
    lib.PN_EXPIRE_NEVER: "never",
}
EXPIRY_CODES = {v: k for k, v in EXPIRY_NAMES.items()}
DIST_NAMES = {lib.PN_DIST_MODE_COPY: "copy", lib.PN_DIST_MODE_MOVE: "move"}
DIST_CODES = {"copy": lib.PN_DIST_MODE_COPY, "move": lib.PN_DIST_MODE_MOVE}


class Outcome(IntEnum):
    """How a delivery ended. NONE: the peer settled without saying (treat as released)."""

    NONE = 0
    ACCEPTED = lib.PN_ACCEPTED
    REJECTED = lib.PN_REJECTED
    RELEASED = lib.PN_RELEASED
    MODIFIED = lib.PN_MODIFIED


OUTCOMES = {int(o): o for o in Outcome}
# The outcomes the per-message paths compare against, by module name: Python 3.11 looks an enum
# member up through EnumType.__getattr__ (about 100 ns); a module global costs about 10.
OUTCOME_ACCEPTED, OUTCOME_NONE = Outcome.ACCEPTED, Outcome.NONE
TERMINAL = frozenset(
    (lib.PN_ACCEPTED, lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED),
)
DECLARED = 0x33
"""A coordinator's answer to a Declare: delivery state `amqp:declared:list` [txn-id]."""
TRANSACTIONAL_STATE = 0x34
"""`amqp:transactional-state:list` [txn-id, outcome]: a transfer or disposition under a
transaction (AMQP 1.0 §4.5.5); proton has no name for it or DECLARED, only their codes."""
_OUTCOME_DESCRIPTORS = {
    "amqp:accepted:list": Outcome.ACCEPTED,
    "amqp:rejected:list": Outcome.REJECTED,
    "amqp:released:list": Outcome.RELEASED,
    "amqp:modified:list": Outcome.MODIFIED,
}


@dataclass(frozen=True)
class Condition:
    """An AMQP error condition: Condition("amqp:not-found", "no address 'foo' in space 'demo'")."""

    name: str
    description: str = ""
    # The condition's info map as pairs, keys sent as symbols: a redirect's `network-host` and
    # `port` (amqp:connection:redirect). Pairs, not a dict, so a Condition stays hashable.
    info: tuple[tuple[str, str | int], ...] = ()

    def __str__(self) -> str:
        return f"{self.name}: {self.description}" if self.description else self.name


@dataclass
class Terminus:
    """A link's source or target, as the attaching side described it.

    durable: 0 none, 1 configuration, 2 unsettled-state. expiry_policy: 'link-detach',
    'session-end', 'connection-close' or 'never'. distribution_mode: 'copy' (browse / topic
    subscriber), 'move' (competing consumer) or None. filter: name -> value (described values as
    proton.Described).
    """

    address: str | None = None
    durable: int = 0
    expiry_policy: str = "session-end"
    timeout: int = 0
    dynamic: bool = False
    distribution_mode: str | None = None
    capabilities: tuple[str, ...] = ()
    filter: dict[str, Any] | None = None
    coordinator: bool = False  # a transaction coordinator target (AMQP 1.0 §4.5.1), no address


@dataclass(frozen=True)
class Tls:
    """TLS for a listener (cert_file + key_file; ca_file too to require client certificates)
    or for an outgoing connection (ca_file: verify the peer's certificate against it, and with
    verify_hostname also its name; no ca_file: encrypt without verifying, as for self-signed).
    """

    cert_file: str | None = None
    key_file: str | None = None
    password: str | None = None
    ca_file: str | None = None
    verify_hostname: bool = False


def string_of(raw: Any) -> str | None:
    return ffi.string(raw).decode() if raw != NULL else None


def set_condition(cond: Any, error: Condition) -> None:
    lib.pn_condition_set_name(cond, error.name.encode())
    lib.pn_condition_set_description(cond, error.description.encode())
    if error.info:
        from proton import Data, symbol

        Data(lib.pn_condition_info(cond)).put_object({symbol(k): v for k, v in error.info})


def get_condition(cond: Any) -> Condition | None:
    if cond == NULL or not lib.pn_condition_is_set(cond):
        return None
    name = string_of(lib.pn_condition_get_name(cond)) or ""
    info = read_data(lib.pn_condition_info(cond))
    pairs = tuple((str(k), v) for k, v in info.items()) if isinstance(info, dict) else ()
    return Condition(name, string_of(lib.pn_condition_get_description(cond)) or "", pairs)


def read_data(ptr: Any) -> Any:
    from proton import Data

    data = Data(ptr)
    data.rewind()
    if data.next() is None:
        return None
    return data.get_object()


def write_data(ptr: Any, value: Any) -> None:
    """Encodes `value` into a proton `pn_data_t` (a delivery state's fields)."""
    from proton import Data

    Data(ptr).put_object(value)


def transactional_fields(fields: Any) -> tuple[bytes | None, Outcome]:
    """A TransactionalState's [txn-id, outcome] as (txn-id, outcome); a missing outcome is
    NONE, a missing or malformed txn-id None (the caller refuses it)."""
    if not isinstance(fields, list) or not fields:
        return None, Outcome.NONE
    txn_id = bytes(fields[0]) if isinstance(fields[0], bytes | memoryview) else None
    outcome = Outcome.NONE
    if len(fields) > 1 and fields[1] is not None:
        descriptor = getattr(fields[1], "descriptor", None)
        if isinstance(descriptor, int):
            outcome = OUTCOMES.get(descriptor, Outcome.NONE)
        elif descriptor is not None:
            outcome = _OUTCOME_DESCRIPTORS.get(str(descriptor), Outcome.NONE)
    return txn_id, outcome


def server_tls_domain(tls: Tls) -> Any:
    if not (tls.cert_file and tls.key_file):
        raise ValueError("a TLS listener needs cert_file and key_file")
    domain = lib.pn_ssl_domain(lib.PN_SSL_MODE_SERVER)
    if cproton.pn_ssl_domain_set_credentials(domain, tls.cert_file, tls.key_file, tls.password):
        lib.pn_ssl_domain_free(domain)
        raise ValueError(f"cannot load TLS certificate {tls.cert_file} / key {tls.key_file}")
    if tls.ca_file:
        cproton.pn_ssl_domain_set_trusted_ca_db(domain, tls.ca_file)
        cproton.pn_ssl_domain_set_peer_authentication(domain, lib.PN_SSL_VERIFY_PEER, tls.ca_file)
    return domain


def client_tls(transport: Any, tls: Tls, hostname: str) -> None:
    domain = lib.pn_ssl_domain(lib.PN_SSL_MODE_CLIENT)
    try:
        if tls.cert_file and tls.key_file:
            cproton.pn_ssl_domain_set_credentials(domain, tls.cert_file, tls.key_file, tls.password)
        if tls.ca_file:
            if cproton.pn_ssl_domain_set_trusted_ca_db(domain, tls.ca_file):
                raise ValueError(f"cannot load CA file {tls.ca_file}")
            mode = lib.PN_SSL_VERIFY_PEER_NAME if tls.verify_hostname else lib.PN_SSL_VERIFY_PEER
            cproton.pn_ssl_domain_set_peer_authentication(domain, mode, None)
        else:
            cproton.pn_ssl_domain_set_peer_authentication(domain, lib.PN_SSL_ANONYMOUS_PEER, None)
        ssl = lib.pn_ssl(transport)
        cproton.pn_ssl_init(ssl, domain, None)
        cproton.pn_ssl_set_peer_hostname(ssl, hostname)
    finally:
        lib.pn_ssl_domain_free(domain)  # the transport holds its own reference


def symbols_of(found: Any) -> tuple[str, ...]:
    """A capabilities field (one symbol or an array of them) as a tuple of str."""
    if found is None:
        return ()
    if isinstance(found, str):
        return (str(found),)
    return tuple(str(c) for c in getattr(found, "elements", found))


def put_symbols(ptr: Any, values: tuple[str, ...]) -> None:
    from proton import Array, Data, symbol
    from proton._data import UNDESCRIBED

    symbols = (symbol(c) for c in values)
    Data(ptr).put_object(Array(UNDESCRIBED, Data.SYMBOL, *symbols))  # type: ignore[arg-type]


def write_open_fields(
    conn: Any,
    *,
    properties: dict[str, Any] | None,
    offered: tuple[str, ...],
    desired: tuple[str, ...],
) -> None:
    from proton import Data, symbol

    if properties:
        Data(lib.pn_connection_properties(conn)).put_object(
            {symbol(k): v for k, v in properties.items()}
        )
    if offered:
        put_symbols(lib.pn_connection_offered_capabilities(conn), offered)
    if desired:
        put_symbols(lib.pn_connection_desired_capabilities(conn), desired)


def read_terminus(ptr: Any) -> Terminus:
    capabilities = symbols_of(read_data(lib.pn_terminus_capabilities(ptr)))
    flt = read_data(lib.pn_terminus_filter(ptr))
    return Terminus(
        address=string_of(lib.pn_terminus_get_address(ptr)),
        durable=lib.pn_terminus_get_durability(ptr),
        expiry_policy=EXPIRY_NAMES.get(lib.pn_terminus_get_expiry_policy(ptr), "session-end"),
        timeout=lib.pn_terminus_get_timeout(ptr),
        dynamic=bool(lib.pn_terminus_is_dynamic(ptr)),
        distribution_mode=DIST_NAMES.get(lib.pn_terminus_get_distribution_mode(ptr)),
        capabilities=capabilities,
        filter={str(k): v for k, v in flt.items()} if isinstance(flt, dict) else None,
        coordinator=lib.pn_terminus_get_type(ptr) == lib.PN_COORDINATOR,
    )


def write_terminus(ptr: Any, terminus: Terminus) -> None:
    from proton import Data, symbol

    if terminus.coordinator:
        lib.pn_terminus_set_type(ptr, lib.PN_COORDINATOR)
    if terminus.address is not None:
        lib.pn_terminus_set_address(ptr, terminus.address.encode())
    lib.pn_terminus_set_durability(ptr, terminus.durable)
    lib.pn_terminus_set_expiry_policy(ptr, EXPIRY_CODES[terminus.expiry_policy])
    lib.pn_terminus_set_timeout(ptr, terminus.timeout)
    lib.pn_terminus_set_dynamic(ptr, terminus.dynamic)
    if terminus.distribution_mode is not None:
        lib.pn_terminus_set_distribution_mode(ptr, DIST_CODES[terminus.distribution_mode])
    if terminus.capabilities:
        put_symbols(lib.pn_terminus_capabilities(ptr), terminus.capabilities)
    if terminus.filter:
        Data(lib.pn_terminus_filter(ptr)).put_object(
            {symbol(k): v for k, v in terminus.filter.items()}
        )
