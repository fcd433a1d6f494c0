"""Forms in, resources out; the API's refusals back onto the fields they are about.

In: the fields of a submitted HTML form (strings), and the text of a refusal the config service
answered. Out: the `Address` or `MessagingUser` to create or update (`AddressForm.to_address`,
`UserForm.to_user`), and `FieldErrors`: each message of the refusal beside the form field it
names.

How a refusal finds its field: the config service words every validation problem as
`<Kind> <space>/<name>: <field path>: <message>` (enmasse.resources.validation.Violation), several
joined by `; `. `field_errors` splits them and maps the path (`spec.address`,
`spec.authorization[0].operations[1]`) to a form field; what names no field of the form (a
quota, a missing permission) is the form's own error, shown above it. The console does not
validate: what the API refuses, and why, is the one truth, as it is for the CLI and GitOps.

A user's rules are typed one per line, `send, recv: orders/#, invoices` (operations, a colon,
address patterns): the only thing parsed here, since the form has no other way to hold a list
of lists; a line without a colon is an error of the `authorization` field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from enmasse.v1 import resources_pb2

FORM = ""
"""The key of a message that belongs to the form, not to one field."""

FieldErrors = dict[str, str]

ADDRESS_FIELDS: Mapping[str, str] = {
    "metadata.name": "name",
    "spec.address": "address",
    "spec.type": "type",
    "spec.plan": "plan",
    "spec.topic": "topic",
}
USER_FIELDS: Mapping[str, str] = {
    "metadata.name": "name",
    "spec.username": "username",
    "spec.password": "password",
    "spec.authorization": "authorization",
}

_VIOLATION = re.compile(r"^[A-Z][A-Za-z]* \S+: (?P<path>[a-z_][\w.\[\]]*): (?P<message>.+)$", re.S)
_NEXT_VIOLATION = re.compile(r"; (?=[A-Z][A-Za-z]* \S+: [a-z_][\w.\[\]]*: )")


def _form_field(path: str, fields: Mapping[str, str]) -> str | None:
    """The form field of a field path: exact, else its nearest listed parent
    (`spec.authorization[0].operations` -> `authorization`)."""
    candidate = path
    while candidate:
        if candidate in fields:
            return fields[candidate]
        candidate = re.sub(r"(\[\d+\]|\.[^.\[\]]*)$", "", candidate)
        if candidate == path:
            return None
        path = candidate
    return None


def field_errors(message: str, *, fields: Mapping[str, str]) -> FieldErrors:
    """Each problem of a refusal beside the field it names; the rest under `FORM`."""
    errors: FieldErrors = {}
    for part in _NEXT_VIOLATION.split(message.strip()):
        found = _VIOLATION.match(part)
        target = _form_field(found["path"], fields) if found else None
        key, text = (target, found["message"]) if found and target else (FORM, part)
        errors[key] = f"{errors[key]}; {text}" if key in errors else text
    return errors


@dataclass
class AddressForm:
    name: str = ""
    address: str = ""
    type: str = ""
    plan: str = ""
    topic: str = ""
    resource_version: int = 0

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> AddressForm:
        """The submitted form; `address` defaults to the name, as `enmasse` manifests do."""
        name = fields.get("name", "").strip()
        return cls(
            name=name,
            address=fields.get("address", "").strip() or name,
            type=fields.get("type", "").strip(),
            plan=fields.get("plan", "").strip(),
            topic=fields.get("topic", "").strip(),
            resource_version=_int(fields.get("resource_version", "")),
        )

    @classmethod
    def from_address(cls, address: resources_pb2.Address) -> AddressForm:
        return cls(
            name=address.metadata.name,
            address=address.spec.address,
            type=address.spec.type,
            plan=address.spec.plan,
            topic=address.spec.topic,
            resource_version=address.metadata.resource_version,
        )

    def to_address(self, *, space: str) -> resources_pb2.Address:
        return resources_pb2.Address(
            metadata=resources_pb2.Metadata(
                name=self.name, space=space, resource_version=self.resource_version
            ),
            spec=resources_pb2.AddressSpec(
                address=self.address, type=self.type, plan=self.plan, topic=self.topic
            ),
        )


@dataclass
class UserForm:
    name: str = ""
    username: str = ""
    password: str = ""
    rules: str = ""
    resource_version: int = 0
    problems: FieldErrors = field(default_factory=dict)
    """What the form itself could not read (a rule line without a colon)."""

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> UserForm:
        name = fields.get("name", "").strip()
        form = cls(
            name=name,
            username=fields.get("username", "").strip() or name,
            password=fields.get("password", ""),
            rules=fields.get("authorization", "").strip(),
            resource_version=_int(fields.get("resource_version", "")),
        )
        for number, line in enumerate(form.rules.splitlines(), start=1):
            if line.strip() and ":" not in line:
                form.problems["authorization"] = (
                    f"line {number}: write a rule as `send, recv: orders/#` "
                    "(operations, a colon, address patterns)"
                )
                break
        return form

    @classmethod
    def from_user(cls, user: resources_pb2.MessagingUser) -> UserForm:
        lines = (
            f"{', '.join(r.operations)}: {', '.join(r.addresses)}" for r in user.spec.authorization
        )
        return cls(
            name=user.metadata.name,
            username=user.spec.username,
            rules="\n".join(lines),
            resource_version=user.metadata.resource_version,
        )

    def authorization(self) -> list[resources_pb2.AuthorizationRule]:
        rules = []
        for line in self.rules.splitlines():
            operations, _, addresses = line.partition(":")
            if not line.strip():
                continue
            rules.append(
                resources_pb2.AuthorizationRule(
                    operations=_items(operations), addresses=_items(addresses)
                )
            )
        return rules

    def to_user(self, *, space: str) -> resources_pb2.MessagingUser:
        """The user to write; an empty password on an edit keeps the stored one (the API
        never returns it, and takes none as "unchanged")."""
        return resources_pb2.MessagingUser(
            metadata=resources_pb2.Metadata(
                name=self.name, space=space, resource_version=self.resource_version
            ),
            spec=resources_pb2.MessagingUserSpec(
                username=self.username,
                password=self.password,
                authorization=self.authorization(),
            ),
        )


def _items(text: str) -> list[str]:
    return [item for item in re.split(r"[,\s]+", text.strip()) if item]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
