"""The user guide's screenshot of three families side by side: a Qwen3 pane
whose reply opens with a collapsed Thinking section, beside a Gemma 3 pane
and a Llama pane, light and dark, at 1280x800:

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/images/make_families_screenshot.py

No real Qwen3, Gemma 3 or Llama weights are on this machine (nothing is
downloaded from a model hub), so each pane runs a small model of that
family's architecture, built by transformers and trained here for a few
seconds to give one answer in its family's own chat template (Qwen3's with
a think block first). Everything after that is the product as a user runs
it: the folders are added to the model registry, each pane is set to one,
one message is broadcast, and the window streams the replies, splits the
reasoning off and shows it collapsed. Writes families-light.png and
families-dark.png next to this file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["TANDEM_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tandem-shots-")
os.environ.setdefault("TANDEM_DATA_DIR", tempfile.mkdtemp(prefix="tandem-shots-data-"))

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from shots import close_window, until  # noqa: E402 - the screenshot scripts' shared waits
TEMPLATES = HERE.parents[1] / "tests" / "engine" / "data" / "templates"
QUESTION = "What is a tandem bicycle?"


@dataclasses.dataclass(frozen=True)
class Demo:
    folder_name: str
    config_class: str
    config: dict
    template: str  # a published template (tests/engine/data/templates)
    specials: tuple[str, ...]  # added to the default model's tokenizer
    plain_tokens: tuple[str, ...]  # added too, not special (shown in replies)
    bos: str | None
    end_of_turn: str
    answer: str


DEMOS = (
    Demo("Qwen3 (small demo)", "Qwen3Config", dict(head_dim=64, tie_word_embeddings=True),
         "Qwen-Qwen3-0.6B.jinja", (), ("<think>", "</think>"), None, "<|im_end|>",
         "<think>\nThey ask about a kind of bicycle. Tandem means one behind the other, so: two riders, "
         "one frame, both pedalling.\n</think>\n\nA tandem bicycle is built for two riders who sit one "
         "behind the other and pedal together."),
    Demo("Gemma 3 (small demo)", "Gemma3TextConfig",
         dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=16,
              layer_types=["sliding_attention", "full_attention"]),
         "google-gemma-3-4b-it.jinja", ("<bos>", "<start_of_turn>", "<end_of_turn>"), (), "<bos>", "<end_of_turn>",
         "A tandem is a bicycle for two: the captain in front steers, the stoker behind pedals along."),
    Demo("Llama (small demo)", "LlamaConfig", dict(tie_word_embeddings=True),
         "meta-llama-Llama-3.2-3B-Instruct.jinja",
         ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), (),
         "<|begin_of_text|>", "<|eot_id|>",
         "It is a bicycle with two seats and two sets of pedals on one long frame."),
)


def make_demo(demo: Demo, folder: Path) -> Path:
    """A small model of the demo's family that answers QUESTION with its answer."""
    import torch
    import transformers
    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    from engine import Tokenizer
    from engine.formats.default_model import resolve_model

    folder.mkdir(parents=True, exist_ok=True)
    base = resolve_model("default")
    backend = HFTokenizer.from_file(str(base / "tokenizer.json"))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in demo.specials])
    # As Qwen3's tokenizer.json has them: added tokens, not special ones, so replies keep them as text.
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in demo.plain_tokens])
    backend.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": demo.end_of_turn,
                "chat_template": (TEMPLATES / demo.template).read_text(encoding="utf-8")}
    if demo.bos is not None:
        settings["bos_token"] = demo.bos
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.0}), encoding="utf-8")

    vocab = backend.get_vocab_size()
    config = getattr(transformers, demo.config_class)(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, **demo.config,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)  # the tokenizer files are beside it; the engine reads the prompt through them

    tokenizer = Tokenizer.from_folder(folder)
    # The prompt as the engine will make it (the template's thinking switch left on, as a pane leaves it).
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": QUESTION}])
    answer_ids = tokenizer.encode(demo.answer + demo.end_of_turn)
    ids = torch.tensor([prompt_ids + answer_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100  # learn the answer, not the question
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()
    model.save_pretrained(folder)
    (folder / "trained").write_text(f"{loss.item():.4f}\n", encoding="utf-8")
    print(f"{demo.folder_name}: trained to loss {loss.item():.4f}")
    return folder


def main() -> None:
    from PySide6.QtWidgets import QApplication

    from app.models.registry import ModelRegistry
    from app.settings import Settings
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from engine.params import SamplingParams
    from ui.event_loop import TandemEventLoop
    from ui.main import version
    from ui.theme import apply_theme
    from ui.window.main_window import MainWindow

    scratch = Path(os.environ["TANDEM_CONFIG_DIR"])
    # Trained once, then reused (delete the folder to train again).
    cache = Path(os.environ.get("TANDEM_DEMO_MODELS", Path.home() / ".cache" / "tandem" / "demo-models"))
    folders = [
        cache / demo.folder_name if (cache / demo.folder_name / "trained").exists()
        else make_demo(demo, cache / demo.folder_name) for demo in DEMOS
    ]

    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app, "light")
    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    settings = Settings()
    settings.default_params = dataclasses.replace(SamplingParams(), max_tokens=80, temperature=0.0)
    registry = ModelRegistry(scratch / "models.json")
    entries = [registry.add_folder(folder) for folder in folders]
    # As ui/main.py wires them: a pane's model id is the registry's folder.
    workspace = Workspace(settings, resolve_model=registry.engine_model, model_options=registry.engine_options)
    session = ChatSession.open(scratch / "chats.sqlite3")
    panes = session.restore(workspace, default_panes=3)
    window = MainWindow(workspace, settings, version=version(), save_settings=False, session=session,
                        registry=registry)
    window.resize(1280, 800)

    async def scenario() -> None:
        window.show()
        for pane, entry in zip(panes, entries):
            window.models.choose(pane.id, entry.id)
        await until(lambda: all(workspace.pane_model_state(p.id) in ("ready", "error") for p in panes))
        for pane in panes:
            if workspace.pane_model_state(pane.id) != "ready":
                slot = workspace.model_slot(pane.conversation.model_id)
                raise SystemExit(f"{pane.conversation.model_id} failed to load: {slot and slot.error}")
        window.composer.edit.setPlainText(QUESTION)
        window.composer.send_button.click()
        await until(lambda: all(len(p.conversation.messages) == 2 for p in panes))
        await until(lambda: not any(p.busy for p in panes))
        for name, theme in (("families-light.png", "light"), ("families-dark.png", "dark")):
            apply_theme(app, theme)
            window.flush_panes()
            window.refresh_status()
            await asyncio.sleep(0.3)
            window.grab().save(str(HERE / name), "PNG")
            print("wrote", HERE / name)
        await close_window(window)

    with loop:
        loop.run_until_complete(scenario())


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
