"""Grammar-constrained decoding: a reply that must follow a JSON schema, be a
JSON object, match a regular expression or follow a Lark grammar.

A request carries its `Constraint` in `SamplingParams.constraint`. Submitting
it compiles the constraint for the model's tokenizer (cached; bounded in time
and memory) and raises `InvalidConstraint` before anything is queued when it
cannot run. While the request decodes, each step's allowed tokens are
computed beside the model's forward and every other token's logit is set to
-inf in that request's row alone, before sampling; the reply ends ("stop")
when the grammar is complete.

This package's root is light (no torch, no grammar library until a
constraint is checked): the window and the server import it freely.
"""

from __future__ import annotations

from engine.structured.constraint import CONSTRAINT_KINDS, Constraint, ConstraintKind, InvalidConstraint

__all__ = ["CONSTRAINT_KINDS", "Constraint", "ConstraintKind", "InvalidConstraint", "check_constraint"]


def check_constraint(constraint: Constraint) -> None:
    """Raise InvalidConstraint (one line naming the unsupported feature or the
    limit) unless `constraint` compiles. Needs no model: for a form or an
    early request check. A loaded engine checks against its own tokenizer
    too (`Engine.check_constraint`), and again when a request is submitted."""
    from engine.structured.compiler import check_constraint as check

    check(constraint)
