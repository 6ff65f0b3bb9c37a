"""What went wrong with a request, as its status and message, raised by any check whatever
transport carried it. Each transport maps it to its own shape at its edge: HTTP to the status
and its route family's JSON body (protocols/errors.py), gRPC to a status code
(protocols/rpc/server.py CODES), the binary protocol to a status byte. A check that a
schema cannot express names its message once, as a Rule, which the OpenAPI document lists."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any


class RequestError(Exception):
    """A request refused: `status` in HTTP's numbering (the one every transport's table maps
    from), `message` for the client as it stands."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Rule:
    """A 400 that a request the schema allows can still get, as one named message. `message`
    is what the check raises (a str.format template: `RULE.say(n=3)`); the OpenAPI document
    lists `pattern()`, made from the message (each field any text), or `regex` where the
    message is not ours to write (an exception's text, a message with a variable prefix)."""

    message: str = ""
    regex: str = ""

    def say(self, **values: Any) -> str:
        return self.message.format(**values)

    def only(self, **fixed: str) -> Rule:
        """This rule where some fields are known (the route's field name, its task)."""
        return Rule(self.message, self.pattern(**fixed))

    def pattern(self, **fixed: str) -> str:
        """The regex of the messages this rule raises; `fixed` fields are written as given."""
        if self.regex:
            return self.regex
        out = "^"
        for literal, name, _, _ in string.Formatter().parse(self.message):
            out += escaped(literal)
            if name is not None:
                out += escaped(fixed[name]) if name in fixed else ".*"
        return out[:-2] if out.endswith(".*") else out + "$"  # a field last: any ending


def escaped(text: str) -> str:
    """`text` as a regex that matches it alone: its metacharacters escaped, and nothing else (a
    pattern the document shows stays readable)."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


Rules = tuple[Rule, ...]
