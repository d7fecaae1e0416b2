"""Screenshots of Get models against the tests' local fake Hub (nothing reaches Hugging Face):
search, choose a file, download it, then chat with the downloaded model in a pane.

    .venv/bin/python docs/images/make_get_models_screenshots.py docs/images light
    .venv/bin/python docs/images/make_get_models_screenshots.py docs/images dark

The model is the tests' tiny random Llama, so its reply is noise; what the
pictures show is the flow.
"""
import asyncio, dataclasses, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["QT_QPA_PLATFORM"] = "offscreen"
tmp = Path(tempfile.mkdtemp(prefix="tandem-getmodels-"))
os.environ["TANDEM_DATA_DIR"] = str(tmp / "data"); os.environ["TANDEM_CONFIG_DIR"] = str(tmp / "config")
os.environ["HF_HOME"] = str(tmp / "hf"); os.environ.pop("HF_TOKEN", None); os.environ.pop("HF_HUB_OFFLINE", None)
out = Path(sys.argv[1]); theme = sys.argv[2] if len(sys.argv) > 2 else "light"
from gguf import GGMLQuantizationType as Q
from tests.engine.test_gguf_import import write_gguf
from tests.app.hf_server import FakeHub, FakeRepo
files = {}
for q, name in ((Q.Q4_0, "Q4_0"), (Q.Q8_0, "Q8_0"), (Q.F16, "F16")):
    p = tmp / f"tiny-llama-{name}.gguf"; write_gguf(p, qtype=q); files[p.name] = p.read_bytes()
hub = FakeHub().start()
os.environ["HF_ENDPOINT"] = hub.endpoint
hub.add(FakeRepo("tandem-test/Tiny-Llama-GGUF", files, tags=["gguf", "llama"], downloads=1520, license="apache-2.0",
                 last_modified="2025-05-02T00:00:00.000Z", gguf={"architecture": "llama", "total": 79_000}))

from PySide6.QtWidgets import QApplication
from ui.event_loop import TandemEventLoop
from app.models.registry import ModelRegistry
from app.store.session import ChatSession
from app.settings import Settings
from app.workspace.workspace import Workspace
from engine.params import SamplingParams
from ui.main import version
from ui.window.main_window import MainWindow
from ui.theme import apply_theme

app = QApplication(sys.argv[:1]); apply_theme(app, theme)
loop = TandemEventLoop(app); asyncio.set_event_loop(loop)
settings = Settings(); settings.default_params = dataclasses.replace(SamplingParams(), max_tokens=24, temperature=0.0)
registry = ModelRegistry()
workspace = Workspace(settings, resolve_model=lambda mid: registry.engine_model(mid), model_options=registry.engine_options)
session = ChatSession.open(tmp / "config" / "chats.sqlite3")
session.restore(workspace, default_panes=1)
window = MainWindow(workspace, settings, version=version(), save_settings=False, session=session, registry=registry)
window.resize(1024, 640); window.show()

async def until(pred, t=120):
    end = time.monotonic() + t
    while not pred():
        if time.monotonic() > end: raise TimeoutError
        await asyncio.sleep(0.05)

async def scenario():
    window.models.open_manager(); manager = window.models.manager
    get = manager.open_get_models(); get.resize(760, 520)
    get.search_field.setText("Tiny-Llama"); get.search()
    await until(lambda: not get.busy() and get.files.topLevelItemCount() > 0)
    await asyncio.sleep(0.3); get.grab().save(str(out / f"get-models-{theme}.png")); print("wrote get-models")
    before = {e.id for e in registry.models()}
    get.download()
    await until(lambda: {e.id for e in registry.models()} - before != set() and not get.downloading)
    new_id = ({e.id for e in registry.models()} - before).pop()
    await asyncio.sleep(0.3); get.grab().save(str(out / f"get-models-done-{theme}.png"))
    get.close(); manager.close()
    pane = workspace.panes[0]
    window.models.choose(pane.id, new_id)
    await until(lambda: workspace.model_state(new_id) == "ready")
    turn = await workspace.send("Hello from a downloaded model", [pane.id])
    await turn.wait()
    await until(lambda: len(pane.conversation.messages) >= 2 and not pane.busy)
    window.flush_panes(); await asyncio.sleep(0.4)
    window.grab().save(str(out / f"get-models-chat-{theme}.png")); print("wrote chat", new_id, repr(pane.conversation.messages[-1].text[:60]))
    closed = asyncio.Event(); window.closed.connect(closed.set); window.close(); await closed.wait()

with loop:
    loop.run_until_complete(scenario())
hub.stop(); shutil.rmtree(tmp, ignore_errors=True)
sys.stdout.flush(); os._exit(0)
