"""The documents attached to the next message: reading them, their chips, and whether they fit.

Each file is read on a daemon thread (ui/dialogs/background_job.py, with
engine.documents.read_document), so a large PDF never stalls the window;
removing its chip sets the reading's cancel event and drops its result. A
file that cannot be read gets one line in the composer's notice and is
forgotten. Once read, a document's chip shows its tokens in the first
target pane's model, and the fit line says what each target pane would
receive against its context (app.workspace.attachments.fit_documents),
refreshed when the documents, the targets, the panes or (after a pause in
typing) the message change. Counting encodes whole prompts, so it too runs
on a thread; a count overtaken by a change is not shown but redone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFileDialog

from app.workspace.attachments import PaneFit, document_tokens, first_parts_that_fit, fit_documents
from engine.documents import Document, DocumentCancelled, DocumentError, read_document
from ui.dialogs.background_job import BackgroundJob
from ui.dialogs.document_viewer import show_document
from ui.widgets.attachment_chip import AttachmentChip

if TYPE_CHECKING:
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

# The fit is counted again this long after the last keystroke (an encode of each target's prompt).
FIT_DELAY_MS = 250

FILE_FILTER = ("Documents (*.txt *.md *.markdown *.rst *.csv *.tsv *.json *.jsonl *.html *.htm *.xml *.yaml *.yml "
               "*.toml *.ini *.log *.py *.js *.ts *.c *.h *.cpp *.rs *.go *.java *.sh *.pdf *.docx);;All files (*)")


@dataclass(eq=False)
class PendingDocument:
    """A file attached to the next message: being read (`document` None) or read."""

    path: str
    chip: AttachmentChip
    cancel: threading.Event = field(default_factory=threading.Event)
    document: Document | None = None


class WindowAttachments:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.pending: list[PendingDocument] = []
        self.fits: list[PaneFit] = []
        self._errors: list[str] = []
        self._token_counts: dict[tuple[str, str, bool, int], int] = {}
        self._counting: BackgroundJob[None] | None = None
        self._generation = 0  # bumped by every change the fit depends on: a count of an older one is not shown
        self._fit_timer = QTimer(window)
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(FIT_DELAY_MS)
        self._fit_timer.timeout.connect(self.refresh_fit)
        composer = window.composer
        composer.attach_requested.connect(self.choose_files)
        composer.files_given.connect(self.attach_paths)
        composer.targets_changed.connect(self.refresh_fit)
        composer.first_part_toggled.connect(lambda _on: self.refresh_fit())
        composer.edit.textChanged.connect(self.refresh_fit_soon)

    # -- attaching ---------------------------------------------------------------------

    def choose_files(self) -> None:
        dialog = QFileDialog(self._window, "Attach files", "", FILE_FILTER)
        dialog.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dialog.filesSelected.connect(self.attach_paths)
        dialog.open()

    def attach_paths(self, paths: list[str]) -> None:
        """Read each file off the GUI thread; its chip says "reading…" until it is read."""
        if not self.reading:
            self._errors = []  # the notice lists the files refused since reading last began
        for path in paths:
            chip = AttachmentChip(path.replace("\\", "/").rsplit("/", 1)[-1] or path, self._window.composer,
                                  removable=True)
            item = PendingDocument(path, chip)
            chip.remove_requested.connect(lambda item=item: self.remove(item))
            chip.open_requested.connect(lambda item=item: self._open(item))
            self.pending.append(item)
            self._window.composer.add_attachment_chip(chip)
            BackgroundJob(
                chip, "read-document",
                lambda _report, item=item: read_document(item.path, cancel=item.cancel),
                lambda result, error, item=item: self._read(item, result, error),
            ).start()
        self.refresh_fit()

    def _read(self, item: PendingDocument, document: Document | None, error: BaseException | None) -> None:
        if item not in self.pending:
            return  # removed while it was read
        if error is not None or document is None:
            self._drop(item)
            if not isinstance(error, DocumentCancelled):
                line = str(error) if isinstance(error, DocumentError) else f"{item.chip.name} could not be read: {error}"
                self._errors.append(line)
                self._window.composer.show_notice(" ".join(self._errors), 15.0)
        else:
            item.document = document
        self.refresh_fit()

    def remove(self, item: PendingDocument) -> None:
        """Take the file off the next message, stopping its reading if it is still read."""
        item.cancel.set()
        if item in self.pending:
            self._drop(item)
            self.refresh_fit()

    def _drop(self, item: PendingDocument) -> None:
        self.pending.remove(item)
        self._window.composer.remove_attachment_chip(item.chip)

    def clear(self) -> None:
        """After a send: the next message starts without documents."""
        for item in list(self.pending):
            item.cancel.set()
            self._drop(item)
        self._window.composer.first_part_button.setChecked(False)
        self.refresh_fit()

    def _open(self, item: PendingDocument) -> None:
        if item.document is not None:
            show_document(self._window, item.document)

    # -- what a send takes -------------------------------------------------------------

    @property
    def reading(self) -> list[str]:
        """Names of the files still being read."""
        return [item.chip.name for item in self.pending if item.document is None]

    def documents(self) -> list[Document]:
        return [item.document for item in self.pending if item.document is not None]

    def first_part_panes(self) -> list[int]:
        """The panes that may get the documents' first parts, when the user chose so: every pane (the
        send cuts them only for a pane they do not fit whole, as it finds then)."""
        if not self._window.composer.first_part_button.isChecked():
            return []
        return [pane.id for pane in self._window.workspace.panes]

    # -- tokens and fit ----------------------------------------------------------------

    def tokens(self, model_id: str, document: Document) -> int | None:
        """The document's tokens in the model's tokenizer; None while the model is not loaded.
        An encode of the whole document: called on the counting thread, cached."""
        engine = self._window.workspace.engine_for(model_id)
        if engine is None:
            return None
        key = (model_id, document.sha256, document.complete, len(document.text))
        if key not in self._token_counts:
            self._token_counts[key] = document_tokens(engine.tokenizer, document)
        return self._token_counts[key]

    @property
    def counting(self) -> bool:
        """Whether a count of the fit is under way or waiting to start."""
        return self._counting is not None or self._fit_timer.isActive()

    def refresh_fit_soon(self) -> None:
        if self.pending:
            self._fit_timer.start()

    def refresh_fit(self) -> None:
        """Count the chips' tokens and the fit line again, for the documents read and the target panes.

        The count encodes each target's whole next prompt (and, for the first-part choice, a
        bisection of encodes): seconds of work for long documents in several panes, so it runs
        on a thread and its result is shown when it comes, unless something it counted has
        changed since (then it is counted again). One count runs at a time."""
        self._fit_timer.stop()
        self._generation += 1
        if not self.documents():
            self.fits = []
            self._window.composer.set_fit("", False)
            return
        if self._counting is None:
            self._start_count()

    def _start_count(self) -> None:
        window = self._window
        composer = window.composer
        workspace = window.workspace
        documents = tuple(self.documents())
        targets = [pid for pid in composer.targets() if pid in {p.id for p in workspace.panes}]
        question = composer.edit.toPlainText()
        first_part = composer.first_part_button.isChecked()
        model = workspace.pane(targets[0]).conversation.model_id if targets else workspace.default_model
        generation = self._generation
        self._counting = BackgroundJob(
            composer, "count-fit",
            lambda _report: self._count(workspace, question, documents, targets, first_part, model),
            lambda result, error: self._counted(generation, result, error),
        ).start()

    def _count(
        self, workspace: Workspace, question: str, documents: tuple[Document, ...], targets: list[int],
        first_part: bool, model: str,
    ) -> FitCount:
        """On the counting thread: reads the panes' conversations, changes nothing (the tokenizer's
        encode lets go of the GIL, so the GUI thread runs beside it)."""
        fits = fit_documents(workspace, question, documents, targets)
        first_parts: dict[int, tuple[Document, ...] | None] = {}
        for fit in fits:
            if first_part and not fit.fits:
                pane = workspace.pane(fit.pane_id)
                engine = workspace.engine_for(pane.conversation.model_id)
                found = first_parts_that_fit(engine.tokenizer, pane, question, documents) if engine else None
                first_parts[fit.pane_id] = found[0] if found is not None else None
        return FitCount(fits, first_parts, {id(d): self.tokens(model, d) for d in documents})

    def _counted(self, generation: int, count: FitCount | None, error: BaseException | None) -> None:
        self._counting = None
        if generation != self._generation:
            if self.documents():
                self._start_count()  # counted what has changed since: count what is there now
            return
        composer = self._window.composer
        if error is not None or count is None:
            self.fits = []
            composer.set_fit(f"The tokens could not be counted: {error}", False)
            return
        self.fits = count.fits
        for item in self.pending:
            if item.document is not None:
                item.chip.set_document(item.document, count.chip_tokens.get(id(item.document)),
                                       _first_part_note(item.document, count.first_parts, self._window.workspace))
        composer.set_fit(_fit_text(self.fits, count.first_parts), any(not fit.fits for fit in self.fits))


@dataclass(frozen=True, slots=True)
class FitCount:
    """One count: what each target pane would receive, the first parts of the documents for the
    panes they do not fit whole (None: not even a first part fits), each document's tokens by id()."""

    fits: list[PaneFit]
    first_parts: dict[int, tuple[Document, ...] | None]
    chip_tokens: dict[int, int | None]


def _first_part_note(
    document: Document, first_parts: dict[int, tuple[Document, ...] | None], workspace: Workspace
) -> str:
    """'first 31% in Pane 3': where only a part of the document will be sent."""
    notes = []
    for pane_id, parts in first_parts.items():
        part = next((p for p in parts or () if p.sha256 == document.sha256 and p.name == document.name), None)
        if part is not None and not part.complete and document.text:
            notes.append(f"first {max(1, round(100 * len(part.text) / len(document.text)))}% "
                         f"in {workspace.pane(pane_id).title}")
    return ", ".join(notes)


def _fit_text(fits: list[PaneFit], first_parts: dict[int, tuple[Document, ...] | None]) -> str:
    """'Pane 1: 6,210 of 8,192 tokens · Pane 2: …', then a line for each pane they do not fit."""
    counts = []
    for fit in fits:
        if fit.prompt_tokens is None:
            counts.append(f"{fit.title}: not counted, {fit.uncounted}")
        elif fit.context_limit:
            counts.append(f"{fit.title}: {fit.prompt_tokens:,} of {fit.context_limit:,} tokens"
                          + ("" if fit.fits else " ✕"))
        else:
            counts.append(f"{fit.title}: {fit.prompt_tokens:,} tokens")
    lines = [" · ".join(counts)]
    for fit in fits:
        if fit.fits:
            continue
        if fit.pane_id not in first_parts:
            lines.append(f"{fit.refusal} It will not be sent there.")
        elif first_parts[fit.pane_id] is None:
            lines.append(f"{fit.refusal} Not even a first part fits: it will not be sent there.")
        else:
            lines.append(f"{fit.title} gets only the first part of each document that fits.")
    return "\n".join(lines)
