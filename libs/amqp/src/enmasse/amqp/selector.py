"""JMS message selectors: the text of an AMQP selector filter in, a predicate over messages out.

What flows in: the source filter of a receiving link (`Terminus.filter`), whose entry described
by `apache.org:selector-filter:string` (code 0x0000468C:0x00000004; the key is usually
"jms-selector", but the descriptor is what counts) carries the selector text, e.g.
`color = 'red' AND weight > 2`. What flows out: a `Selector`, whose `matches(payload)` tells, for
the encoded bytes of a message, whether it is selected; or a `SelectorError` whose text says
where (line and column) and what is wrong, which a broker sends back as the description of an
`amqp:invalid-field` refusal.

The language is the JMS 2.0 message selector (§3.8.1, a subset of SQL-92 conditional
expressions): string literals in single quotes ('' is a quote), exact numerics (Java integer
literals: 57, 0x1F, 017, 5L) and approximate numerics (7E3, -57.9E2, 7., .5, 1.5f), TRUE/FALSE,
identifiers, + - * / and unary + -, = <> < <= > >=, AND OR NOT, [NOT] BETWEEN, [NOT] IN, [NOT]
LIKE with ESCAPE, IS [NOT] NULL, parentheses. Keywords are case-insensitive, identifiers are not.
What an identifier names, as the AMQP JMS mapping and Qpid map it:
- `amqp.<field>` names a field of the header or properties section, its hyphen written as an
  underscore (`amqp.correlation_id`, `amqp.priority`, `amqp.durable`, ... see `AMQP_FIELDS`),
  the names a JMS client puts on the wire for its header names;
- the JMS header names a selector may use (JMSMessageID, JMSCorrelationID, JMSPriority,
  JMSTimestamp, JMSType, JMSDeliveryMode: 'PERSISTENT' or 'NON_PERSISTENT') and the JMS-defined
  properties JMSXGroupID, JMSXGroupSeq, JMSXUserID name the same fields;
- any other identifier names an application property; one the message lacks is NULL.
Three-valued logic as in SQL: NULL in a comparison, arithmetic, BETWEEN, IN or LIKE makes it
unknown, NOT unknown is unknown, FALSE AND unknown is FALSE, TRUE OR unknown is TRUE, and only
TRUE selects. Comparing values of unlike types (a string with a number, a boolean with a
string) is FALSE, as §3.8.1 says ("if the comparison of non-like type values is attempted, the
value of the operation is false"), never an error; so is ordering strings or booleans
(they compare with = and <> only), and LIKE on a value that is not a string. Arithmetic on
a value that is not a number, and division by zero, is NULL. A property used as a condition
(`WHERE active`) selects when it is boolean TRUE and is unknown when it is anything but a boolean.
Mistakes that show in the text itself are parse errors instead: a literal string or boolean
ordered or in arithmetic, a number where a condition must be, an unknown `amqp.` field, an
ESCAPE that is not one character. Beyond §3.8.1, IN takes numeric and boolean literals too.

Why it is built so: the selector is parsed by a grammar (lark, LALR, a basic lexer so that the
keywords are reserved everywhere) once per link, then compiled into nested Python closures,
specialised for the common shapes (a property compared with a literal, LIKE as a prefix or
suffix test), so evaluating a message costs a few dict look-ups and comparisons and nothing
is interpreted per message. `matches` decodes only the sections the selector reads (the
application properties map for `color = 'red'`; the header too for `amqp.priority`), never the
body. A message whose sections do not decode is simply not selected.

It lives in `enmasse.amqp` because it is about AMQP messages and filters only (the codec's
sections, the filter's descriptor), and both sides of the message plane use it: the broker
filters with it, and the router checks a consumer's selector when the consumer attaches and
passes the filter on to the broker, so a bad one is refused at the edge with the broker's words.
"""

from __future__ import annotations

import operator
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from enmasse.amqp import codec
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

SELECTOR_FILTER_SYMBOL = "apache.org:selector-filter:string"
SELECTOR_FILTER_CODE = 0x0000468C00000004
SELECTOR_FILTER_KEY = "jms-selector"  # what Qpid JMS and most clients call the filter entry

MAX_SELECTOR_CHARS = 65_536
MAX_DEPTH = 64  # nested parentheses and operators; a flat chain of AND / OR may be any length


class SelectorError(ValueError):
    """A selector that cannot be used, in words for the attaching client (where and what)."""


class MessageView(NamedTuple):
    """The sections a selector reads, decoded; sections it does not read stay empty."""

    header: codec.Header = codec.NO_HEADER
    properties: codec.Properties = codec.NO_PROPERTIES
    application: Mapping[str, Any] = {}


Evaluate = Callable[[MessageView], Any]


@dataclass(frozen=True)
class Selector:
    """A compiled selector: `matches(payload)` per message, `evaluate(view)` three-valued."""

    text: str
    evaluate: Evaluate = field(repr=False)
    reads_header: bool = False
    reads_properties: bool = False
    reads_application: bool = False

    def matches(self, payload: bytes) -> bool:
        """Whether the encoded message is selected (TRUE; FALSE and unknown are not)."""
        try:
            view = MessageView(
                codec.read_header(payload) if self.reads_header else codec.NO_HEADER,
                codec.read_properties(payload) if self.reads_properties else codec.NO_PROPERTIES,
                codec.read_application_properties(payload) if self.reads_application else _EMPTY,
            )
        except (codec.CodecError, IndexError, ValueError, struct.error):
            return False  # a message that does not decode is selected by nothing
        return self.evaluate(view) is True


_EMPTY: Mapping[str, Any] = {}


def selector_text(source_filter: Mapping[str, Any] | None) -> str | None:
    """The selector text of a source's filter map (found by its descriptor), or None when the
    filter holds no selector or an empty one (JMS: an empty selector selects everything)."""
    if not source_filter:
        return None
    for value in source_filter.values():
        descriptor = getattr(value, "descriptor", None)
        if descriptor is None or not _is_selector_descriptor(descriptor):
            continue
        text = getattr(value, "value", None)
        if not isinstance(text, str):
            raise SelectorError(
                f"the selector filter's value must be a string, not {type(text).__name__}"
            )
        return text if text.strip() else None
    return None


def selector_of(source_filter: Mapping[str, Any] | None) -> Selector | None:
    """The compiled selector of a source's filter map, None without one; raises SelectorError."""
    text = selector_text(source_filter)
    return compile_selector(text) if text is not None else None


def _is_selector_descriptor(descriptor: object) -> bool:
    if isinstance(descriptor, str):
        return descriptor == SELECTOR_FILTER_SYMBOL
    return isinstance(descriptor, int) and descriptor == SELECTOR_FILTER_CODE


# ------------------------------------------------------------------ the grammar

_GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr
        | or_expr OR and_expr                                  -> or_
?and_expr: not_expr
         | and_expr AND not_expr                               -> and_
?not_expr: predicate
         | NOT not_expr                                        -> not_
?predicate: sum
          | sum COMPARE sum                                    -> compare
          | sum [NOT] BETWEEN sum AND sum                      -> between
          | sum [NOT] IN "(" in_item ("," in_item)* ")"        -> in_
          | sum [NOT] LIKE STRING [ESCAPE STRING]              -> like
          | sum IS [NOT] NULL                                  -> is_null
?sum: product
    | sum SIGN product                                         -> arithmetic
?product: unary
        | product TIMES unary                                  -> arithmetic
?unary: atom
      | SIGN unary                                             -> sign
?atom: literal
     | IDENTIFIER                                              -> identifier
     | "(" or_expr ")"
literal: STRING | INTEGER | DECIMAL | TRUE | FALSE
in_item: [SIGN] (INTEGER | DECIMAL) | STRING | TRUE | FALSE

OR.3: /or(?![\w$.])/i
AND.3: /and(?![\w$.])/i
NOT.3: /not(?![\w$.])/i
BETWEEN.3: /between(?![\w$.])/i
IN.3: /in(?![\w$.])/i
LIKE.3: /like(?![\w$.])/i
ESCAPE.3: /escape(?![\w$.])/i
IS.3: /is(?![\w$.])/i
NULL.3: /null(?![\w$.])/i
TRUE.3: /true(?![\w$.])/i
FALSE.3: /false(?![\w$.])/i

STRING: /'(?:[^']|'')*'/
DECIMAL.2: /(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?|\d+[eE][+-]?\d+[fFdD]?|\d+[fFdD]/
INTEGER.1: /0[xX][0-9a-fA-F]+[lL]?|\d+[lL]?/
IDENTIFIER: /(?!\d)[\w$][\w$.]*/
COMPARE: /<>|<=|>=|=|<|>/
SIGN: /[+-]/
TIMES: /[*\/]/

%ignore /\s+/
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=True)

_READABLE = {
    "STRING": "a string",
    "INTEGER": "a number",
    "DECIMAL": "a number",
    "IDENTIFIER": "an identifier",
    "COMPARE": "a comparison (= <> < <= > >=)",
    "SIGN": "+ or -",
    "TIMES": "* or /",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "$END": "the end of the selector",
}


def compile_selector(text: str) -> Selector:
    """Parses and compiles a selector; raises SelectorError saying where and what is wrong."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"the selector is longer than {MAX_SELECTOR_CHARS} characters")
    if not text.strip():
        raise SelectorError("the selector is empty")
    try:
        tree = _PARSER.parse(text)
    except UnexpectedInput as error:
        raise SelectorError(_parse_problem(text, error)) from None
    compiler = _Compiler(text)
    try:
        node = compiler.condition(tree, depth=0)
    except RecursionError:
        raise SelectorError(f"the selector nests deeper than {MAX_DEPTH} levels") from None
    return Selector(
        text=text,
        evaluate=node.fn,
        reads_header=compiler.reads_header,
        reads_properties=compiler.reads_properties,
        reads_application=compiler.reads_application,
    )


def _where(text: str, line: int, column: int) -> str:
    place = f"line {line} column {column}" if "\n" in text.strip() else f"column {column}"
    offset = _offset(text, line, column)
    near = text[offset : offset + 20].strip()
    return f"{place} (near {near!r})" if near else place


def _offset(text: str, line: int, column: int) -> int:
    lines = text.split("\n")
    return sum(len(earlier) + 1 for earlier in lines[: line - 1]) + column - 1


def _parse_problem(text: str, error: UnexpectedInput) -> str:
    # lark gives -1 or '?' where it has no position (the end of the input)
    line = error.line if isinstance(error.line, int) and error.line > 0 else 1
    column = error.column if isinstance(error.column, int) and error.column > 0 else 1
    if isinstance(error, UnexpectedCharacters):
        char = text[_offset(text, line, column)]
        what = "a string that is never closed" if char == "'" else f"unexpected character {char!r}"
        return f"invalid selector at {_where(text, line, column)}: {what}"
    if isinstance(error, UnexpectedToken):
        token = error.token
        if token.type == "$END":
            expected = _expected(error.expected)
            return f"invalid selector at the end: it ends too early; expected {expected}"
        found = f"unexpected {token.value!r}"
        expected = _expected(error.expected)
        return f"invalid selector at {_where(text, line, column)}: {found}; expected {expected}"
    return f"invalid selector at {_where(text, line, column)}"


def _expected(names: set[str]) -> str:
    readable = sorted({_READABLE.get(name, name) for name in names})
    if len(readable) == 1:
        return readable[0]
    return "one of: " + ", ".join(readable)


# ------------------------------------------------------------------ what identifiers name

# header fields
_HEADER_FIELDS: dict[str, Callable[[codec.Header], Any]] = {
    "durable": lambda h: h.durable,
    "priority": lambda h: h.priority,
    "ttl": lambda h: h.ttl,
    "first_acquirer": lambda h: h.first_acquirer,
    "delivery_mode": lambda h: "PERSISTENT" if h.durable else "NON_PERSISTENT",
}


def _identity(value: Any) -> Any:
    return value


def _text_id(value: Any) -> Any:
    """message-id / correlation-id: a string as it is, a ulong as a number, a uuid as its text;
    binary stays bytes (like nothing a selector can write, so it only ever compares FALSE)."""
    return str(value) if isinstance(value, uuid.UUID) else value


def _user_id(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value


# properties fields: the name as an `amqp.` identifier -> (Properties field, conversion)
_PROPERTY_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "message_id": ("message_id", _text_id),
    "user_id": ("user_id", _user_id),
    "to": ("to", _identity),
    "subject": ("subject", _identity),
    "reply_to": ("reply_to", _identity),
    "correlation_id": ("correlation_id", _text_id),
    "content_type": ("content_type", _identity),
    "content_encoding": ("content_encoding", _identity),
    "absolute_expiry_time": ("absolute_expiry_time", _identity),
    "creation_time": ("creation_time", _identity),
    "group_id": ("group_id", _identity),
    "group_sequence": ("group_sequence", _identity),
    "reply_to_group_id": ("reply_to_group_id", _identity),
}

AMQP_FIELDS = tuple(sorted({*_HEADER_FIELDS, *_PROPERTY_FIELDS}))

# JMS header names (the ones §3.8.1 allows) and JMS-defined properties -> their amqp. field
JMS_NAMES = {
    "JMSMessageID": "message_id",
    "JMSCorrelationID": "correlation_id",
    "JMSPriority": "priority",
    "JMSTimestamp": "creation_time",
    "JMSType": "subject",
    "JMSDeliveryMode": "delivery_mode",
    "JMSXGroupID": "group_id",
    "JMSXGroupSeq": "group_sequence",
    "JMSXUserID": "user_id",
}

# ------------------------------------------------------------------ the compiler

# Static kinds: what an expression is known to be from the text alone.
BOOLEAN, NUMBER, STRING, ANY = "boolean", "number", "string", "any"  # ANY: a field's value
_NUMBERS = frozenset((int, float))  # by exact type: a bool is not a number here


class _Node(NamedTuple):
    fn: Evaluate
    kind: str
    constant: bool = False
    value: Any = None
    property_name: str | None = None  # an application property, read straight from the map


_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_FLIPPED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


class _Compiler:
    def __init__(self, text: str) -> None:
        self.text = text
        self.reads_header = False
        self.reads_properties = False
        self.reads_application = False

    def error(self, token: Token | None, what: str) -> SelectorError:
        if token is None or token.line is None or token.column is None:
            return SelectorError(f"invalid selector: {what}")
        where = _where(self.text, token.line, token.column)
        return SelectorError(f"invalid selector at {where}: {what}")

    # -- conditions

    def condition(self, tree: Tree | Token, *, depth: int) -> _Node:
        """A node that must be a condition: TRUE, FALSE or None (unknown) per message."""
        node = self.expression(tree, depth=depth)
        if node.kind == BOOLEAN:
            return node
        if node.kind == ANY:
            return _Node(_as_condition(node.fn), BOOLEAN)
        raise self.error(_first_token(tree), f"expected a condition, found a {node.kind}")

    def expression(self, tree: Tree | Token, *, depth: int) -> _Node:
        if depth > MAX_DEPTH:
            raise self.error(_first_token(tree), f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(tree, Token):  # cannot happen with this grammar; kept total
            raise self.error(tree, f"unexpected {tree.value!r}")
        compile_rule = getattr(self, f"rule_{tree.data}")
        node: _Node = compile_rule(tree, depth + 1)
        return node

    def rule_or_(self, tree: Tree, depth: int) -> _Node:
        return self._junction(tree, "or_", depth)

    def rule_and_(self, tree: Tree, depth: int) -> _Node:
        return self._junction(tree, "and_", depth)

    def _junction(self, tree: Tree, data: str, depth: int) -> _Node:
        # a OR b OR c is a left-deep tree: walk it without recursion, so a long flat chain
        # (generated selectors: id = 1 OR id = 2 OR ...) costs no depth
        operands: list[Tree | Token] = []
        node: Tree | Token = tree
        while isinstance(node, Tree) and node.data == data:
            operands.append(node.children[2])
            node = node.children[0]
        operands.append(node)
        fns = [self.condition(operand, depth=depth).fn for operand in reversed(operands)]
        return _Node(_or(fns) if data == "or_" else _and(fns), BOOLEAN)

    def rule_not_(self, tree: Tree, depth: int) -> _Node:
        return _Node(_not(self.condition(tree.children[1], depth=depth).fn), BOOLEAN)

    # -- predicates

    def rule_compare(self, tree: Tree, depth: int) -> _Node:
        left_tree, op_token, right_tree = _parts(tree)
        left = self.expression(left_tree, depth=depth)
        right = self.expression(right_tree, depth=depth)
        op = str(op_token)
        if op in _ORDER:
            for side in (left, right):
                if side.kind in (STRING, BOOLEAN):
                    raise self.error(
                        op_token, f"a {side.kind} compares with = and <> only, not with {op}"
                    )
        return _Node(_comparison(op, left, right), BOOLEAN)

    def rule_between(self, tree: Tree, depth: int) -> _Node:
        subject_tree, negated, between, low_tree, _and_token, high_tree = _parts(tree)
        subject, low, high = (
            self.expression(part, depth=depth) for part in (subject_tree, low_tree, high_tree)
        )
        for side in (subject, low, high):
            if side.kind in (STRING, BOOLEAN):
                raise self.error(between, f"BETWEEN takes numbers, not a {side.kind}")
        return _Node(_between(subject, low, high, negated=negated is not None), BOOLEAN)

    def rule_in_(self, tree: Tree, depth: int) -> _Node:
        subject_tree, negated, _in_token, *items = _parts(tree)
        subject = self.expression(subject_tree, depth=depth)
        values = [self.in_item(item) for item in items]
        return _Node(_in(subject.fn, values, negated=negated is not None), BOOLEAN)

    def in_item(self, item: Tree) -> Any:
        parts = _parts(item)
        sign, *rest = parts if len(parts) == 2 else (None, *parts)
        value = self.literal_value(rest[0])
        if sign is not None and str(sign) == "-":
            value = -value
        self.check_number_range(rest[0], value)
        return value

    def rule_like(self, tree: Tree, depth: int) -> _Node:
        subject_tree, negated, like, pattern_token, _escape, escape_token = _parts(tree)
        subject = self.expression(subject_tree, depth=depth)
        if subject.kind in (NUMBER, BOOLEAN):
            raise self.error(like, f"LIKE takes a string, not a {subject.kind}")
        pattern = _string(pattern_token)
        escape = None
        if escape_token is not None:
            escape = _string(escape_token)
            if len(escape) != 1:
                raise self.error(
                    escape_token, f"ESCAPE takes one character, not {len(escape)}: {escape!r}"
                )
        test = self.like_test(pattern_token, pattern, escape)
        return _Node(_like(subject.fn, test, negated=negated is not None), BOOLEAN)

    def like_test(self, token: Token, pattern: str, escape: str | None) -> Callable[[str], bool]:
        """The pattern as the cheapest test that does the same: equality, a prefix, a suffix,
        a substring, or else a regular expression."""
        parts: list[tuple[bool, str]] = []  # (wildcard?, text)
        chars = iter(range(len(pattern)))
        for i in chars:
            char = pattern[i]
            if escape is not None and char == escape:
                following = next(chars, None)
                if following is None:
                    raise self.error(
                        token, f"the LIKE pattern {pattern!r} ends with its escape character"
                    )
                parts.append((False, pattern[following]))
            elif char in "%_":
                parts.append((True, char))
            else:
                parts.append((False, char))
        wild = [i for i, (is_wild, _) in enumerate(parts) if is_wild]
        literal = "".join(text for is_wild, text in parts if not is_wild)
        kinds = [text for is_wild, text in parts if is_wild]
        if not wild:
            return lambda value: value == literal
        if "_" not in kinds:
            if wild == [len(parts) - 1]:
                return lambda value: value.startswith(literal)
            if wild == [0]:
                return lambda value: value.endswith(literal)
            if wild == [0, len(parts) - 1] and len(parts) > 1:
                return lambda value: literal in value
        regex = "".join(
            (".*" if text == "%" else ".") if is_wild else re.escape(text)
            for is_wild, text in parts
        )
        compiled = re.compile(regex, re.DOTALL)
        return lambda value: compiled.fullmatch(value) is not None

    def rule_is_null(self, tree: Tree, depth: int) -> _Node:
        subject_tree, _is, negated, _null = _parts(tree)
        get = self.expression(subject_tree, depth=depth).fn
        if negated is not None:
            return _Node(lambda m: get(m) is not None, BOOLEAN)
        return _Node(lambda m: get(m) is None, BOOLEAN)

    # -- values

    def rule_arithmetic(self, tree: Tree, depth: int) -> _Node:
        left_tree, op_token, right_tree = _parts(tree)
        left = self.expression(left_tree, depth=depth)
        right = self.expression(right_tree, depth=depth)
        for side in (left, right):
            if side.kind in (STRING, BOOLEAN):
                raise self.error(op_token, f"{op_token} takes numbers, not a {side.kind}")
        return _Node(_arithmetic(str(op_token), left.fn, right.fn), NUMBER)

    def rule_sign(self, tree: Tree, depth: int) -> _Node:
        sign, operand_tree = _parts(tree)
        operand = self.expression(operand_tree, depth=depth)
        if operand.kind in (STRING, BOOLEAN):
            raise self.error(sign, f"{sign} takes a number, not a {operand.kind}")
        if str(sign) == "+":
            return operand
        if operand.constant:
            value = -operand.value
            return _Node(lambda m: value, NUMBER, constant=True, value=value)
        get = operand.fn
        return _Node(_negate(get), NUMBER)

    def rule_literal(self, tree: Tree, depth: int) -> _Node:
        token = _parts(tree)[0]
        value = self.literal_value(token)
        if token.type in ("INTEGER", "DECIMAL"):
            # the range of a long; -9223372036854775808 is the literal 9223372036854775808 negated
            self.check_number_range(token, -value if value == 1 << 63 else value)
        kind = {"STRING": STRING, "TRUE": BOOLEAN, "FALSE": BOOLEAN}.get(token.type, NUMBER)
        return _Node(lambda m: value, kind, constant=True, value=value)

    def literal_value(self, token: Token) -> Any:
        kind = token.type
        text = str(token)
        if kind == "STRING":
            return _string(token)
        if kind == "TRUE":
            return True
        if kind == "FALSE":
            return False
        if kind == "DECIMAL":
            number = float(text.rstrip("fFdD"))
            if number in (float("inf"), float("-inf")):
                raise self.error(token, f"the number {text} is out of range")
            return number
        digits = text.rstrip("lL")
        if digits[:2] in ("0x", "0X"):
            return int(digits[2:], 16)
        if len(digits) > 1 and digits[0] == "0":
            if not set(digits) <= set("01234567"):
                raise self.error(token, f"{text} is not an octal number")
            return int(digits, 8)
        return int(digits)

    def check_number_range(self, token: Token, value: Any) -> None:
        if isinstance(value, int) and not -(1 << 63) <= value <= (1 << 63) - 1:
            raise self.error(token, f"the number {token} is out of the range of a long")

    def rule_identifier(self, tree: Tree, depth: int) -> _Node:
        token = _parts(tree)[0]
        name = str(token)
        field_name = JMS_NAMES.get(name)
        if field_name is None and name.startswith("amqp."):
            field_name = name[len("amqp.") :]
            if field_name not in _HEADER_FIELDS and field_name not in _PROPERTY_FIELDS:
                raise self.error(
                    token,
                    f"{name} names no AMQP field; known: "
                    + ", ".join(f"amqp.{known}" for known in AMQP_FIELDS),
                )
        if field_name is None:
            self.reads_application = True
            return _Node(lambda m: m[2].get(name), ANY, property_name=name)
        header_field = _HEADER_FIELDS.get(field_name)
        if header_field is not None:
            self.reads_header = True
            return _Node(lambda m: header_field(m[0]), ANY)
        self.reads_properties = True
        index = codec.Properties._fields.index(_PROPERTY_FIELDS[field_name][0])
        convert = _PROPERTY_FIELDS[field_name][1]
        return _Node(lambda m: convert(m[1][index]), ANY)


def _parts(tree: Tree) -> list[Any]:
    """A node's children, as this grammar makes them (the rule says which are tokens)."""
    return list(tree.children)


def _first_token(tree: Tree | Token) -> Token | None:
    if isinstance(tree, Token):
        return tree
    for token in tree.scan_values(lambda value: isinstance(value, Token)):
        return token  # type: ignore[no-any-return]
    return None


def _string(token: Token) -> str:
    return str(token)[1:-1].replace("''", "'")


# ------------------------------------------------------------------ the closures
# Conditions return True, False or None (unknown); values return the value or None (NULL).


def _as_condition(get: Evaluate) -> Evaluate:
    def condition(m: MessageView) -> bool | None:
        value = get(m)
        return value if type(value) is bool else None

    return condition


def _and(fns: list[Evaluate]) -> Evaluate:
    if len(fns) == 2:
        first, second = fns

        def both(m: MessageView) -> bool | None:
            a = first(m)
            if a is False:
                return False
            b = second(m)
            if b is False:
                return False
            return None if a is None or b is None else True

        return both

    def every(m: MessageView) -> bool | None:
        unknown = False
        for fn in fns:
            value = fn(m)
            if value is False:
                return False
            if value is None:
                unknown = True
        return None if unknown else True

    return every


def _or(fns: list[Evaluate]) -> Evaluate:
    def some(m: MessageView) -> bool | None:
        unknown = False
        for fn in fns:
            value = fn(m)
            if value is True:
                return True
            if value is None:
                unknown = True
        return None if unknown else False

    return some


def _not(fn: Evaluate) -> Evaluate:
    def negation(m: MessageView) -> bool | None:
        value = fn(m)
        return None if value is None else not value

    return negation


def _compare_values(op: str, a: Any, b: Any) -> bool | None:
    """Any two values: NULL is unknown; numbers compare across int and float; other values
    compare only with their own type, and strings and booleans with = and <> only."""
    if a is None or b is None:
        return None
    type_a, type_b = type(a), type(b)
    if type_a in _NUMBERS and type_b in _NUMBERS:
        if op == "=":
            return bool(a == b)
        if op == "<>":
            return bool(a != b)
        return bool(_ORDER[op](a, b))
    if type_a is not type_b or op in _ORDER or type_a not in (str, bool):
        return False
    return (a == b) if op == "=" else (a != b)


def _comparison(op: str, left: _Node, right: _Node) -> Evaluate:
    if left.constant and not right.constant:
        left, right, op = right, left, _FLIPPED[op]
    if right.constant and not left.constant:
        return _against_literal(op, left, right.value)
    get_left, get_right = left.fn, right.fn
    return lambda m: _compare_values(op, get_left(m), get_right(m))


def _against_literal(op: str, subject: _Node, literal: Any) -> Evaluate:
    """`subject op literal`, the commonest shape, as one closure: read, check type, compare."""
    if type(literal) in _NUMBERS:
        wanted: frozenset[type] = _NUMBERS
    else:
        wanted = frozenset((type(literal),))
    test: Callable[[Any, Any], Any] = {
        "=": operator.eq,
        "<>": operator.ne,
        **_ORDER,
    }[op]
    name = subject.property_name
    if name is not None:  # an application property: straight from the map

        def property_test(m: MessageView) -> bool | None:
            value = m[2].get(name)
            if value is None:
                return None
            return type(value) in wanted and bool(test(value, literal))

        return property_test
    get = subject.fn

    def value_test(m: MessageView) -> bool | None:
        value = get(m)
        if value is None:
            return None
        return type(value) in wanted and bool(test(value, literal))

    return value_test


def _between(subject: _Node, low: _Node, high: _Node, *, negated: bool) -> Evaluate:
    get, get_low, get_high = subject.fn, low.fn, high.fn

    def between(m: MessageView) -> bool | None:
        value = get(m)
        above = _compare_values(">=", value, get_low(m))
        below = _compare_values("<=", value, get_high(m))
        if above is False or below is False:
            return False
        return None if above is None or below is None else True

    def outside(m: MessageView) -> bool | None:
        value = get(m)
        under = _compare_values("<", value, get_low(m))
        over = _compare_values(">", value, get_high(m))
        if under is True or over is True:
            return True
        return None if under is None or over is None else False

    return outside if negated else between


def _in(get: Evaluate, values: list[Any], *, negated: bool) -> Evaluate:
    strings = frozenset(v for v in values if type(v) is str)
    numbers = frozenset(v for v in values if type(v) in _NUMBERS)
    booleans = frozenset(v for v in values if type(v) is bool)

    def member(m: MessageView) -> bool | None:
        value = get(m)
        if value is None:
            return None
        kind = type(value)
        if kind is str:
            found = value in strings
        elif kind in _NUMBERS:
            found = value in numbers
        elif kind is bool:
            found = value in booleans
        else:
            found = False
        return found is not negated

    return member


def _like(get: Evaluate, test: Callable[[str], bool], *, negated: bool) -> Evaluate:
    def like(m: MessageView) -> bool | None:
        value = get(m)
        if value is None:
            return None
        if type(value) is not str:
            return negated  # unlike types: LIKE is FALSE, so NOT LIKE is TRUE
        return test(value) is not negated

    return like


def _arithmetic(op: str, get_left: Evaluate, get_right: Evaluate) -> Evaluate:
    if op == "+":
        combine: Callable[[Any, Any], Any] = operator.add
    elif op == "-":
        combine = operator.sub
    elif op == "*":
        combine = operator.mul
    else:
        combine = _divide

    def arithmetic(m: MessageView) -> Any:
        a = get_left(m)
        b = get_right(m)
        if type(a) not in _NUMBERS or type(b) not in _NUMBERS:
            return None
        return combine(a, b)

    return arithmetic


def _divide(a: Any, b: Any) -> Any:
    """Java's division: exact numbers truncate toward zero; by zero is NULL (unknown)."""
    if b == 0:
        return None
    if type(a) is int and type(b) is int:
        quotient = abs(a) // abs(b)
        return quotient if (a < 0) == (b < 0) else -quotient
    return a / b


def _negate(get: Evaluate) -> Evaluate:
    def negative(m: MessageView) -> Any:
        value = get(m)
        return -value if type(value) in _NUMBERS else None

    return negative
