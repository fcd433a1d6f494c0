"""JMS message selectors (`enmasse.amqp.selector`): every operator, SQL's three-valued logic, LIKE
with escapes, values of unlike types, the `amqp.` and JMS names on real encoded messages, the
filter's descriptor, and parse errors with the words the attaching client will read.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from enmasse.amqp import codec
from enmasse.amqp.selector import (
    MAX_DEPTH,
    MAX_SELECTOR_CHARS,
    SELECTOR_FILTER_CODE,
    SELECTOR_FILTER_SYMBOL,
    MessageView,
    SelectorError,
    compile_selector,
    selector_of,
    selector_text,
)
from proton import Described, Message, symbol, ulong

UNKNOWN = None


def evaluate(text: str, **properties: Any) -> bool | None:
    """The three-valued result of `text` on a message with these application properties."""
    return compile_selector(text).evaluate(MessageView(application=properties))


def selects(text: str, **properties: Any) -> bool:
    payload = codec.encode_message(b"body", application_properties=properties)
    return compile_selector(text).matches(payload)


def parse_error(text: str) -> str:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    return str(caught.value)


# ------------------------------------------------------------------ three-valued logic

TRUTH = {"true": True, "false": False, "unknown": None}


def props_for(**values: bool | None) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


@pytest.mark.parametrize(
    ("a", "b", "both", "either"),
    [
        (True, True, True, True),
        (True, False, False, True),
        (True, None, None, True),
        (False, True, False, True),
        (False, False, False, False),
        (False, None, False, None),
        (None, True, None, True),
        (None, False, False, None),
        (None, None, None, None),
    ],
)
def test_and_or_truth_tables(a: bool | None, b: bool | None, both: Any, either: Any) -> None:
    values = props_for(a=a, b=b)
    assert evaluate("a AND b", **values) is both
    assert evaluate("a OR b", **values) is either
    # the same through comparisons, the way selectors are usually written
    assert evaluate("a = TRUE AND b = TRUE", **values) is both
    assert evaluate("a = TRUE OR b = TRUE", **values) is either


@pytest.mark.parametrize(("a", "negated"), [(True, False), (False, True), (None, None)])
def test_not_truth_table(a: bool | None, negated: bool | None) -> None:
    assert evaluate("NOT a", **props_for(a=a)) is negated
    assert evaluate("NOT (a = TRUE)", **props_for(a=a)) is negated


def test_long_chains_of_and_or() -> None:
    chain = " OR ".join(f"id = {n}" for n in range(500))
    assert evaluate(chain, id=499) is True
    assert evaluate(chain, id=500) is False
    assert evaluate(chain) is UNKNOWN
    every = " AND ".join(f"n > {n}" for n in range(300))
    assert evaluate(every, n=300) is True
    assert evaluate(every, n=299) is False


def test_only_true_selects() -> None:
    assert selects("color = 'red'", color="red")
    assert not selects("color = 'red'", color="blue")
    assert not selects("color = 'red'")  # unknown does not select
    assert not selects("NOT (color = 'red')")  # nor does NOT unknown


def test_unknown_and_false_and_short_circuit() -> None:
    assert evaluate("missing = 1 AND 1 = 2") is False
    assert evaluate("missing = 1 OR 1 = 1") is True


def test_a_property_as_a_condition() -> None:
    assert evaluate("active", active=True) is True
    assert evaluate("active", active=False) is False
    assert evaluate("active") is UNKNOWN
    assert evaluate("active", active="yes") is UNKNOWN  # not a boolean: unknown, never TRUE
    assert evaluate("NOT active", active=1) is UNKNOWN


def test_boolean_literals_select_everything_or_nothing() -> None:
    assert selects("TRUE")
    assert not selects("FALSE")
    assert evaluate("true = TRUE") is True


# ------------------------------------------------------------------ comparisons


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n = 5", True),
        ("n <> 5", False),
        ("n < 6", True),
        ("n <= 5", True),
        ("n > 5", False),
        ("n >= 5", True),
        ("5 = n", True),
        ("6 > n", True),
        ("4 >= n", False),
        ("n = 5.0", True),  # exact and approximate numbers compare
        ("n < 5.5", True),
        ("n = n", True),
        ("n + 1 > n", True),
    ],
)
def test_numeric_comparisons(text: str, expected: bool) -> None:
    assert evaluate(text, n=5) is expected


def test_string_and_boolean_equality() -> None:
    assert evaluate("s = 'abc'", s="abc") is True
    assert evaluate("s <> 'abc'", s="abc") is False
    assert evaluate("s = 'ABC'", s="abc") is False  # strings are case-sensitive
    assert evaluate("s = t", s="x", t="x") is True
    assert evaluate("flag = TRUE", flag=True) is True
    assert evaluate("flag <> FALSE", flag=True) is True
    assert evaluate("s = 'it''s'", s="it's") is True


def test_null_in_a_comparison_is_unknown() -> None:
    for op in ("=", "<>", "<", "<=", ">", ">="):
        assert evaluate(f"missing {op} 1") is UNKNOWN
        assert evaluate(f"1 {op} missing") is UNKNOWN
        assert evaluate(f"n {op} missing", n=1) is UNKNOWN
    assert evaluate("missing = 'x'") is UNKNOWN


def test_unlike_types_compare_false_not_an_error() -> None:
    # JMS 2.0 §3.8.1: "If the comparison of non-like type values is attempted, the value of the
    # operation is false."
    assert evaluate("weight > 2", weight="3") is False
    assert evaluate("weight = 3", weight="3") is False
    assert evaluate("weight <> 3", weight="3") is False
    assert evaluate("color = 'red'", color=1) is False
    assert evaluate("flag = 1", flag=True) is False  # a boolean is not a number
    assert evaluate("flag = 'true'", flag=True) is False
    assert evaluate("n = TRUE", n=1) is False
    assert evaluate("s = t", s="1", t=1) is False
    assert evaluate("NOT (weight > 2)", weight="3") is True  # FALSE, so NOT is TRUE


def test_ordering_strings_or_booleans_is_false_at_run_time() -> None:
    assert evaluate("s < t", s="a", t="b") is False
    assert evaluate("f > g", f=True, g=False) is False


def test_values_nothing_can_write_compare_false() -> None:
    assert evaluate("blob = 'x'", blob=b"x") is False
    assert evaluate("blob = blob", blob=b"x") is False
    assert evaluate("blob IS NOT NULL", blob=b"x") is True


# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3 = 7", True),  # * before +
        ("(1 + 2) * 3 = 9", True),
        ("10 - 4 - 3 = 3", True),  # left to right
        ("-n = -4", True),
        ("- -n = 4", True),
        ("+n = 4", True),
        ("n * -1 = -4", True),
        ("7 / 2 = 3", True),  # exact numbers divide like Java's long
        ("-7 / 2 = -3", True),  # truncated toward zero, not floored
        ("7 / -2 = -3", True),
        ("7.0 / 2 = 3.5", True),
        ("n / 8 = 0", True),
        ("n / 8.0 = 0.5", True),
        ("2 * 1.5 = 3", True),
        ("n - 4.5 < 0", True),
    ],
)
def test_arithmetic(text: str, expected: bool) -> None:
    assert evaluate(text, n=4) is expected


def test_arithmetic_on_null_or_unlike_types_or_by_zero_is_null() -> None:
    assert evaluate("missing + 1 = 1") is UNKNOWN
    assert evaluate("s + 1 = 1", s="1") is UNKNOWN
    assert evaluate("-s = 1", s="1") is UNKNOWN
    assert evaluate("f * 2 = 2", f=True) is UNKNOWN
    assert evaluate("n / 0 = 1", n=1) is UNKNOWN
    assert evaluate("n / 0.0 = 1", n=1) is UNKNOWN
    assert evaluate("(n / 0) IS NULL", n=1) is True


# ------------------------------------------------------------------ BETWEEN, IN, LIKE, IS NULL


@pytest.mark.parametrize(
    ("age", "between", "outside"),
    [
        (14, False, True),
        (15, True, False),
        (17, True, False),
        (19, True, False),
        (20, False, True),
        (17.5, True, False),
        (None, None, None),
        ("17", False, False),  # unlike types: each comparison is FALSE
    ],
)
def test_between(age: Any, between: Any, outside: Any) -> None:
    values = {} if age is None else {"age": age}
    assert evaluate("age BETWEEN 15 AND 19", **values) is between
    assert evaluate("age NOT BETWEEN 15 AND 19", **values) is outside


def test_between_with_expressions_and_null_bounds() -> None:
    assert evaluate("n BETWEEN lo AND lo + 2", n=3, lo=1) is True
    assert evaluate("n BETWEEN lo AND 10", n=3) is UNKNOWN
    assert evaluate("n BETWEEN lo AND 1", n=3) is False  # FALSE AND unknown
    assert evaluate("n NOT BETWEEN lo AND 1", n=3) is True  # unknown OR TRUE
    assert evaluate("n BETWEEN 1 AND 5 AND m = 2", n=3, m=2) is True  # AND after BETWEEN


def test_in() -> None:
    assert evaluate("country IN ('UK', 'US', 'France')", country="UK") is True
    assert evaluate("country IN ('UK', 'US', 'France')", country="Peru") is False
    assert evaluate("country NOT IN ('UK', 'US', 'France')", country="Peru") is True
    assert evaluate("country NOT IN ('UK', 'US', 'France')", country="US") is False
    assert evaluate("country IN ('UK')") is UNKNOWN
    assert evaluate("country NOT IN ('UK')") is UNKNOWN
    assert evaluate("country IN ('1')", country=1) is False  # unlike types
    assert evaluate("country NOT IN ('1')", country=1) is True
    # numbers and booleans too (beyond §3.8.1, as AMQP filters allow)
    assert evaluate("n IN (1, -2, 3.5)", n=-2) is True
    assert evaluate("n IN (1, -2, 3.5)", n=3.5) is True
    assert evaluate("n IN (1, -2, 3.5)", n=2) is False
    assert evaluate("n IN (1.0)", n=1) is True
    assert evaluate("f IN (TRUE)", f=True) is True
    assert evaluate("f IN (1)", f=True) is False


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("'12%3'", ["123", "12993", "12x3"], ["1234", "13", "2123"]),
        ("'l_se'", ["lose", "l_se"], ["loose", "lse"]),
        ("'\\_%' ESCAPE '\\'", ["_foo", "_"], ["bar", "x_"]),
        ("'100!%' ESCAPE '!'", ["100%"], ["100", "1000", "100!%"]),
        ("'a!!b' ESCAPE '!'", ["a!b"], ["a!!b", "ab"]),
        ("'abc'", ["abc"], ["abcd", "ab", "ABC"]),
        ("'abc%'", ["abc", "abcdef"], ["xabc"]),
        ("'%abc'", ["abc", "xxabc"], ["abcx"]),
        ("'%abc%'", ["abc", "xabcx"], ["ab c"]),
        ("'%'", ["", "anything"], []),
        ("'_'", ["x"], ["", "xy"]),
        ("'a.c*'", ["a.c*"], ["abc*", "a.cc"]),  # regular-expression characters are plain
        ("'a%c'", ["a\nc"], ["a\nd"]),  # % spans newlines
        ("'%%x'", ["x", "yyx"], ["xy"]),
        ("'x_%y'", ["xay", "xaby"], ["xy"]),
    ],
)
def test_like(pattern: str, matching: list[str], not_matching: list[str]) -> None:
    for value in matching:
        assert evaluate(f"s LIKE {pattern}", s=value) is True, value
        assert evaluate(f"s NOT LIKE {pattern}", s=value) is False, value
    for value in not_matching:
        assert evaluate(f"s LIKE {pattern}", s=value) is False, value
        assert evaluate(f"s NOT LIKE {pattern}", s=value) is True, value


def test_like_on_null_or_a_non_string() -> None:
    assert evaluate("s LIKE 'a%'") is UNKNOWN
    assert evaluate("s NOT LIKE 'a%'") is UNKNOWN
    assert evaluate("s LIKE '1%'", s=12) is False
    assert evaluate("s NOT LIKE '1%'", s=12) is True


def test_is_null() -> None:
    assert evaluate("s IS NULL") is True
    assert evaluate("s IS NULL", s="x") is False
    assert evaluate("s IS NOT NULL", s="x") is True
    assert evaluate("s IS NOT NULL") is False
    assert evaluate("s IS NULL", s=0) is False
    assert evaluate("NOT s IS NULL", s="") is True


# ------------------------------------------------------------------ lexical rules


def test_keywords_are_case_insensitive_identifiers_are_not() -> None:
    assert evaluate("a = 1 and b between 1 And 3 oR c", a=1, b=2) is True
    assert evaluate("s not like 'x%' escape '!' AND t is not null", s="y", t=0) is True
    assert evaluate("s In ('y') AND TrUe", s="y") is True
    assert evaluate("Color = 'red'", color="red") is UNKNOWN
    assert evaluate("color = 'red'", Color="red") is UNKNOWN


def test_identifiers_may_hold_keywords_dollars_underscores_and_dots() -> None:
    assert evaluate("android = 1 AND order_id = 2", android=1, order_id=2) is True
    assert evaluate("$price > 1 AND _x = 1 AND a$b = 2", **{"$price": 2, "_x": 1, "a$b": 2})
    assert evaluate("my.prop = 'v'", **{"my.prop": "v"}) is True
    assert evaluate("notable = 1 AND isbn = 2 AND nullable = 3", notable=1, isbn=2, nullable=3)
    assert evaluate("été = 1", **{"été": 1}) is True


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("57", 57),
        ("+62", 62),
        ("-957", -957),
        ("0x1F", 31),
        ("0X1f", 31),
        ("017", 15),  # Java: a leading zero is octal
        ("0", 0),
        ("5L", 5),
        ("9223372036854775807", 9223372036854775807),
        ("-9223372036854775808", -9223372036854775808),
        ("7E3", 7000.0),
        ("-57.9E2", -5790.0),
        ("7.", 7.0),
        ("-95.7", -95.7),
        ("+6.2", 6.2),
        (".5", 0.5),
        ("1.5e-3", 0.0015),
        ("1.5f", 1.5),
        ("2d", 2.0),
        ("3D", 3.0),
    ],
)
def test_numeric_literals(literal: str, value: float) -> None:
    assert evaluate(f"n = {literal}", n=value) is True
    assert evaluate(f"n <> {literal}", n=value) is False


def test_whitespace_and_newlines_between_tokens() -> None:
    assert evaluate("  color\n=\t'red'\r\n AND (\nweight>2 )  ", color="red", weight=3) is True


# ------------------------------------------------------------------ AMQP fields and JMS names


def encoded(**fields: Any) -> bytes:
    return Message(body="x", **fields).encode()


def test_amqp_header_fields() -> None:
    payload = encoded(durable=True, priority=7, ttl=2.5)
    assert compile_selector("amqp.durable = TRUE").matches(payload)
    assert compile_selector("amqp.priority > 5").matches(payload)
    assert compile_selector("amqp.ttl = 2500").matches(payload)
    assert compile_selector("JMSPriority = 7").matches(payload)
    assert compile_selector("JMSDeliveryMode = 'PERSISTENT'").matches(payload)
    assert compile_selector("amqp.delivery_mode = 'PERSISTENT'").matches(payload)
    plain = encoded()
    assert compile_selector("JMSDeliveryMode = 'NON_PERSISTENT'").matches(plain)
    assert compile_selector("amqp.priority = 4").matches(plain)  # the AMQP default
    assert compile_selector("amqp.durable = FALSE").matches(plain)


def test_amqp_properties_fields_and_their_jms_names() -> None:
    payload = encoded(
        id="order-1",
        correlation_id="corr-9",
        user_id=b"alice",
        address="orders",
        subject="invoice",
        reply_to="replies",
        content_type="text/plain",
        content_encoding="utf-8",
        creation_time=1_700_000_000.0,
        expiry_time=1_800_000_000.0,
        group_id="g1",
        group_sequence=3,
        reply_to_group_id="rg",
    )
    for text in (
        "amqp.message_id = 'order-1'",
        "JMSMessageID = 'order-1'",
        "amqp.correlation_id = 'corr-9' AND JMSCorrelationID = 'corr-9'",
        "amqp.user_id = 'alice' AND JMSXUserID = 'alice'",
        "amqp.to = 'orders'",
        "amqp.subject = 'invoice' AND JMSType = 'invoice'",
        "amqp.reply_to = 'replies'",
        "amqp.content_type = 'text/plain' AND amqp.content_encoding = 'utf-8'",
        "amqp.creation_time = 1700000000000 AND JMSTimestamp > 1699999999999",
        "amqp.absolute_expiry_time = 1800000000000",
        "amqp.group_id = 'g1' AND JMSXGroupID = 'g1'",
        "amqp.group_sequence = 3 AND JMSXGroupSeq = 3",
        "amqp.reply_to_group_id = 'rg'",
    ):
        assert compile_selector(text).matches(payload), text


def test_absent_fields_are_null_and_ids_of_other_types() -> None:
    plain = encoded()
    assert compile_selector("amqp.message_id IS NULL AND JMSCorrelationID IS NULL").matches(plain)
    assert compile_selector("JMSType IS NULL AND amqp.creation_time IS NULL").matches(plain)
    numbered = encoded(id=42, correlation_id=uuid.UUID(int=1))
    assert compile_selector("JMSMessageID = 42").matches(numbered)
    assert compile_selector("JMSCorrelationID = '00000000-0000-0000-0000-000000000001'").matches(
        numbered
    )


def test_application_properties_beside_amqp_fields() -> None:
    payload = Message(
        body="x", subject="s", priority=9, properties={"color": "red", "weight": 3}
    ).encode()
    assert compile_selector("color = 'red' AND weight > 2 AND amqp.subject = 's'").matches(payload)
    assert not compile_selector("color = 'red' AND amqp.priority < 5").matches(payload)


def test_what_a_selector_reads() -> None:
    only_properties = compile_selector("color = 'red'")
    assert (
        only_properties.reads_application,
        only_properties.reads_header,
        only_properties.reads_properties,
    ) == (True, False, False)
    header = compile_selector("JMSPriority > 4")
    assert (header.reads_application, header.reads_header, header.reads_properties) == (
        False,
        True,
        False,
    )


def test_a_message_that_does_not_decode_is_not_selected() -> None:
    selector = compile_selector("color = 'red' OR TRUE")
    assert not selector.matches(b"\x00Stgarbage")
    assert not selector.matches(b"\x00S")
    everything = compile_selector("color IS NULL OR amqp.priority = 4 OR amqp.to IS NULL")
    whole = codec.encode_message(
        b"x", durable=True, ttl=1000, to="q", application_properties={"color": "red", "n": 3}
    )
    assert everything.matches(whole)
    for cut in range(len(whole) - 3):  # every truncation: not selected, never an exception
        assert everything.matches(whole[:cut]) in (True, False)


# ------------------------------------------------------------------ the filter


def test_the_selector_is_found_by_its_descriptor() -> None:
    by_symbol = {"jms-selector": Described(symbol(SELECTOR_FILTER_SYMBOL), "a = 1")}
    by_code = {"whatever": Described(ulong(SELECTOR_FILTER_CODE), "b = 2")}
    other = {"jms-selector": Described(symbol("apache.org:no-local-filter:list"), ["x"])}
    assert selector_text(by_symbol) == "a = 1"
    assert selector_text(by_code) == "b = 2"
    assert selector_text(other) is None
    assert selector_text({**other, "s": by_symbol["jms-selector"]}) == "a = 1"
    assert selector_text(None) is None
    assert selector_text({}) is None
    compiled = selector_of(by_code)
    assert compiled is not None
    assert compiled.text == "b = 2"


def test_an_empty_selector_is_no_selector() -> None:
    assert selector_of({"s": Described(symbol(SELECTOR_FILTER_SYMBOL), "  ")}) is None


def test_a_selector_filter_must_carry_a_string() -> None:
    with pytest.raises(SelectorError, match="must be a string, not int"):
        selector_of({"s": Described(symbol(SELECTOR_FILTER_SYMBOL), 5)})


def test_a_bad_selector_in_a_filter_raises() -> None:
    with pytest.raises(SelectorError, match="column 7"):
        selector_of({"s": Described(symbol(SELECTOR_FILTER_SYMBOL), "a = 1 b")})


# ------------------------------------------------------------------ parse errors


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "color = ",
            "invalid selector at the end: it ends too early; expected one of: '(', + or -, "
            "FALSE, TRUE, a number, a string, an identifier",
        ),
        (
            "color = 'red",
            'invalid selector at column 9 (near "\'red"): a string that is never closed',
        ),
        (
            "color == 'red'",
            "invalid selector at column 8 (near \"= 'red'\"): unexpected '='; expected one of: "
            "'(', + or -, FALSE, TRUE, a number, a string, an identifier",
        ),
        (
            "weight > 2 AND color != 'red'",
            "invalid selector at column 22 (near \"!= 'red'\"): unexpected character '!'",
        ),
        (
            "a > 'x'",
            "invalid selector at column 3 (near \"> 'x'\"): a string compares with = "
            "and <> only, not with >",
        ),
        (
            "TRUE < a",
            "invalid selector at column 6 (near '< a'): a boolean compares with = and "
            "<> only, not with <",
        ),
        (
            "1 + 'a' = 2",
            "invalid selector at column 3 (near \"+ 'a' = 2\"): + takes numbers, not a string",
        ),
        (
            "-'a' = 2",
            "invalid selector at column 1 (near \"-'a' = 2\"): - takes a number, not a string",
        ),
        ("5", "invalid selector at column 1 (near '5'): expected a condition, found a number"),
        (
            "'x' AND a",
            "invalid selector at column 1 (near \"'x' AND a\"): expected a "
            "condition, found a string",
        ),
        (
            "NOT 1 + 2",
            "invalid selector at column 5 (near '1 + 2'): expected a condition, found a number",
        ),
        (
            "a BETWEEN 'a' AND 'b'",
            "invalid selector at column 3 (near \"BETWEEN 'a' AND "
            "'b'\"): BETWEEN takes numbers, not a string",
        ),
        (
            "5 LIKE 'a'",
            "invalid selector at column 3 (near \"LIKE 'a'\"): LIKE takes a string, not a number",
        ),
        (
            "x LIKE 'a' ESCAPE 'ab'",
            "invalid selector at column 19 (near \"'ab'\"): ESCAPE "
            "takes one character, not 2: 'ab'",
        ),
        (
            "x LIKE 'a' ESCAPE ''",
            "invalid selector at column 19 (near \"''\"): ESCAPE takes one character, not 0: ''",
        ),
        (
            "x LIKE 'ab!' ESCAPE '!'",
            "invalid selector at column 8 (near \"'ab!' ESCAPE "
            "'!'\"): the LIKE pattern 'ab!' ends with its escape character",
        ),
        ("x LIKE y", "invalid selector at column 8 (near 'y'): unexpected 'y'; expected a string"),
        (
            "null = 1",
            "invalid selector at column 1 (near 'null = 1'): unexpected 'null'; "
            "expected one of: '(', + or -, FALSE, NOT, TRUE, a number, a string, an identifier",
        ),
        ("09 = x", "invalid selector at column 1 (near '09 = x'): 09 is not an octal number"),
        (
            "x = 9223372036854775809",
            "invalid selector at column 5 (near "
            "'9223372036854775809'): the number 9223372036854775809 is out of the range of a "
            "long",
        ),
        (
            "x = 1e999",
            "invalid selector at column 5 (near '1e999'): the number 1e999 is out of range",
        ),
        (
            "a = 1 AND\n  b ! 2",
            "invalid selector at line 2 column 5 (near '! 2'): unexpected character '!'",
        ),
        (
            "x IN ()",
            "invalid selector at column 7 (near ')'): unexpected ')'; expected one "
            "of: + or -, FALSE, TRUE, a number, a string",
        ),
        (
            "x IN (y)",
            "invalid selector at column 7 (near 'y)'): unexpected 'y'; expected one "
            "of: + or -, FALSE, TRUE, a number, a string",
        ),
        ("", "the selector is empty"),
    ],
)
def test_parse_errors_say_where_and_what(text: str, message: str) -> None:
    assert parse_error(text) == message


def test_an_unknown_amqp_field_is_named_with_the_known_ones() -> None:
    message = parse_error("amqp.colour = 'red'")
    assert message.startswith(
        "invalid selector at column 1 (near \"amqp.colour = 'red'\"): amqp.colour names no "
        "AMQP field; known: amqp.absolute_expiry_time, "
    )
    assert "amqp.correlation_id" in message
    assert "amqp.priority" in message


def test_nesting_and_length_are_bounded() -> None:
    deep = "(" * 10_000 + "a = 1" + ")" * 10_000
    assert evaluate(deep, a=1) is True  # parentheses alone cost no depth
    nested = "NOT " * (MAX_DEPTH + 5) + "a"
    assert f"nested deeper than {MAX_DEPTH} levels" in parse_error(nested)
    assert evaluate("NOT " * (MAX_DEPTH // 2) + "a", a=True) is True
    too_long = "a = 1 OR " * (MAX_SELECTOR_CHARS // 9 + 1) + "a = 1"
    assert parse_error(too_long) == (f"the selector is longer than {MAX_SELECTOR_CHARS} characters")
