"""A document asked about in several panes: is it computed once?

    .venv/bin/python bench/documents.py [--panes 3] [--questions 5] [--doc-tokens 6000]

A ~6,000-token report (generated, read through engine.documents as the window reads an
attachment) goes with a first question to every pane at once on a cold prefix cache; then
each pane gets four follow-up questions, all panes at once, each turn growing the pane's
kept ids as the app's conversations do (`encode_next_turn`). The panes sample with their
own seeds, so their replies (and turns after the first) differ.

Measured: the prompt tokens the engine computed over all turns and panes, against the
document's tokens plus every question's own tokens in every pane (goal <= 1.2x, issue 31);
and each follow-up's time to first token (the slowest pane's) against the first question's
(goal <= 0.15x). Prints one JSON object with the machine; the goals on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_average, machine, machine_line  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402
from engine.documents import Document, read_document, user_message_with_documents  # noqa: E402

QUESTIONS = [
    "Summarise the report in three sentences.",
    "Which region grew fastest, and why does the report say so?",
    "List the risks the report names, most serious first.",
    "What does the report recommend for next year's budget?",
    "Which figure in the report would you check first, and how?",
]
_REGIONS = ["North", "South", "East", "West", "Central", "Coastal", "Highland", "Metro"]
_TOPICS = ["sales", "staffing", "logistics", "customer support", "research", "energy use", "suppliers", "training"]


def report_text(sections: int) -> str:
    """A deterministic quarterly report of `sections` sections (~150 tokens each)."""
    parts = ["# Annual operations report\n"]
    for i in range(sections):
        region, topic = _REGIONS[i % len(_REGIONS)], _TOPICS[(i * 3) % len(_TOPICS)]
        growth = (i * 37) % 23 - 6
        cause = ["new hires", "a late supplier", "weather", "a price change"][i % 4]
        other = ["costs", "delays", "complaints", "returns"][(i + 1) % 4]
        risk = ["staff turnover", "currency swings", "one large customer", "ageing equipment"][i % 4]
        advice = ["hold spending flat", "hire two more people", "renegotiate contracts",
                  "replace the oldest machines"][(i + 2) % 4]
        parts.append(
            f"## {i + 1}. {region} region: {topic}\n\n"
            f"In quarter {i % 4 + 1}, the {region} region's {topic} changed by {growth}% against the year before. "
            f"The team attributes this to {cause}, and notes that {other} moved the other way. "
            f"The budget for {topic} was {100 + (i * 13) % 90} thousand, of which {40 + (i * 7) % 50}% was spent "
            f"by the end of the quarter. A risk named here is {risk}; the recommendation is to {advice} "
            f"and to review the figure again in {i % 6 + 2} months.\n"
        )
    return "\n".join(parts)


def write_report(doc_tokens: int, engine: Engine, folder: Path) -> Document:
    """The report as a Markdown file read as an attachment, grown to about `doc_tokens` tokens."""
    sections = 8
    while True:
        path = folder / "annual-report.md"
        path.write_text(report_text(sections), encoding="utf-8")
        document = read_document(path)
        tokens = len(engine.tokenizer.encode(user_message_with_documents("", [document])))
        if tokens >= doc_tokens:
            return document
        sections = max(sections + 1, int(sections * doc_tokens / tokens))


def ask_all(engine: Engine, panes: list[dict], question: str, document: Document | None,
            reply_tokens: int) -> dict[str, object]:
    """`question` (with the document, on the first turn) to every pane at once."""
    content = user_message_with_documents(question, [document] if document else [])
    prompts = []
    for pane in panes:
        pane["messages"].append({"role": "user", "content": content})
        prompts.append(engine.tokenizer.encode_next_turn(pane["ids"], pane["messages"]))
    before = engine.stats().prompt_tokens_computed
    params = [SamplingParams(temperature=0.7, seed=pane["seed"], max_tokens=reply_tokens, ignore_eos=True)
              for pane in panes]
    # One batch, as a broadcast from the composer: every pane's request submitted together.
    outputs = engine.generate_outputs(prompts, params)
    computed = engine.stats().prompt_tokens_computed - before
    for pane, prompt, out in zip(panes, prompts, outputs):
        pane["ids"] = prompt + out.token_ids
        pane["messages"].append({"role": "assistant", "content": out.text})
    return {
        "prompt_tokens": [len(p) for p in prompts],
        "cached_prompt_tokens": [o.metrics.cached_prompt_tokens for o in outputs],
        "computed": computed,
        "ttft_max_s": round(max(o.metrics.time_to_first_token for o in outputs), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--panes", type=int, default=3)
    parser.add_argument("--questions", type=int, default=5, choices=range(2, len(QUESTIONS) + 1))
    parser.add_argument("--doc-tokens", type=int, default=6000)
    parser.add_argument("--reply-tokens", type=int, default=32)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    load_at_start = load_average()
    with Engine("default", device=args.device, dtype=args.dtype) as engine, \
            tempfile.TemporaryDirectory() as folder:
        engine.generate("Hello", max_tokens=4)  # warm-up
        document = write_report(args.doc_tokens, engine, Path(folder))
        doc_tokens = len(engine.tokenizer.encode(user_message_with_documents("", [document])))
        needed = doc_tokens + args.questions * (len(QUESTIONS[0]) // 3 + args.reply_tokens + 16)
        if needed > engine.max_context:
            sys.exit(f"the default model's context is {engine.max_context} tokens; this run needs about "
                     f"{needed}: pass a smaller --doc-tokens")
        engine.reset_prefix_cache()
        panes = [{"messages": [], "ids": [], "seed": 1000 + i} for i in range(args.panes)]
        turns = []
        for i, question in enumerate(QUESTIONS[:args.questions]):
            turns.append(ask_all(engine, panes, question, document if i == 0 else None, args.reply_tokens))
            print(f"question {i + 1}: {turns[-1]}", file=sys.stderr, flush=True)
        question_tokens = sum(len(engine.tokenizer.encode(q)) for q in QUESTIONS[:args.questions])
        max_context = engine.max_context
        weights = engine.stats().weights
    computed = sum(t["computed"] for t in turns)  # type: ignore[misc]
    baseline = doc_tokens + args.panes * question_tokens
    first_ttft = turns[0]["ttft_max_s"]
    follow_ratios = [round(t["ttft_max_s"] / first_ttft, 4) for t in turns[1:]]  # type: ignore[operator]
    result = {
        "panes": args.panes,
        "questions": args.questions,
        "document_tokens": doc_tokens,
        "document_chars": len(document.text),
        "max_context": max_context,
        "question_tokens": question_tokens,
        "prompt_tokens_sent": sum(sum(t["prompt_tokens"]) for t in turns),  # type: ignore[misc]
        "prompt_tokens_computed": computed,
        "computed_vs_document_and_questions": round(computed / baseline, 3),
        "turns": turns,
        "first_ttft_s": first_ttft,
        "follow_up_ttft_ratio": follow_ratios,
        "weights": weights,
        "load_average": {"start": load_at_start, "end": load_average()},
        "machine": machine(),
    }
    result["goals"] = {
        "computed <= 1.2x document + questions": result["computed_vs_document_and_questions"] <= 1.2,
        "questions 2-5 TTFT <= 0.15x the first's": max(follow_ratios) <= 0.15,
    }
    print(json.dumps(result))
    print(f"{doc_tokens}-token document, {args.panes} panes, {args.questions} questions: "
          f"computed {computed} prompt tokens of {result['prompt_tokens_sent']} sent = "
          f"{result['computed_vs_document_and_questions']}x the document plus the questions (goal <= 1.2x); "
          f"follow-up TTFT {follow_ratios} of the first's {first_ttft} s (goal <= 0.15x)\n"
          f"{machine_line(result['machine'])}", file=sys.stderr)


if __name__ == "__main__":
    main()
