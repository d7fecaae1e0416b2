"""The user guide's Documents screenshots: a message with two attached documents
broadcast to three panes on the default model, the fit line that refuses a pane
the documents do not fit, and the first-part choice, at 1280x800 and 1024x700:

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/images/make_documents_screenshots.py [light|dark]

Uses the default model as the tests import it (.pytest_cache/tandem-data) and a
temporary config folder; writes documents-*.png next to this file.
"""

import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TANDEM_DATA_DIR", str(REPO / ".pytest_cache" / "tandem-data"))
os.environ["TANDEM_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tandem-shots-")
sys.path.insert(0, str(REPO))
from PySide6.QtWidgets import QApplication
app = QApplication([])
from ui.event_loop import TandemEventLoop
from ui.theme import apply_theme
theme = sys.argv[1] if len(sys.argv) > 1 else "light"
apply_theme(app, theme)
loop = TandemEventLoop(app)
asyncio.set_event_loop(loop)

from engine import Engine
from engine.formats.default_model import resolve_model
from engine.params import SamplingParams
from app.settings import Settings
from app.workspace.workspace import Workspace
from ui.window.main_window import MainWindow

OUT = Path(__file__).resolve().parent
files = Path(tempfile.mkdtemp(prefix="tandem-documents-"))
(files / "kyoto-itinerary.md").write_text(
    "# Kyoto, three days in November\n\n"
    "Day 1: Fushimi Inari at dawn, then Tofuku-ji for the maple leaves. Lunch in Gion.\n\n"
    "Day 2: Arashiyama bamboo grove, Tenryu-ji garden, the Hozugawa river boat in the afternoon.\n\n"
    "Day 3: Kinkaku-ji, Ryoan-ji's rock garden, and the Nishiki market before the evening train.\n")
(files / "budget.csv").write_text("item,yen\nhotel (3 nights),54000\nrail pass,14000\nfood,18000\ntemples,6000\n")

async def wait(pred, timeout=300):
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise TimeoutError
        await asyncio.sleep(0.05)

async def main():
    settings = Settings()
    settings.default_params = dataclasses.replace(SamplingParams(), temperature=0.0, max_tokens=48)
    engine = Engine(resolve_model("default"), device="cpu", threads=2)
    ws = Workspace(settings, engine=engine)
    for _ in range(3):
        ws.add_pane()
    for i, pane in enumerate(ws.panes):
        ws.set_params(pane.id, dataclasses.replace(pane.conversation.params, temperature=[0.0, 0.7, 1.2][i], seed=7))
    window = MainWindow(ws, settings, version="shots", save_settings=False)
    window.resize(1280, 800)
    window.show()
    att = window.attachments
    att.attach_paths([str(files / "kyoto-itinerary.md"), str(files / "budget.csv")])
    await wait(lambda: not att.reading and len(att.documents()) == 2)
    window.composer.edit.setPlainText("What does the trip cost in total, and which day has the river boat?")
    window.composer.send()
    await asyncio.sleep(0.2)
    await wait(lambda: all(len(p.conversation.messages) == 2 and not p.busy for p in ws.panes))
    await asyncio.sleep(0.3)
    for size in ((1280, 800), (1024, 700)):
        window.resize(*size)
        await asyncio.sleep(0.4)
        window.grab().save(str(OUT / f"documents-{size[0]}x{size[1]}-{theme}.png"))
    # The fit warning: pane 3 keeps nearly all of its context for the reply.
    small = ws.panes[2]
    limit = small.conversation.context_limit
    ws.set_params(small.id, dataclasses.replace(small.conversation.params, max_tokens=limit - 700))
    big = files / "kyoto-guide.md"
    big.write_text("\n\n".join(f"## Temple {i}\n\nOpen 8:30-17:00. Entry 500 yen. The garden is best in the "
                               f"morning light; the moss is at its greenest after rain." for i in range(40)))
    att.attach_paths([str(big), str(files / "budget.csv")])
    await wait(lambda: not att.reading and len(att.documents()) == 2)
    window.composer.edit.setPlainText("Which temples open earliest?")
    att.refresh_fit()
    for size in ((1280, 800), (1024, 700)):
        window.resize(*size)
        await asyncio.sleep(0.4)
        window.grab().save(str(OUT / f"documents-fit-{size[0]}x{size[1]}-{theme}.png"))
    window.composer.first_part_button.setChecked(True)
    await asyncio.sleep(0.3)
    window.resize(1280, 800)
    await asyncio.sleep(0.3)
    window.grab().save(str(OUT / f"documents-first-part-1280x800-{theme}.png"))
    window.composer.first_part_button.setChecked(False)
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.close()
    await closed.wait()

loop.run_until_complete(main())
print("wrote", *sorted(p.name for p in OUT.glob(f"documents-*-{theme}.png")))
