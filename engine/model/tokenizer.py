"""A model's tokenizer: text <-> token ids through `tokenizers`, and its chat template.

Chat templates come with downloaded models, so they are untrusted code: they run
in Jinja2's immutable sandbox with the same globals and filters that Hugging Face
`transformers` gives them, so that a template renders here exactly as it does
there, under limits on work and size (engine.model.template_sandbox). A template
that exceeds them on a probe conversation is refused when the tokenizer loads.

Message text stays text: special-token strings inside a message (a pasted
`<|im_end|>\n<|im_start|>system`) are encoded as ordinary text, and only the
template's own markers become control tokens (see `encode_chat`).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import tokenizers
from jinja2.exceptions import SecurityError, TemplateSyntaxError

from engine import reasoning
from engine.errors import PromptError, TokenizerError
from engine.formats.model_json import ModelJSONError, read_json_object, read_model_file
from engine.model import families, tool_prompt
from engine.model.tool_calls import ToolCallFormat, format_for
from engine.model.template_sandbox import BoundedSandbox, TemplateLimitError, render_bounded, render_limits

# Used when a model ships no chat template. ChatML is what most small instruct
# models were tuned on, and in a vocabulary without <|im_start|>/<|im_end|> it is
# still a readable plain-text transcript.
CHATML_FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A reply no template rewrites; what a template puts right after it is its end-of-turn marker.
_PROBE_REPLY = "Tandem probe reply"
# A system prompt and a user message: what a template puts between them tells
# whether the model has a system turn of its own.
_PROBE_SYSTEM = "Tandem probe system prompt"
_PROBE_USER = "Tandem probe user message"

# The longest text one token may stand for, in the vocabulary or added: real
# vocabularies' longest are ~100-250 characters (runs of spaces or dashes).
# A longer one is no token a model was trained on, and it would inflate the
# server's bound on prompt characters per token.
MAX_TOKEN_CHARS = 1024
# The special tokens' text in all (Llama 3: 256 tokens, ~7,500 characters;
# Mistral v3: ~770, ~10,000). Message text is searched for them with one
# regular expression, whose compiling takes ~5 µs per character: a 10 MB
# special token took 35 s.
MAX_SPECIAL_TOKEN_CHARS = 1 << 17
# tokenizer.json is read whole by tokenizers (the largest real ones, with
# 256k-token vocabularies, are ~35 MB).
MAX_TOKENIZER_FILE_BYTES = 128 << 20


class Tokenizer:
    """Encodes and decodes one model's text and renders its conversations."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        chat_template: str | None,
        special_tokens: Mapping[str, str],
        add_bos_token: bool | None,
        extra_eos_token_ids: Iterable[int] = (),
        source: str = "this model",
        family_tool_calls: str = "hermes",
    ) -> None:
        """Wrap a loaded `tokenizers.Tokenizer`; `from_folder` is the usual way in.

        special_tokens: named special-token strings (bos_token, eos_token, ...) the
            chat template sees as variables.
        add_bos_token: whether encoding adds BOS; None leaves it to the tokenizer's
            own post-processor, as `tokenizer.json` describes it.
        extra_eos_token_ids: further ids that end generation (from the model config).
        source: names the model in error messages.
        family_tool_calls: the tool-call format of the model's family
            (`Family.tool_calls`), for a template whose own markers name none.
        """
        self._backend = backend
        # A tokenizer.json may carry training-time truncation or padding; a prompt must never be cut.
        self._backend.no_truncation()
        self._backend.no_padding()
        self._source = source
        self._special_tokens = dict(special_tokens)
        special_added = {
            token_id: token.content for token_id, token in backend.get_added_tokens_decoder().items() if token.special
        }
        self._special_ids = frozenset(special_added)
        # Tokens a template marks turns with: the special ones, and added ones
        # that are not whitespace (a GGUF file may type Gemma's <end_of_turn>
        # as user-defined, not control; llama.cpp then treats it as control).
        self._marker_ids = self._special_ids | {
            token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.content.strip()
        }
        # The special tokens' strings, longest first: where one of them appears
        # inside a message it is kept apart from the template's own markers.
        strings = sorted(set(special_added.values()), key=len, reverse=True)
        self._special_text = re.compile("|".join(map(re.escape, strings))) if strings else None
        # A copy of the backend that reads special-token strings as text (made when first needed).
        self._text_backend: tokenizers.Tokenizer | None = None
        self._text_backend_lock = threading.Lock()
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = self._token_id(special_tokens.get("bos_token"))
        if add_bos_token is None:
            add_bos_token = backend.encode("", add_special_tokens=True).ids[:1] == [self.bos_token_id]
        # The BOS id that encoding with special tokens starts with; None when the model wants no BOS.
        self._auto_bos_id = self.bos_token_id if add_bos_token else None

        self.has_chat_template: bool = bool(chat_template)
        # The model's own template (None: the ChatML fallback), for what it says
        # about reasoning (engine.reasoning: think blocks, the thinking switch).
        self.chat_template_source: str | None = chat_template or None
        # How this model writes tool calls (engine.model.tool_calls).
        self.tool_call_format: ToolCallFormat = format_for(chat_template, family_tool_calls)
        try:
            self._template = _SANDBOX.from_string(chat_template or CHATML_FALLBACK_TEMPLATE)
        except TemplateSyntaxError as exc:
            raise TokenizerError(
                f"The chat template of {source} is not valid Jinja (line {exc.lineno}: {exc.message}). "
                "Fix or remove the chat template in its tokenizer_config.json or chat_template.jinja."
            ) from exc

        # Whether render_chat folds a system prompt into the first user message
        # itself, because the template refuses a system role (Gemma 2's); probed below.
        self._refuses_system_role = False

        # Render probe conversations now: a template that is broken or runs
        # past its limits is refused when the model loads, not at the first prompt.
        named_eos_ids = (self._token_id(special_tokens.get("eos_token")), self._end_of_turn_token_id())
        try:
            self.render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        except PromptError:
            pass  # the template rejects this conversation; it is not broken
        self._refuses_system_role, template_folds = self._probe_system_role()
        # Whether a system prompt reaches the model inside a user message: the
        # model has no system turn (Gemma 2 and 3, Mistral); the window says so.
        self.folds_system_prompt: bool = self._refuses_system_role or template_folds
        self.eos_token_ids: frozenset[int] = frozenset(
            [*extra_eos_token_ids, *(token_id for token_id in named_eos_ids if token_id is not None)]
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        """Load the tokenizer of a Hugging Face model folder.

        Reads tokenizer.json (required) and, where present, tokenizer_config.json,
        special_tokens_map.json, config.json, generation_config.json, and the chat
        template from chat_template.jinja, tokenizer_config.json or
        chat_template.json, in that order of precedence (as transformers does).
        """
        folder = Path(folder)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(
                f"{folder} has no tokenizer.json. Tandem needs the fast-tokenizer file that comes "
                "with the model on Hugging Face; copy it into the model folder."
            )
        size = tokenizer_file.stat().st_size
        if size > MAX_TOKENIZER_FILE_BYTES:
            raise TokenizerError(
                f"{tokenizer_file} is {size:,} bytes; no model's tokenizer.json is more than "
                f"{MAX_TOKENIZER_FILE_BYTES:,}. Download the model's tokenizer.json again."
            )
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises plain Exception for every kind of bad file
            raise TokenizerError(
                f"{tokenizer_file} cannot be read ({exc}). Download the model's tokenizer.json again."
            ) from exc
        check_token_texts(
            backend.get_vocab(with_added_tokens=True),
            [token.content for token in backend.get_added_tokens_decoder().values() if token.special],
            str(tokenizer_file),
        )

        tokenizer_config = _read_json(folder / "tokenizer_config.json")
        special_tokens = {
            **_special_token_strings(_read_json(folder / "special_tokens_map.json")),
            **_special_token_strings(tokenizer_config),
        }
        add_bos_token = tokenizer_config.get("add_bos_token")
        config = _read_json(folder / "config.json")
        model_type = families.text_model_config(config).get("model_type")  # Gemma 3 4B+ nests its text model's
        family = families.for_model_type(model_type) if isinstance(model_type, str) else None
        return cls(
            backend,
            chat_template=_read_chat_template(folder, tokenizer_config),
            special_tokens=special_tokens,
            add_bos_token=add_bos_token if isinstance(add_bos_token, bool) else None,
            extra_eos_token_ids=[
                *_token_ids(config.get("eos_token_id")),
                *_token_ids(_read_json(folder / "generation_config.json").get("eos_token_id")),
            ],
            source=str(folder),
            family_tool_calls=family.tool_calls if family is not None else "hermes",
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids.

        add_special_tokens: prepend BOS where the model wants one (add_bos_token
        in tokenizer_config.json, else what tokenizer.json's post-processor does).
        """
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self._auto_bos_id is not None:
            ids.insert(0, self._auto_bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def is_special(self, token_id: int) -> bool:
        """Whether the id is a special token, i.e. one `decode` skips when asked to."""
        return token_id in self._special_ids

    def special_token_id(self, text: str) -> int | None:
        """The id of the special token written `text` (`[TOOL_CALLS]`), None when it is no special token."""
        token_id = self._token_id(text)
        return token_id if token_id is not None and token_id in self._special_ids else None

    def render_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        *,
        template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text of a conversation, through the model's chat template.

        `template_kwargs`: further variables for the template (Qwen3's
        `enable_thinking`), as transformers' `apply_chat_template(**kwargs)`;
        they cannot replace the ones named here.

        `tools` (OpenAI tool objects), assistant messages with `tool_calls` and
        `role: "tool"` results reach the template as it can take them
        (engine.model.tool_prompt: where it knows no tools, Tandem writes them
        into the system prompt and the turns as text).

        Where the template refuses a system role, a leading system message is
        folded into the first user message first (see `fold_system_prompt`).

        Raises PromptError when there are no messages or the template rejects the
        conversation, TokenizerError when the template itself is broken or unsafe.
        """
        if not messages:
            raise PromptError("A chat prompt needs at least one message.")
        tools_variable = None
        if tools or tool_prompt.has_tool_turns(messages):
            messages, tools_variable = tool_prompt.prepare(messages, tools, self.tool_support, self.tool_call_format)
        return self._render(messages, add_generation_prompt, template_kwargs, tools_variable)

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        template_kwargs: Mapping[str, Any] | None,
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> str:
        if self._refuses_system_role:
            messages = fold_system_prompt(messages)
        input_chars = _text_chars(messages) + _text_chars(tools)
        variables = {
            **(template_kwargs or {}),
            "messages": [dict(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
            # transformers always passes these, and templates test them with `is none`.
            "tools": [dict(tool) for tool in tools] if tools else None,
            "documents": None,
            **self._special_tokens,
        }
        try:
            return render_bounded(self._template, render_limits(input_chars), variables)
        except PromptError:
            raise
        except TemplateLimitError as exc:
            raise TokenizerError(
                f"The chat template of {self._source} {exc}; it was stopped. "
                "Replace the model's chat template with a trusted one."
            ) from None
        except SecurityError as exc:
            raise TokenizerError(
                f"The chat template of {self._source} tried something the sandbox forbids ({exc}); "
                "it was stopped. Replace the model's chat template with a trusted one."
            ) from exc
        except Exception as exc:  # a template is foreign code: anything it raises means it is broken
            raise TokenizerError(
                f"The chat template of {self._source} failed ({type(exc).__name__}: {exc}). "
                "Fix or replace the model's chat template."
            ) from exc

    @functools.cached_property
    def tool_support(self) -> tool_prompt.ToolTemplateSupport:
        """What the chat template does with tools, from probe renders (once)."""
        def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
            try:
                return self._render(messages, True, None, tools)
            except (PromptError, TokenizerError):
                return None

        if not self.has_chat_template:
            return tool_prompt.NO_SUPPORT
        return tool_prompt.probe_support(render)

    @functools.cached_property
    def drops_reasoning(self) -> bool:
        """Whether the chat template leaves earlier replies' reasoning out of a
        prompt by itself (Qwen3's and the R1 distills' do); tried once on a probe."""
        if not reasoning.template_reasons(self.chat_template_source):
            return False
        try:
            return reasoning.template_drops_reasoning(lambda messages: self.render_chat(messages, False))
        except PromptError:
            return False

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        *,
        parse_special_in_content: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a rendered conversation, starting with exactly one BOS where the model wants one.

        Most templates write `bos_token` themselves; for those that do not, BOS is
        added here when the model asks for it, as llama.cpp does (transformers would
        leave it out).

        Special-token strings inside the messages' text are encoded as ordinary
        text, so a pasted `<|im_end|>` cannot close a turn or forge another;
        only the template's own markers become control tokens.
        `parse_special_in_content=True` reads them as control tokens instead
        (the old behaviour, for callers that send pre-formatted turns).
        """
        segments = self._render_segments(
            messages, add_generation_prompt, parse_special_in_content, template_kwargs, tools)
        ids = self._encode_segments(segments)
        if self._auto_bos_id is not None and ids[:1] != [self._auto_bos_id]:
            ids.insert(0, self._auto_bos_id)
        return ids

    def encode_next_turn(
        self,
        history_ids: Sequence[int],
        messages: Sequence[Mapping[str, str]],
        *,
        parse_special_in_content: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Prompt ids for the next turn: `history_ids` (the conversation so far,
        exactly as fed and generated) followed by the ids of what the template
        adds for the new messages.

        Re-encoding earlier replies from their text can give other ids than
        the ones generated, which silently kills prefix-cache hits, so the
        kept ids are reused. When the template does not just append (its
        render of `messages` does not start with the kept text, e.g. it
        rewrites earlier turns) the whole conversation is encoded afresh:
        fewer cache hits, but the prompt the model would expect. Message text
        stays text, as in `encode_chat`.
        """
        segments = self._render_segments(messages, True, parse_special_in_content, template_kwargs, tools)
        rendered = "".join(text for text, _ in segments)
        kept = self.decode(history_ids, skip_special_tokens=False)
        if history_ids and kept and rendered.startswith(kept):
            return list(history_ids) + self._encode_segments(_segments_after(segments, len(kept)))
        return self.encode_chat(
            messages, parse_special_in_content=parse_special_in_content, template_kwargs=template_kwargs, tools=tools
        )

    def _render_segments(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool,
        parse_special: bool,
        template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[tuple[str, bool]]:
        """The rendered conversation as (text, is_message_special_text) pieces.

        Each special-token string in a message's text is swapped for a unique
        placeholder before rendering and put back after, marked, so that it is
        encoded as text. Messages without such strings render exactly as
        before: one piece, the same ids.
        """
        pattern = self._special_text
        if parse_special or pattern is None:
            return [(self.render_chat(messages, add_generation_prompt, template_kwargs=template_kwargs, tools=tools),
                     False)]
        hidden: list[str] = []
        nonce = secrets.token_hex(8)

        def hide(match: re.Match[str]) -> str:
            hidden.append(match[0])
            return f"\ue000{nonce}:{len(hidden) - 1}\ue001"

        def protect(value: Any) -> Any:
            # Every string a message or a tool holds (a call's arguments too), roles aside.
            if isinstance(value, str):
                return pattern.sub(hide, value)
            if isinstance(value, Mapping):
                return {key: item if key == "role" else protect(item) for key, item in value.items()}
            if isinstance(value, list):
                return [protect(item) for item in value]
            return value

        protected = [protect(message) for message in messages]
        protected_tools = [protect(tool) for tool in tools] if tools else tools
        if not hidden:
            return [(self.render_chat(messages, add_generation_prompt, template_kwargs=template_kwargs, tools=tools),
                     False)]
        rendered = self.render_chat(protected, add_generation_prompt, template_kwargs=template_kwargs,
                                    tools=protected_tools)
        parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", rendered)
        if any(nonce in part for part in parts[::2]):
            raise PromptError(
                f"The chat template of {self._source} rewrites message text in a way that cannot be told "
                "apart from its own markers, and a message contains special-token text "
                f"({', '.join(sorted(set(hidden))[:3])}); remove that text from the message."
            )
        return [
            (part, False) if index % 2 == 0 else (hidden[int(part)], True)
            for index, part in enumerate(parts)
            if part
        ]

    def _encode_segments(self, segments: Sequence[tuple[str, bool]]) -> list[int]:
        ids: list[int] = []
        for text, is_message_text in segments:
            backend = self._text_only_backend() if is_message_text else self._backend
            ids += backend.encode(text, add_special_tokens=False).ids
        return ids

    def _text_only_backend(self) -> tokenizers.Tokenizer:
        """A copy of the backend with `encode_special_tokens` set: special-token
        strings are split like any text. A copy, because the flag is the
        backend's state and other threads encode with it."""
        with self._text_backend_lock:
            if self._text_backend is None:
                backend = tokenizers.Tokenizer.from_str(self._backend.to_str())
                backend.no_truncation()
                backend.no_padding()
                backend.encode_special_tokens = True
                self._text_backend = backend
            return self._text_backend

    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def _end_of_turn_token_id(self) -> int | None:
        """The special token the chat template closes a turn with (<|im_end|>, <|eot_id|>, ...).

        Models stop by emitting it, yet configs often name only the end-of-text token.
        """
        probe = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": _PROBE_REPLY},
            {"role": "user", "content": "Hi"},
        ]
        try:
            rendered = self.render_chat(probe, add_generation_prompt=False)
        except PromptError:
            return None
        _, found, after_reply = rendered.partition(_PROBE_REPLY)
        if not found:
            return None
        ids = self._backend.encode(after_reply.lstrip(), add_special_tokens=False).ids
        return ids[0] if ids and ids[0] in self._marker_ids else None

    def _probe_system_role(self) -> tuple[bool, bool]:
        """(whether the template refuses a system message, whether it puts one
        inside the user's turn itself), from a system + user probe.

        A template that refuses one (Gemma 2's raises "System role not
        supported") is given it folded the way Gemma 3's template folds it,
        where the folded conversation renders. Gemma 3's and Mistral's put the
        system text in a user message: no marker token between it and the user's.
        """
        probe = [{"role": "system", "content": _PROBE_SYSTEM}, {"role": "user", "content": _PROBE_USER}]
        try:
            rendered = self.render_chat(probe)
        except PromptError:
            try:
                self.render_chat(fold_system_prompt(probe))
            except PromptError:
                return False, False
            return True, False
        _, found_system, after_system = rendered.partition(_PROBE_SYSTEM)
        between, found_user, _ = after_system.partition(_PROBE_USER)
        if not (found_system and found_user):
            return False, False
        ids = self._backend.encode(between, add_special_tokens=False).ids
        return False, not self._marker_ids.intersection(ids)


def fold_system_prompt(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """A leading system message folded into the first user message, "system\n\nuser",
    as Gemma 3's template folds it, for a template that refuses a system role.
    With no user message after it, it becomes a user message itself."""
    if not messages or messages[0].get("role") != "system" or not isinstance(messages[0].get("content"), str):
        return messages
    system = messages[0]["content"]
    first_user = next((index for index, message in enumerate(messages) if message.get("role") == "user"), None)
    if first_user is None:
        return [{**messages[0], "role": "user"}, *messages[1:]]
    user = messages[first_user]
    if not isinstance(user.get("content"), str):
        return messages
    folded = {**user, "content": f"{system}\n\n{user['content']}"}
    return [*messages[1:first_user], folded, *messages[first_user + 1 :]]


def _text_chars(value: Any) -> int:
    """The characters of every string `value` holds (messages, tools), walked without recursion."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return total


def _segments_after(segments: Sequence[tuple[str, bool]], start: int) -> list[tuple[str, bool]]:
    """The pieces of a rendered text from character `start` on."""
    rest: list[tuple[str, bool]] = []
    for text, is_message_text in segments:
        if start >= len(text):
            start -= len(text)
            continue
        rest.append((text[start:], is_message_text))
        start = 0
    return rest


def _raise_exception(message: str) -> NoReturn:
    raise PromptError(f"The model's chat template rejected this conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters and sorts keys; templates are written against transformers' version.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text for training masks with it.

    Here it only renders its body, but without it such templates would not compile.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _make_sandbox() -> BoundedSandbox:
    environment = BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.bound_filters()
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


_SANDBOX = _make_sandbox()


def check_token_texts(tokens: Iterable[str], special: Iterable[str], source: str) -> None:
    """Refuse a vocabulary with a token longer than MAX_TOKEN_CHARS or special
    tokens longer than MAX_SPECIAL_TOKEN_CHARS in all (TokenizerError naming
    `source`): for tokenizer.json here, and for a GGUF file's vocabulary
    before it is imported (engine.formats.gguf.tokenizer)."""
    longest = max(map(len, tokens), default=0)
    if longest > MAX_TOKEN_CHARS:
        raise TokenizerError(
            f"{source} has a token of {longest:,} characters; no model's tokens are longer than "
            f"{MAX_TOKEN_CHARS:,}. The tokenizer is corrupt or not a real model's."
        )
    special_chars = sum(map(len, special))
    if special_chars > MAX_SPECIAL_TOKEN_CHARS:
        raise TokenizerError(
            f"{source} has special tokens of {special_chars:,} characters in all, more than any model's "
            f"({MAX_SPECIAL_TOKEN_CHARS:,}). The tokenizer is corrupt or not a real model's."
        )


def _read_json(path: Path) -> dict[str, Any]:
    """The object in an optional JSON file; {} when the file is absent."""
    if not path.is_file():
        return {}
    try:
        return read_json_object(path)
    except FileNotFoundError:
        return {}
    except ModelJSONError as exc:
        raise TokenizerError(f"{path} {exc}. Download the model's copy of it again.") from None


def _read_chat_template(folder: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            # Newlines as Path.read_text gives them (universal newlines).
            return read_model_file(jinja_file).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except (ModelJSONError, FileNotFoundError, UnicodeDecodeError) as exc:
            why = "is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else exc
            raise TokenizerError(f"{jinja_file} {why}. Download the model's copy of it again.") from None
    template = tokenizer_config.get("chat_template")
    if template is None:
        template = _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates, e.g. "default" and "tool_use"
        named = {
            entry.get("name"): entry.get("template")
            for entry in template
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)
        }
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"The chat template in {folder} is not a string. Fix its tokenizer_config.json.")
    return template


def _special_token_strings(config: Mapping[str, Any]) -> dict[str, str]:
    """bos_token, eos_token, ... of a tokenizer config, written as strings or as AddedToken objects."""
    strings = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            strings[key] = value
    return strings


def _token_ids(value: Any) -> list[int]:
    """eos_token_id of a model config: absent, one id, or a list of them."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
