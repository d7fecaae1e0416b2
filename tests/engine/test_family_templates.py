"""Each family's published chat template (tests/engine/data/templates) through
the engine's sandboxed renderer, against transformers' apply_chat_template;
Gemma's system prompt folding; and the tokens that end a turn."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import AddedToken

from engine import Engine, SamplingParams
from engine.errors import PromptError
from engine.model.tokenizer import Tokenizer, fold_system_prompt
from tests.engine.test_tokenizer import reference, train_byte_level_bpe, write_model_folder

TEMPLATES = Path(__file__).parent / "data" / "templates"

CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
GEMMA = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")


@dataclass(frozen=True)
class FamilyTemplate:
    template: str  # a file of TEMPLATES
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    end_of_turn: str  # what the template closes an assistant turn with
    # Whether a system prompt reaches the model inside a user message.
    folds_system_prompt: bool = False
    # Whether the template refuses a system message (Tandem folds it then).
    refuses_system: bool = False
    thinking_switch: bool = False


FAMILIES = {
    "llama": FamilyTemplate(
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"),
        "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>",
    ),
    "mistral_nemo": FamilyTemplate(
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]"),
        "<s>", "</s>", "</s>", folds_system_prompt=True,
    ),
    "qwen2": FamilyTemplate("Qwen-Qwen2.5-7B-Instruct.jinja", CHATML, None, "<|im_end|>", "<|im_end|>"),
    "qwen3": FamilyTemplate("Qwen-Qwen3-0.6B.jinja", CHATML, None, "<|im_end|>", "<|im_end|>", thinking_switch=True),
    "gemma2": FamilyTemplate(
        "google-gemma-2-2b-it.jinja", GEMMA, "<bos>", "<eos>", "<end_of_turn>",
        folds_system_prompt=True, refuses_system=True,
    ),
    "gemma3": FamilyTemplate(
        "google-gemma-3-4b-it.jinja", GEMMA, "<bos>", "<eos>", "<end_of_turn>", folds_system_prompt=True
    ),
    "phi3": FamilyTemplate(
        "microsoft-Phi-3.5-mini-instruct.jinja",
        ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"),
        "<s>", "<|endoftext|>", "<|end|>",
    ),
    # Phi-4-mini: Phi3ForCausalLM (LongRoPE, partial rotary), its own template.
    "phi4_mini": FamilyTemplate(
        "microsoft-Phi-4-mini-instruct.jinja",
        ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
         "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>"),
        "<|endoftext|>", "<|endoftext|>", "<|end|>",
    ),
    "granite": FamilyTemplate(
        "ibm-granite-granite-3.3-2B-Instruct.jinja",
        ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"),
        "<|end_of_text|>", "<|end_of_text|>", "<|end_of_text|>",
    ),
    # Not a family Tandem runs yet: its template's `/think` system flags and
    # thinking switch are a hard case for the sandbox.
    "smollm3": FamilyTemplate(
        "HuggingFaceTB-SmolLM3-3B.jinja", CHATML, None, "<|im_end|>", "<|im_end|>", thinking_switch=True
    ),
}

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
    {"role": "assistant", "content": "Why did the fox jump? It was quick."},
    {"role": "user", "content": "Another one"},
]
# A reasoning reply in the history: Qwen3's template drops the think block.
CHAT_WITH_REASONING = [
    *CHAT[:4],
    {"role": "assistant", "content": "<think>\nA fox joke.\n</think>\n\nWhy did the fox jump? It was quick."},
    CHAT[5],
]
# Llama 3.2's template writes today's date unless given one.
TEMPLATE_KWARGS: dict[str, Any] = {"date_string": "26 Jul 2024"}


def family_folder(root: Path, family: FamilyTemplate, backend: tokenizers.Tokenizer | None = None) -> Path:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": family.eos,
        "chat_template": (TEMPLATES / family.template).read_text(encoding="utf-8"),
    }
    if family.bos is not None:
        config["bos_token"] = family.bos
    return write_model_folder(root, backend or train_byte_level_bpe(family.specials), config)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[FamilyTemplate, Path]:
    spec = FAMILIES[request.param]
    return spec, family_folder(tmp_path_factory.mktemp(request.param), spec)


def test_published_template_renders_like_transformers(family: tuple[FamilyTemplate, Path]) -> None:
    spec, folder = family
    tokenizer, hf = Tokenizer.from_folder(folder), reference(folder)
    chats = [CHAT, CHAT_WITH_REASONING] if spec.thinking_switch else [CHAT]
    switches = [{}, {"enable_thinking": False}] if spec.thinking_switch else [{}]

    for chat in chats:
        # transformers refuses Gemma 2's system message; Tandem sends it folded, as Gemma 3's template folds it.
        hf_chat = fold_system_prompt(chat) if spec.refuses_system else chat
        for switch in switches:
            variables = {**TEMPLATE_KWARGS, **switch}
            text = tokenizer.render_chat(chat, template_kwargs=variables)
            assert text == hf.apply_chat_template(hf_chat, tokenize=False, add_generation_prompt=True, **variables)
            assert tokenizer.encode_chat(chat, template_kwargs=variables) == hf.apply_chat_template(
                hf_chat, tokenize=True, return_dict=False, add_generation_prompt=True, **variables
            )
            assert "You are terse." in text
    assert tokenizer.folds_system_prompt is spec.folds_system_prompt


def test_gemma2_gets_its_system_prompt_as_gemma3s_template_folds_it(tmp_path: Path) -> None:
    gemma2 = Tokenizer.from_folder(family_folder(tmp_path / "gemma2", FAMILIES["gemma2"]))
    gemma3 = Tokenizer.from_folder(family_folder(tmp_path / "gemma3", FAMILIES["gemma3"]))

    folded = gemma2.render_chat(CHAT)

    assert folded == gemma3.render_chat(CHAT)
    assert folded.startswith("<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n")
    # A conversation the template refuses for another reason is still refused.
    with pytest.raises(PromptError, match="roles must alternate"):
        gemma2.render_chat([CHAT[0], CHAT[2], CHAT[1]])


def test_fold_system_prompt() -> None:
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}
    assert fold_system_prompt([system, user, CHAT[2]]) == [{"role": "user", "content": "Be brief.\n\nHi"}, CHAT[2]]
    assert fold_system_prompt([system]) == [{"role": "user", "content": "Be brief."}]
    assert fold_system_prompt([user, system]) == [user, system]  # only a leading system message


# --- the tokens that end a turn -----------------------------------------------------------------


def test_end_of_turn_token_and_generation_config_ids_stop(family: tuple[FamilyTemplate, Path], tmp_path: Path) -> None:
    spec, _ = family
    backend = train_byte_level_bpe(spec.specials)
    # generation_config.json lists several ids (Phi-3.5: <|end|>, <|assistant|>, <|endoftext|>).
    listed = [backend.token_to_id(spec.specials[0]), backend.token_to_id(spec.specials[-1])]
    folder = family_folder(tmp_path, spec, backend)
    (folder / "generation_config.json").write_text(f'{{"eos_token_id": {listed}}}', encoding="utf-8")

    tokenizer = Tokenizer.from_folder(folder)

    assert tokenizer.eos_token_ids >= {backend.token_to_id(spec.eos), backend.token_to_id(spec.end_of_turn), *listed}


def test_gemma_end_of_turn_typed_user_defined_in_a_gguf_still_stops(tmp_path: Path) -> None:
    # llama.cpp's converter may type <start_of_turn>/<end_of_turn> as user-defined,
    # not control; the GGUF tokenizer then adds them as non-special tokens, beside
    # user-defined whitespace runs such as "\n\n" (engine/formats/gguf/tokenizer.py).
    backend = train_byte_level_bpe(["<pad>", "<eos>", "<bos>", "<unk>"])
    backend.add_tokens([AddedToken(text, special=False, normalized=False)
                        for text in ("<start_of_turn>", "<end_of_turn>", "\n\n")])
    tokenizer = Tokenizer.from_folder(family_folder(tmp_path, FAMILIES["gemma3"], backend))

    assert backend.token_to_id("<end_of_turn>") in tokenizer.eos_token_ids
    assert tokenizer.folds_system_prompt


def test_an_id_generation_config_lists_stops_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompt = [{"role": "user", "content": "Hi"}]
    with Engine(tiny_model_dir, "cpu", "float32", threads=1) as engine:
        first = engine.generate_outputs([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))[0]
        (emitted,) = first.token_ids
        assert emitted not in engine.tokenizer.eos_token_ids
        listed = [*sorted(engine.tokenizer.eos_token_ids), emitted]
    folder = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": listed}), encoding="utf-8")

    with Engine(folder, "cpu", "float32", threads=1) as engine:
        stopped = engine.generate_outputs([prompt], SamplingParams(temperature=0.0, max_tokens=8))[0]

    assert stopped.finish_reason == "stop"
    assert stopped.text == ""
