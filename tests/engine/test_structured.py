"""Grammar-constrained decoding (engine.structured) on a random-weight model.

Random weights make the grammar do all the work: whatever the model would
say, every constrained reply must parse and validate. The model is the tiny
random Llama with the default model's tokenizer, quantized at load so that it
runs the default path (the native kernels, batch invariant without any mode).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.llm import Engine
from engine.model.sampler import RequestSampler, TokenMask, sample
from engine.params import InvalidSamplingParams, SamplingParams
from engine.structured import Constraint, InvalidConstraint, check_constraint
from engine.structured.constraint import MAX_SPEC_CHARS

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "verified": {"type": "boolean"},
    },
    "required": ["name", "age", "pets", "verified"],
    "additionalProperties": False,
}
PERSON_CONSTRAINT = Constraint("json_schema", json.dumps(PERSON))
ANSWER = r"(yes|no)\. [a-z]{2,8}!"
PROMPTS = [[{"role": "user", "content": f"Describe person number {i} as JSON."}] for i in range(4)]


def is_person(value: object) -> bool:
    """PERSON's rules, checked by hand (jsonschema is no dependency of Tandem)."""
    return (
        isinstance(value, dict)
        and set(value) == {"name", "age", "pets", "verified"}
        and isinstance(value["name"], str) and 1 <= len(value["name"]) <= 12
        and type(value["age"]) is int and 0 <= value["age"] <= 120
        and isinstance(value["pets"], list) and len(value["pets"]) <= 3
        and all(p in ("cat", "dog", "fish") for p in value["pets"])
        and isinstance(value["verified"], bool)
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    with Engine(tiny_model_dir, device="cpu", quantize="int4", threads=1) as eng:
        yield eng


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0), dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7),
], ids=["greedy", "sampled"])
def test_every_json_schema_reply_parses_and_validates(engine: Engine, sampling: dict) -> None:
    params = SamplingParams(max_tokens=200, constraint=PERSON_CONSTRAINT, **sampling)
    outputs = engine.generate_outputs(PROMPTS, params)
    for out in outputs:
        assert out.finish_reason == "stop", out.text
        assert is_person(json.loads(out.text)), out.text
        # The grammar ended the reply: no end token was needed after the closing brace.
        assert out.text.rstrip().endswith("}")


def test_regex_and_json_object_replies_match(engine: Engine) -> None:
    regex = SamplingParams(temperature=1.0, seed=3, max_tokens=40, constraint=Constraint("regex", ANSWER))
    anything = SamplingParams(temperature=0.0, max_tokens=60, constraint=Constraint("json_object"))
    outputs = engine.generate_outputs(PROMPTS[:3] + PROMPTS[3:], [regex] * 3 + [anything])
    for out in outputs[:3]:
        assert out.finish_reason == "stop" and re.fullmatch(ANSWER, out.text), out.text
    last = outputs[3]
    # Where the random model's object ends is up to it; either way each token kept to JSON.
    if last.finish_reason == "stop":
        assert isinstance(json.loads(last.text), dict)
    else:
        assert last.finish_reason == "length" and len(last.token_ids) == 60
        assert last.text.lstrip().startswith("{")


def test_a_reply_cut_by_max_tokens_says_length(engine: Engine) -> None:
    out = engine.generate_outputs(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=3,
                                                              constraint=PERSON_CONSTRAINT))[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 3
    assert out.text.lstrip().startswith("{")


def test_free_requests_are_the_same_bits_beside_constrained_ones(engine: Engine) -> None:
    free = [
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=11, max_tokens=16, ignore_eos=True),
    ]
    bound = [
        SamplingParams(temperature=0.0, max_tokens=40, constraint=PERSON_CONSTRAINT),
        SamplingParams(temperature=0.9, seed=5, max_tokens=16, constraint=Constraint("regex", ANSWER)),
    ]
    alone = [o.token_ids for o in engine.generate_outputs(PROMPTS[:2], free)]
    bound_alone = [o.token_ids for o in engine.generate_outputs(PROMPTS[2:], bound)]
    mixed = engine.generate_outputs([PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[1]],
                                    [bound[0], free[0], bound[1], free[1]])
    assert [mixed[1].token_ids, mixed[3].token_ids] == alone
    assert [mixed[0].token_ids, mixed[2].token_ids] == bound_alone


def test_a_step_retried_request_by_request_keeps_each_mask(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=120, constraint=PERSON_CONSTRAINT)
    expected = [o.token_ids for o in engine.generate_outputs(PROMPTS[:3], params)]
    runner = engine.runner
    real_execute = runner.execute
    failures: list[int] = []

    def execute(step: Any, masks: Any = None) -> list[int]:
        # A batched step that fails (out of memory, say) is rerun one request at a time.
        if len(step.chunks) > 1 and len(failures) < 4:
            failures.append(len(step.chunks))
            raise RuntimeError("transient")
        return real_execute(step, masks)

    monkeypatch.setattr(runner, "execute", execute)
    outputs = engine.generate_outputs(PROMPTS[:3], params)
    assert len(failures) == 4
    assert [o.token_ids for o in outputs] == expected
    assert all(is_person(json.loads(o.text)) for o in outputs)


def test_an_invalid_constraint_fails_the_call_before_anything_is_queued(engine: Engine) -> None:
    good = SamplingParams(max_tokens=4, constraint=PERSON_CONSTRAINT)
    bad = SamplingParams(max_tokens=4, constraint=Constraint("json_schema", '{"not": {"type": "string"}}'))
    generated = engine.stats().generated_tokens
    with pytest.raises(InvalidConstraint, match='The JSON schema cannot be used: .*"not"'):
        engine.generate_outputs(PROMPTS[:2], [good, bad])
    with pytest.raises(InvalidConstraint, match="regular expression cannot be used"):
        engine.submit(PROMPTS[0], SamplingParams(constraint=Constraint("regex", "(unclosed")))

    async def start_async() -> None:
        engine.start_batch_async(PROMPTS[0], bad)

    with pytest.raises(InvalidConstraint):
        asyncio.run(start_async())
    # Nothing ran: no request of the refused calls produced a token.
    assert engine.stats().generated_tokens == generated
    assert engine.stats().running == engine.stats().waiting == 0


def test_constraints_are_checked_when_made() -> None:
    with pytest.raises(InvalidConstraint, match="kind must be one of"):
        Constraint("yaml", "a: 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidConstraint, match="needs a spec"):
        Constraint("regex", " ")
    with pytest.raises(InvalidConstraint, match="takes no spec"):
        Constraint("json_object", "{}")
    with pytest.raises(InvalidConstraint, match="at most 1,000,000"):
        Constraint("json_schema", "x" * (MAX_SPEC_CHARS + 1))
    with pytest.raises(InvalidSamplingParams, match="constraint"):
        SamplingParams(constraint='{"type": "object"}')  # type: ignore[arg-type]


def _nested_arrays(depth: int) -> str:
    return '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth


@pytest.mark.parametrize("spec, message", [
    # Nesting past the JSON reader's recursion limit, without Python's recursion ever starting.
    (_nested_arrays(5000), "recursion limit"),
    # Past any count a regular expression can hold.
    (json.dumps({"type": "string", "maxLength": 10**12}), "cannot be used"),
    (json.dumps({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}), '"not"'),
    (json.dumps({"type": "string", "format": "credit-card"}), "credit-card"),
    (json.dumps({"type": "integer", "minimum": 5, "maximum": 1}), "minimum"),
    ('{"type": "object", ', "not a JSON object"),
], ids=["deep-nesting", "enormous-maxLength", "unsupported-keyword", "unknown-format", "contradiction",
        "not-json"])
def test_hostile_schemas_are_refused_with_one_line_naming_why(spec: str, message: str) -> None:
    with pytest.raises(InvalidConstraint, match=message) as caught:
        check_constraint(Constraint("json_schema", spec))
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_a_ref_cycle_with_nothing_in_it_is_refused(engine: Engine) -> None:
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    with pytest.raises(InvalidConstraint, match=r"allows no reply at all \(a \$ref cycle"):
        engine.check_constraint(Constraint("json_schema", json.dumps(cycle)))


def test_recursive_and_huge_schemas_compile_and_hold(engine: Engine) -> None:
    linked_list = {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
                                      "required": ["next"], "additionalProperties": False}},
                   "$ref": "#/$defs/node"}
    huge_enum = {"enum": [f"option {i}" for i in range(5000)]}
    params = [SamplingParams(temperature=0.0, max_tokens=30, constraint=Constraint("json_schema", json.dumps(s)))
              for s in (linked_list, huge_enum)]
    nested, chosen = engine.generate_outputs(PROMPTS[:2], params)
    # A required "next" can never end: the reply nests until max_tokens cuts it.
    assert nested.finish_reason == "length" and nested.text.lstrip().startswith("{")
    assert chosen.finish_reason == "stop" and json.loads(chosen.text) in huge_enum["enum"]


def test_a_compile_past_its_time_is_refused_and_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.structured import compiler

    release = threading.Event()
    builds: list[Constraint] = []

    def stuck_build(self: compiler.GrammarCompiler, constraint: Constraint) -> compiler.CompiledGrammar:
        builds.append(constraint)
        release.wait()  # a compile that never ends by itself (native code cannot be interrupted)
        raise AssertionError("never used")

    monkeypatch.setattr(compiler, "COMPILE_SECONDS", 0.2)
    monkeypatch.setattr(compiler.GrammarCompiler, "_build", stuck_build)
    grammars = compiler.GrammarCompiler(Path("unused.json"), 100, [1])
    constraint = Constraint("regex", "a+")
    try:
        for _ in range(2):  # the second answer comes from the cache, without compiling again
            with pytest.raises(InvalidConstraint, match=r"took more than 0\.2 s to compile; simplify it"):
                grammars.compile(constraint)
        assert builds == [constraint]
    finally:
        release.set()


def test_a_row_whose_allowed_tokens_are_all_minus_infinity_still_draws_an_allowed_one() -> None:
    logits = torch.randn(2, 10)
    logits[0, 3] = logits[0, 7] = -torch.inf
    allowed = torch.zeros(1, 10, dtype=torch.bool)
    allowed[0, [3, 7]] = True
    greedy = SamplingParams(temperature=0.0)
    samplers = [RequestSampler(greedy, torch.device("cpu"), ()) for _ in range(2)]
    tokens = sample(logits, samplers, TokenMask([0], ~allowed))
    assert tokens[0] in (3, 7)
    assert tokens[1] == int(logits[1].argmax())


def test_a_constraint_survives_the_chat_stores_parameters() -> None:
    from app.store.records import params_from_dict, params_to_dict

    params = SamplingParams(temperature=0.2, constraint=PERSON_CONSTRAINT)
    stored = json.loads(json.dumps(params_to_dict(params)))
    assert stored["constraint"] == {"kind": "json_schema", "spec": PERSON_CONSTRAINT.spec}
    assert params_from_dict(stored) == params
    # Parameters without one keep the shape they had before constraints existed.
    assert "constraint" not in params_to_dict(SamplingParams())
    with pytest.raises(InvalidConstraint):
        params_from_dict({"constraint": {"kind": "yaml", "spec": "a"}})
