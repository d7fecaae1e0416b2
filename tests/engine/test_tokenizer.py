"""engine.model.tokenizer against transformers, on tokenizer folders built here (no hub)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pytest
import tokenizers
from jinja2.exceptions import SecurityError
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from engine.errors import PromptError, TokenizerError
from engine.model.tokenizer import Tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello there!",
    "system user assistant: You are a helpful assistant. What is 2+2? It is 4.",
    "😀😃 中文字符 café naïve Ünïcödé",
]

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# SmolLM2-135M-Instruct's template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Meta-Llama-3-8B-Instruct's template: it writes bos_token itself.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Mistral-7B-Instruct-v0.1's template: it rejects a conversation whose roles do not alternate.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# Exercises what transformers adds to Jinja: tojson, strftime_now, loop controls, namespace, {% generation %}.
FEATURES_TEMPLATE = (
    "{% set ns = namespace(count=0) %}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% continue %}{% endif %}{% set ns.count = ns.count + 1 %}"
    "{% generation %}{{ message | tojson }}{% endgeneration %}\n"
    "{% if ns.count == 3 %}{% break %}{% endif %}{% endfor %}"
    "{{ ns.count }} turns, {{ strftime_now('%Y') }}, {{ {'b': 1, 'a': '<é>'} | tojson(indent=1) }}"
    "{% if tools is none and documents is none %} no tools{% endif %}"
    "{% if add_generation_prompt %}\nassistant:{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the fox jump? It was quick."},
        {"role": "user", "content": "Another one"},
    ],
    [
        {"role": "user", "content": "Ünïcödé 😀 中文字符 e\u0301 👨‍👩‍👧"},
        {"role": "assistant", "content": "👍🏽 très bien"},
        {"role": "user", "content": "  spaces\n\nand\ttabs  "},
    ],
]
ALTERNATING_CONVERSATIONS = [c for c in CONVERSATIONS if c[0]["role"] == "user"]


def train_byte_level_bpe(special_tokens: Sequence[str], vocab_size: int = 400) -> tokenizers.Tokenizer:
    """A GPT-2 style byte-level BPE; characters absent from CORPUS split into single-byte tokens."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 10, trainer)
    return backend


def train_sentencepiece_bpe() -> tokenizers.Tokenizer:
    """A Llama-2 style tokenizer: "▁" for spaces, byte fallback, a decoder that drops the first leading space."""
    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(
        vocab_size=250, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60, show_progress=False
    )
    backend.train_from_iterator(CORPUS[:2] * 10, trainer)
    # BpeTrainer knows no byte fallback; add the <0xXX> tokens the way SentencePiece models have them.
    spec = json.loads(backend.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = json.loads(
        decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        ).__getstate__()
    )
    spec["post_processor"] = json.loads(
        processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]).__getstate__()
    )
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def write_model_folder(
    folder: Path,
    backend: tokenizers.Tokenizer,
    tokenizer_config: Mapping[str, Any] | None = None,
    files: Mapping[str, Mapping[str, Any] | str] | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    for name, content in (files or {}).items():
        text = content if isinstance(content, str) else json.dumps(content)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def chatml_config(**overrides: Any) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
        **overrides,
    }


def llama3_backend() -> tokenizers.Tokenizer:
    backend = train_byte_level_bpe(LLAMA3_SPECIALS)
    bos = "<|begin_of_text|>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))]
    )
    return backend


@pytest.fixture(scope="module")
def chatml_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_folder(
        tmp_path_factory.mktemp("chatml"), train_byte_level_bpe(CHATML_SPECIALS), chatml_config()
    )


@pytest.fixture(scope="module")
def llama3_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "chat_template": LLAMA3_TEMPLATE,
    }
    return write_model_folder(tmp_path_factory.mktemp("llama3"), llama3_backend(), config)


@pytest.fixture(scope="module")
def mistral_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "chat_template": MISTRAL_TEMPLATE,
    }
    return write_model_folder(tmp_path_factory.mktemp("mistral"), train_sentencepiece_bpe(), config)


def reference(folder: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)


def special_id(tokenizer: Tokenizer, token: str) -> int:
    (token_id,) = tokenizer.encode(token)
    assert tokenizer.is_special(token_id)
    return token_id


# --- chat templates against transformers -------------------------------------------------------


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("folder_fixture", ["chatml_folder", "llama3_folder"])
def test_chat_matches_transformers(
    request: pytest.FixtureRequest, folder_fixture: str, conversation: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    folder = request.getfixturevalue(folder_fixture)
    tokenizer, hf = Tokenizer.from_folder(folder), reference(folder)

    text = tokenizer.render_chat(conversation, add_generation_prompt=add_generation_prompt)
    ids = tokenizer.encode_chat(conversation, add_generation_prompt=add_generation_prompt)

    assert tokenizer.has_chat_template
    assert text == hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ids == hf.apply_chat_template(
        conversation, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
    )
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("conversation", ALTERNATING_CONVERSATIONS)
def test_sentencepiece_chat_matches_transformers(mistral_folder: Path, conversation: list[dict[str, str]]) -> None:
    tokenizer, hf = Tokenizer.from_folder(mistral_folder), reference(mistral_folder)

    ids = tokenizer.encode_chat(conversation, add_generation_prompt=False)

    assert tokenizer.render_chat(conversation, add_generation_prompt=False) == hf.apply_chat_template(
        conversation, tokenize=False
    )
    assert ids == hf.apply_chat_template(conversation, tokenize=True, return_dict=False)
    assert ids.count(tokenizer.bos_token_id) == 1


def test_template_features_render_like_transformers(tmp_path: Path) -> None:
    folder = write_model_folder(
        tmp_path, train_byte_level_bpe(CHATML_SPECIALS), chatml_config(chat_template=FEATURES_TEMPLATE)
    )
    tokenizer, hf = Tokenizer.from_folder(folder), reference(folder)

    for conversation in CONVERSATIONS:
        text = tokenizer.render_chat(conversation)
        assert text == hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert "Ünïcödé 😀 中文字符" in tokenizer.render_chat(CONVERSATIONS[3])  # tojson keeps non-ASCII
    assert "3 turns" in tokenizer.render_chat(CONVERSATIONS[2])  # {% break %} after three


def test_special_token_strings_are_template_variables(tmp_path: Path) -> None:
    config = chatml_config(
        pad_token={"content": "<|endoftext|>", "special": True},
        chat_template="{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}",
    )
    tokenizer = Tokenizer.from_folder(write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), config))

    assert tokenizer.render_chat(CONVERSATIONS[0]) == "<|im_start|>|<|im_end|>|<|endoftext|>|<|endoftext|>"


def test_role_error_of_template_is_a_prompt_error(mistral_folder: Path) -> None:
    tokenizer, hf = Tokenizer.from_folder(mistral_folder), reference(mistral_folder)
    conversation = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi again"}]

    with pytest.raises(PromptError, match="Conversation roles must alternate user/assistant"):
        tokenizer.encode_chat(conversation)
    with pytest.raises(jinja2.TemplateError, match="Conversation roles must alternate user/assistant"):
        hf.apply_chat_template(conversation, tokenize=False)


def test_empty_conversation_is_a_prompt_error(chatml_folder: Path) -> None:
    tokenizer = Tokenizer.from_folder(chatml_folder)

    with pytest.raises(PromptError, match="at least one message"):
        tokenizer.render_chat([])
    with pytest.raises(PromptError):
        tokenizer.encode_chat([])


# --- the sandbox -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
    ],
)
def test_unsafe_template_is_refused_at_load(tmp_path: Path, template: str) -> None:
    folder = write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), chatml_config(chat_template=template))

    with pytest.raises(TokenizerError, match="sandbox forbids") as raised:
        Tokenizer.from_folder(folder)
    assert isinstance(raised.value.__cause__, SecurityError)


def test_unsafe_branch_of_template_is_refused_when_reached(tmp_path: Path) -> None:
    # A branch no load-time probe reaches (they send "Hi" and "Tandem probe ..." texts).
    template = "{% if messages[-1]['content'] == 'U' %}{{ messages.pop() }}{% endif %}" + CHATML_TEMPLATE
    folder = write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), chatml_config(chat_template=template))
    tokenizer = Tokenizer.from_folder(folder)
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

    assert tokenizer.render_chat(CONVERSATIONS[0]).startswith("<|im_start|>system")
    with pytest.raises(TokenizerError, match="sandbox forbids") as raised:
        tokenizer.render_chat(conversation)
    assert isinstance(raised.value.__cause__, SecurityError)
    assert len(conversation) == 2


def test_template_with_syntax_error_is_refused_at_load(tmp_path: Path) -> None:
    template = "{% for message in messages %}{{ message['content'] }}"
    folder = write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), chatml_config(chat_template=template))

    with pytest.raises(TokenizerError, match="not valid Jinja"):
        Tokenizer.from_folder(folder)


def test_template_that_crashes_is_refused_at_load(tmp_path: Path) -> None:
    template = "{{ messages[0]['content'] + 1 }}"
    folder = write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), chatml_config(chat_template=template))

    with pytest.raises(TokenizerError, match="failed"):
        Tokenizer.from_folder(folder)


def test_template_that_rejects_the_end_of_turn_probe_still_loads(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('A system message must come first') }}"
        "{% endif %}" + CHATML_TEMPLATE
    )
    config = chatml_config(chat_template=template, eos_token="<|endoftext|>")
    tokenizer = Tokenizer.from_folder(write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), config))

    assert tokenizer.eos_token_ids == {special_id(tokenizer, "<|endoftext|>")}
    assert tokenizer.render_chat(CONVERSATIONS[1]).startswith("<|im_start|>system\nYou are terse.")
    with pytest.raises(PromptError, match="A system message must come first"):
        tokenizer.render_chat(CONVERSATIONS[0])


# --- where the chat template comes from --------------------------------------------------------


def test_without_template_chatml_is_used(tmp_path: Path) -> None:
    config = chatml_config()
    del config["chat_template"]
    tokenizer = Tokenizer.from_folder(write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), config))

    assert not tokenizer.has_chat_template
    assert tokenizer.render_chat(CONVERSATIONS[1]) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.render_chat(CONVERSATIONS[0], add_generation_prompt=False) == (
        "<|im_start|>user\nHello!<|im_end|>\n"
    )


def test_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    folder = write_model_folder(
        tmp_path,
        train_byte_level_bpe(CHATML_SPECIALS),
        chatml_config(),
        {"chat_template.jinja": "from the jinja file", "chat_template.json": {"chat_template": "from json"}},
    )

    assert Tokenizer.from_folder(folder).render_chat(CONVERSATIONS[0]) == "from the jinja file"


def test_chat_template_json_is_the_last_resort(tmp_path: Path) -> None:
    config = chatml_config()
    del config["chat_template"]
    folder = write_model_folder(
        tmp_path, train_byte_level_bpe(CHATML_SPECIALS), config, {"chat_template.json": {"chat_template": "json"}}
    )

    assert Tokenizer.from_folder(folder).render_chat(CONVERSATIONS[0]) == "json"


def test_named_chat_templates_use_the_default(tmp_path: Path) -> None:
    templates = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default"}]
    folder = write_model_folder(
        tmp_path, train_byte_level_bpe(CHATML_SPECIALS), chatml_config(chat_template=templates)
    )

    assert Tokenizer.from_folder(folder).render_chat(CONVERSATIONS[0]) == "default"


# --- end of generation -------------------------------------------------------------------------


def test_eos_ids_gather_configs_and_end_of_turn_token(tmp_path: Path) -> None:
    folder = write_model_folder(
        tmp_path,
        train_byte_level_bpe(CHATML_SPECIALS),
        chatml_config(eos_token="<|endoftext|>"),
        {"config.json": {"eos_token_id": 17}, "generation_config.json": {"eos_token_id": [0, 18]}},
    )
    tokenizer = Tokenizer.from_folder(folder)

    assert tokenizer.eos_token_ids == {
        special_id(tokenizer, "<|endoftext|>"),
        special_id(tokenizer, "<|im_end|>"),  # only the chat template names it
        17,
        18,
    }


def test_llama3_eos_ids_include_eot(llama3_folder: Path) -> None:
    tokenizer = Tokenizer.from_folder(llama3_folder)

    assert tokenizer.eos_token_ids == {
        special_id(tokenizer, "<|end_of_text|>"),
        special_id(tokenizer, "<|eot_id|>"),
    }


def test_end_of_turn_must_be_a_special_token(tmp_path: Path) -> None:
    # Neither "<|im_end|>" (absent from this vocabulary) nor plain text ends a turn.
    config = {"eos_token": "</s>", "chat_template": "{% for m in messages %}{{ m['content'] }}\n\n{% endfor %}"}
    folder = write_model_folder(tmp_path / "plain", train_byte_level_bpe(["</s>"]), config)
    no_template = dict(config)
    del no_template["chat_template"]
    fallback_folder = write_model_folder(tmp_path / "fallback", train_byte_level_bpe(["</s>"]), no_template)

    for tokenizer in (Tokenizer.from_folder(folder), Tokenizer.from_folder(fallback_folder)):
        assert tokenizer.eos_token_ids == {special_id(tokenizer, "</s>")}


# --- BOS ---------------------------------------------------------------------------------------


def test_bos_follows_the_tokenizer_post_processor(llama3_folder: Path, chatml_folder: Path) -> None:
    for folder in (llama3_folder, chatml_folder):
        tokenizer, hf = Tokenizer.from_folder(folder), reference(folder)
        for text in ("Hello world", "😀 <|eot_id|> x", ""):
            assert tokenizer.encode(text, add_special_tokens=True) == hf.encode(text, add_special_tokens=True)
            assert tokenizer.encode(text) == hf.encode(text, add_special_tokens=False)

    llama3 = Tokenizer.from_folder(llama3_folder)
    assert llama3.bos_token_id == special_id(llama3, "<|begin_of_text|>")
    assert llama3.encode("Hi", add_special_tokens=True)[0] == llama3.bos_token_id
    assert llama3.encode("Hi")[:1] != [llama3.bos_token_id]


def test_bos_is_not_doubled_when_the_template_writes_it(llama3_folder: Path) -> None:
    tokenizer = Tokenizer.from_folder(llama3_folder)

    ids = tokenizer.encode_chat(CONVERSATIONS[2])

    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1


def test_bos_is_added_when_the_model_wants_it_and_the_template_omits_it(tmp_path: Path) -> None:
    config = chatml_config(bos_token="<|endoftext|>", add_bos_token=True)
    folder = write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), config)
    tokenizer, hf = Tokenizer.from_folder(folder), reference(folder)

    ids = tokenizer.encode_chat(CONVERSATIONS[1])

    # transformers leaves BOS out here; llama.cpp, like Tandem, adds it.
    reference_ids = hf.apply_chat_template(
        CONVERSATIONS[1], tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert ids == [tokenizer.bos_token_id, *reference_ids]
    assert tokenizer.encode("Hi", add_special_tokens=True) == [tokenizer.bos_token_id, *tokenizer.encode("Hi")]


def test_explicit_add_bos_token_false_wins_over_post_processor(tmp_path: Path) -> None:
    config = {"bos_token": "<|begin_of_text|>", "add_bos_token": False, "chat_template": CHATML_TEMPLATE}
    tokenizer = Tokenizer.from_folder(write_model_folder(tmp_path, llama3_backend(), config))

    assert tokenizer.encode("Hi", add_special_tokens=True) == tokenizer.encode("Hi")
    assert tokenizer.bos_token_id not in tokenizer.encode_chat(CONVERSATIONS[0])


def test_no_bos_token(tmp_path: Path) -> None:
    config = chatml_config()
    del config["bos_token"]
    tokenizer = Tokenizer.from_folder(write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS), config))

    assert tokenizer.bos_token_id is None
    assert tokenizer.encode("Hi", add_special_tokens=True) == tokenizer.encode("Hi")


# --- ids <-> text ------------------------------------------------------------------------------


def test_decode_and_special_tokens_match_transformers(chatml_folder: Path) -> None:
    tokenizer, hf = Tokenizer.from_folder(chatml_folder), reference(chatml_folder)
    ids = tokenizer.encode_chat(CONVERSATIONS[3])

    assert tokenizer.vocab_size == len(hf)
    assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tokenizer.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
    assert {i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)} == {
        special_id(tokenizer, token) for token in CHATML_SPECIALS
    }
    assert "<|im_end|>" not in tokenizer.decode(ids)


def test_training_time_truncation_in_tokenizer_json_is_ignored(tmp_path: Path) -> None:
    backend = train_byte_level_bpe(CHATML_SPECIALS)
    backend.enable_truncation(max_length=4)
    tokenizer = Tokenizer.from_folder(write_model_folder(tmp_path, backend, chatml_config()))

    assert len(tokenizer.encode(CORPUS[0])) > 4


# --- broken folders ----------------------------------------------------------------------------


def test_missing_tokenizer_json_names_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "some model"
    folder.mkdir()

    with pytest.raises(TokenizerError, match="tokenizer.json") as raised:
        Tokenizer.from_folder(folder)
    assert str(folder) in str(raised.value)


def test_corrupt_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 3}}', encoding="utf-8")

    with pytest.raises(TokenizerError, match="cannot be read") as raised:
        Tokenizer.from_folder(tmp_path)
    assert str(tmp_path / "tokenizer.json") in str(raised.value)


def test_corrupt_tokenizer_config(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path, train_byte_level_bpe(CHATML_SPECIALS))
    (folder / "tokenizer_config.json").write_text("{not json", encoding="utf-8")

    with pytest.raises(TokenizerError, match="tokenizer_config.json"):
        Tokenizer.from_folder(folder)


def test_next_turn_keeps_generated_ids(chatml_folder: Path) -> None:
    tokenizer = Tokenizer.from_folder(chatml_folder)
    question = [{"role": "user", "content": "Hello there"}]
    prompt = tokenizer.encode_chat(question)
    # A reply whose ids are not what encoding its text gives: one id per
    # character, as a sampler may well produce.
    reply_ids = [i for ch in "Hello world" for i in tokenizer.encode(ch)]
    assert reply_ids != tokenizer.encode("Hello world")
    end_of_turn = sorted(tokenizer.eos_token_ids)[0]
    history = prompt + reply_ids + [end_of_turn]
    messages = question + [
        {"role": "assistant", "content": "Hello world"},
        {"role": "user", "content": "And again"},
    ]
    ids = tokenizer.encode_next_turn(history, messages)
    assert ids[: len(history)] == history
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.render_chat(messages)
    assert ids != tokenizer.encode_chat(messages)


def test_next_turn_renders_afresh_when_history_is_not_a_prefix(chatml_folder: Path) -> None:
    tokenizer = Tokenizer.from_folder(chatml_folder)
    other = tokenizer.encode_chat([{"role": "user", "content": "Something else entirely"}])
    messages = [{"role": "user", "content": "Hello there"}]
    assert tokenizer.encode_next_turn(other, messages) == tokenizer.encode_chat(messages)
    assert tokenizer.encode_next_turn([], messages) == tokenizer.encode_chat(messages)
