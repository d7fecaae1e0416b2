"""What a request may constrain its reply to: a Constraint, checked when made,
and InvalidConstraint, the one error for every constraint that cannot run.

Pure Python: code that only builds, stores or shows a constraint (the window,
the server's request checks) imports this without torch or the grammar library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import EngineError

ConstraintKind = Literal["json_schema", "json_object", "regex", "lark"]
CONSTRAINT_KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "lark")

# A schema or grammar larger than this is refused before it is parsed: the
# largest real tool sets (a few hundred functions) are well under it, and
# the grammar compiler's own limits then bound what a smaller spec can cost.
MAX_SPEC_CHARS = 1_000_000


class InvalidConstraint(EngineError, ValueError):
    """A constraint the engine cannot run: malformed, an unsupported feature,
    or past a compile limit. Its message is one line naming which."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """The grammar a reply must follow.

    kind:
      "json_schema": `spec` is a JSON Schema as JSON text;
      "json_object": any JSON object (`spec` empty);
      "regex": `spec` is a regular expression the whole reply matches;
      "lark": `spec` is a grammar in llguidance's Lark dialect, which may embed
        JSON schemas as `%json{...}` (tool-call formats are written this way).
    """

    kind: ConstraintKind
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidConstraint(
                f"A constraint's kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}"
            )
        if not isinstance(self.spec, str):
            raise InvalidConstraint(
                f"A {self.kind} constraint's spec must be text, got {type(self.spec).__name__}"
            )
        if self.kind == "json_object":
            if self.spec:
                raise InvalidConstraint("A json_object constraint takes no spec; use json_schema for a schema")
        elif not self.spec.strip():
            raise InvalidConstraint(f"A {self.kind} constraint needs a spec ({_SPEC_NAMES[self.kind]})")
        if len(self.spec) > MAX_SPEC_CHARS:
            raise InvalidConstraint(
                f"The {_SPEC_NAMES[self.kind]} is {len(self.spec):,} characters; "
                f"at most {MAX_SPEC_CHARS:,} are accepted"
            )

    @property
    def described(self) -> str:
        """How a message names it: "the JSON schema", "the regular expression"."""
        return f"the {_SPEC_NAMES[self.kind]}"


_SPEC_NAMES = {
    "json_schema": "JSON schema",
    "json_object": "JSON object constraint",
    "regex": "regular expression",
    "lark": "Lark grammar",
}


def one_line(text: str, limit: int = 300) -> str:
    """A message of the grammar library as one line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
