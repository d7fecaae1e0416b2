"""The "Get models" dialog: search Hugging Face, choose a file that fits, download it.

Opened from the model manager (Ctrl+M → Get models…). A search lists the
repositories Tandem runs (app/models/hub.py); choosing one lists its files —
each GGUF quantization, or the safetensors folder — with the download size,
the memory it needs against what is free, and a mark on what fits; the
recommended one is selected. Download fetches it in the background
(app/models/download.py) with a progress bar, speed and time left,
Pause/Resume and Cancel; the new model is then registered and
`model_added(id)` is emitted, so the model manager lists it.

Every network call runs on a daemon thread that never touches Qt: its
progress and outcome are pushed to the GUI thread through the event loop
(ui/dialogs/background_job.py, as the model manager's import). Without a
network the status line says so in one line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models.download import DownloadControl, DownloadProgress, download_choice, partial_bytes
from app.models.entries import ModelEntry
from app.models.errors import DownloadCancelledError, DownloadPausedError, HubOfflineError, ModelError
from app.models.hub import ChoiceFit, HubModel, RepoFiles, assess_choices, repo_files, search_models
from app.models.registry import ModelRegistry
from engine.progress import format_bytes
from ui.dialogs.background_job import BackgroundJob
from ui.theme import muted_text_color

log = logging.getLogger(__name__)

_ROLE = Qt.ItemDataRole.UserRole


def format_count(count: int | None) -> str:
    """1_234_567 -> '1.2M'; None -> '—'."""
    if count is None:
        return "—"
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= limit:
            value = count / limit
            return f"{value:.1f}{suffix}" if value < 10 else f"{value:.0f}{suffix}"
    return str(count)


def _fit_columns(tree: QTreeWidget) -> None:
    """The first column takes the room left; every other one is as wide as
    its heading or its widest cell, whichever is wider, before and after the
    rows come (Qt's default 100 pixels cut "Fits this computer")."""
    header = tree.header()
    header.setStretchLastSection(False)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    for column in range(1, header.count()):
        header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)


class GetModelsDialog(QDialog):
    """Search, choose and download models; `model_added(id)` after each download."""

    model_added = Signal(str)

    def __init__(self, registry: ModelRegistry, parent: QWidget | None = None, *, device: str = "auto") -> None:
        super().__init__(parent)
        self.setWindowTitle("Get models")
        self.registry = registry
        self.device = device
        self._jobs: list[BackgroundJob[Any]] = []
        self._download: BackgroundJob[DownloadProgress] | None = None
        self._control: DownloadControl | None = None
        self._listing: RepoFiles | None = None
        self._fits: list[ChoiceFit] = []
        self._results: list[HubModel] = []

        self.search_field = QLineEdit(self)
        self.search_field.setPlaceholderText("Search Hugging Face, e.g. “Qwen2.5 0.5B GGUF” or “SmolLM2”")
        self.search_field.setAccessibleName("Search models")
        self.search_field.returnPressed.connect(self.search)
        self.sort_box = QComboBox(self)
        self.sort_box.addItem("Most downloaded", "downloads")
        self.sort_box.addItem("Recently updated", "recent")
        self.sort_box.setAccessibleName("Sort results")
        self.search_button = QPushButton("&Search", self)
        self.search_button.clicked.connect(self.search)
        top = QHBoxLayout()
        top.addWidget(self.search_field, 1)
        top.addWidget(self.sort_box)
        top.addWidget(self.search_button)

        self.results = QTreeWidget(self)
        self.results.setHeaderLabels(["Model", "Format", "Parameters", "Downloads", "Licence", "Updated"])
        self.results.setRootIsDecorated(False)
        self.results.setUniformRowHeights(True)
        self.results.setAlternatingRowColors(True)
        self.results.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.results.setAccessibleName("Search results")
        _fit_columns(self.results)
        self.results.currentItemChanged.connect(lambda *_: self.show_files())

        self.files = QTreeWidget(self)
        self.files.setHeaderLabels(["File", "Download", "Memory to run", "Fits this computer"])
        self.files.setRootIsDecorated(False)
        self.files.setUniformRowHeights(True)
        self.files.setAlternatingRowColors(True)
        self.files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.files.setAccessibleName("Files to download")
        _fit_columns(self.files)
        self.files.currentItemChanged.connect(lambda *_: self._update_buttons())
        self.files.itemActivated.connect(lambda *_: self.download())
        self.files_label = QLabel("Choose a model to see its files.", self)
        self.files_label.setWordWrap(True)
        files_box = QWidget(self)
        files_layout = QVBoxLayout(files_box)
        files_layout.setContentsMargins(0, 0, 0, 0)
        files_layout.addWidget(self.files_label)
        files_layout.addWidget(self.files, 1)

        splitter = QSplitter(Qt.Orientation.Vertical, self)
        splitter.addWidget(self.results)
        splitter.addWidget(files_box)
        splitter.setChildrenCollapsible(False)

        self.progress_label = QLabel(self)
        self.progress_label.setWordWrap(True)
        self.progress_bar = QProgressBar(self)
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setAccessibleName("Download progress")
        self.pause_button = QPushButton("&Pause", self)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.cancel_button = QPushButton("Ca&ncel download", self)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.progress_row = QWidget(self)
        row = QHBoxLayout(self.progress_row)
        row.setContentsMargins(0, 0, 0, 0)
        column = QVBoxLayout()
        column.addWidget(self.progress_label)
        column.addWidget(self.progress_bar)
        row.addLayout(column, 1)
        row.addWidget(self.pause_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.cancel_button, 0, Qt.AlignmentFlag.AlignBottom)
        self.progress_row.hide()

        # One line: offline, an error, the last outcome.
        self.status_label = QLabel(self)
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.download_button = QPushButton("&Download", self)
        self.download_button.clicked.connect(self.download)
        self.close_button = QPushButton("&Close", self)
        self.close_button.clicked.connect(self.reject)
        for button in (self.search_button, self.download_button, self.close_button, self.pause_button,
                       self.cancel_button):
            button.setAutoDefault(False)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.close_button)

        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.progress_row)
        layout.addWidget(self.status_label)
        layout.addLayout(buttons)

        order = [self.search_field, self.sort_box, self.search_button, self.results, self.files,
                 self.download_button, self.pause_button, self.cancel_button, self.close_button]
        for first, second in zip(order, order[1:]):
            QWidget.setTabOrder(first, second)

        em = self.fontMetrics().averageCharWidth()
        self.resize(em * 120, self.fontMetrics().lineSpacing() * 34)
        self._update_buttons()
        self.search_field.setFocus()

    # -- background work -----------------------------------------------------------

    def _start(self, name: str, work: Callable[[Callable[[Any], None]], Any],
               on_done: Callable[[Any, BaseException | None], None],
               on_progress: Callable[[Any], None] | None = None) -> BackgroundJob[Any]:
        def done(result: Any, error: BaseException | None) -> None:
            self._jobs.remove(job)
            on_done(result, error)

        job = BackgroundJob(self, name, work, done, on_progress)
        self._jobs.append(job)
        return job.start()

    def busy(self) -> bool:
        return bool(self._jobs)

    def wait_idle(self, timeout: float) -> bool:
        """Block until the background threads end (for tests and shutdown)."""
        return all([job.join(timeout) for job in list(self._jobs)])

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #b3261e;" if error else f"color: {muted_text_color(self.palette()).name()};")

    def _error_text(self, error: BaseException) -> str:
        if isinstance(error, HubOfflineError):
            return str(error).split("\n")[0]
        if isinstance(error, ModelError):
            return str(error)
        log.error("Get models failed", exc_info=error)
        return f"Unexpected error: {error!r}"

    # -- searching -------------------------------------------------------------------

    def search(self) -> None:
        text = self.search_field.text().strip()
        sort = self.sort_box.currentData()
        self.search_button.setEnabled(False)
        self._say(f"Searching Hugging Face for “{text}”…" if text else "Listing the most popular models…")
        self._start("hub-search", lambda _report: search_models(text, sort=sort), self._searched)

    def _searched(self, found: list[HubModel] | None, error: BaseException | None) -> None:
        self.search_button.setEnabled(True)
        if error is not None:
            self._say(self._error_text(error), error=True)
            return
        self._results = found or []
        self.results.clear()
        self.files.clear()
        for model in self._results:
            updated = model.last_modified.date().isoformat() if model.last_modified else "—"
            item = QTreeWidgetItem([
                model.repo_id + ("  (gated)" if model.gated else ""), " + ".join(model.formats),
                format_count(model.parameters), format_count(model.downloads), model.license or "—", updated,
            ])
            item.setData(0, _ROLE, model.repo_id)
            self.results.addTopLevelItem(item)
        count = len(self._results)
        self._say(f"{count} model{'s' if count != 1 else ''} Tandem can run." if count
                  else "No model Tandem runs matches that; try another name.")
        if count:
            self.results.setCurrentItem(self.results.topLevelItem(0))
            self.results.setFocus()

    # -- choosing a file -------------------------------------------------------------

    def selected_repo(self) -> str | None:
        item = self.results.currentItem()
        return None if item is None else item.data(0, _ROLE)

    def show_files(self) -> None:
        repo_id = self.selected_repo()
        self.files.clear()
        self._listing, self._fits = None, []
        self._update_buttons()
        if repo_id is None:
            return
        self.files_label.setText(f"Reading the files of {repo_id} and what they need…")
        device = self.device
        dest = self.registry.imports_dir

        def work(_report: Callable[[Any], None]) -> tuple[RepoFiles, list[ChoiceFit]]:
            listing = repo_files(repo_id)
            return listing, assess_choices(listing, device, dest=dest)

        self._start("hub-files", work, lambda result, error: self._listed(repo_id, result, error))

    def _listed(self, repo_id: str, result: tuple[RepoFiles, list[ChoiceFit]] | None,
                error: BaseException | None) -> None:
        if repo_id != self.selected_repo():
            return  # another model was chosen meanwhile
        if error is not None or result is None:
            self.files_label.setText(self._error_text(error) if error else "")
            return
        self._listing, self._fits = result
        self.files.clear()
        recommended = None
        for index, fit in enumerate(self._fits):
            memory = "unknown" if fit.memory_bytes is None else f"about {format_bytes(fit.memory_bytes)}"
            mark = "✓ fits" if fit.fits else f"✗ {fit.mark}"
            if fit.recommended:
                mark += " — recommended"
            name = fit.choice.main_file.name if fit.choice.kind == "gguf" else f"{fit.choice.label} ({len(fit.choice.files)} files)"
            item = QTreeWidgetItem([f"{fit.choice.label}   {name}" if fit.choice.kind == "gguf" else name,
                                    format_bytes(fit.choice.size), memory, mark])
            item.setData(0, _ROLE, index)
            item.setToolTip(3, fit.describe())
            if not fit.fits:
                item.setForeground(3, Qt.GlobalColor.darkRed)
            self.files.addTopLevelItem(item)
            if fit.recommended:
                recommended = item
        free = self._fits[0] if self._fits else None
        listing = self._listing
        if free is None:
            self.files_label.setText(f"{repo_id} has no GGUF file and no safetensors folder Tandem can run.")
        else:
            licence = f" Licence: {listing.license}." if listing.license else ""
            self.files_label.setText(
                f"{repo_id}: {format_bytes(free.memory_free)} memory and {format_bytes(free.disk_free)} disk "
                f"free.{licence}" + ("" if recommended is not None else " Nothing fits this computer.")
            )
        self.files.setCurrentItem(recommended or self.files.topLevelItem(0))
        self._update_buttons()

    def selected_fit(self) -> ChoiceFit | None:
        item = self.files.currentItem()
        if item is None or not self._fits:
            return None
        return self._fits[item.data(0, _ROLE)]

    def select_file(self, label: str) -> None:
        """Select the choice labelled `label` (e.g. "Q8_0")."""
        for index in range(self.files.topLevelItemCount()):
            item = self.files.topLevelItem(index)
            if self._fits[item.data(0, _ROLE)].choice.label == label:
                self.files.setCurrentItem(item)
                return
        raise KeyError(label)

    # -- downloading -----------------------------------------------------------------

    @property
    def downloading(self) -> bool:
        return self._download is not None

    def download(self) -> None:
        fit, listing = self.selected_fit(), self._listing
        if fit is None or listing is None or self._download is not None:
            return
        control = DownloadControl()
        self._control = control
        choice = fit.choice
        registry = self.registry

        def work(report: Callable[[DownloadProgress], None]) -> ModelEntry:
            return download_choice(registry, listing, choice, on_progress=report, control=control)

        kept = partial_bytes(self.registry.imports_dir, listing, choice)
        self.progress_label.setText(
            f"Resuming {choice.label} from {format_bytes(kept)}…" if kept else f"Starting {choice.label}…")
        self.progress_bar.setRange(0, 0)
        self.pause_button.setText("&Pause")
        self.pause_button.setEnabled(True)
        self.cancel_button.setEnabled(True)
        self.progress_row.show()
        self._say("")
        self._download = self._start(
            "hub-download", work, lambda entry, error: self._downloaded(listing, choice.label, entry, error),
            on_progress=self._show_progress)
        self._update_buttons()
        self.pause_button.setFocus()

    def _show_progress(self, progress: DownloadProgress) -> None:
        if self._control is not None and self._control.cancel.is_set():
            return
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(round(progress.fraction * 1000))
        self.progress_label.setText(progress.detail)
        if progress.stage == "import":
            self.pause_button.setEnabled(False)

    def toggle_pause(self) -> None:
        """Pause a running download (its part files stay), or resume a paused one."""
        if self._download is not None and self._control is not None:
            self._control.pause.set()
            self.pause_button.setEnabled(False)
            self.progress_label.setText("Pausing…")
        elif self.pause_button.text() == "&Resume":
            self.download()

    def cancel_download(self) -> None:
        if self._download is not None and self._control is not None:
            self._control.cancel.set()
            self.cancel_button.setEnabled(False)
            self.progress_label.setText("Cancelling…")
        elif self._listing is not None:
            # A paused download: cancelling deletes what it kept.
            self._discard_paused()

    def _discard_paused(self) -> None:
        from app.models.download import discard_download

        assert self._listing is not None
        discard_download(self.registry.imports_dir, self._listing)
        self.progress_row.hide()
        self._say("The download was cancelled; nothing was kept.")
        self._update_buttons()

    def _downloaded(self, listing: RepoFiles, label: str, entry: ModelEntry | None,
                    error: BaseException | None) -> None:
        self._download = None
        self._control = None
        if isinstance(error, DownloadPausedError):
            self.progress_label.setText(str(error))
            self.pause_button.setText("&Resume")
            self.pause_button.setEnabled(True)
            self.cancel_button.setEnabled(True)
            self._update_buttons()
            return
        if isinstance(error, HubOfflineError):
            # The part files stay: Resume continues from them.
            self.progress_label.setText(self._error_text(error))
            self.pause_button.setText("&Resume")
            self.pause_button.setEnabled(True)
            self.cancel_button.setEnabled(True)
            self._say(self._error_text(error), error=True)
            self._update_buttons()
            return
        self.progress_row.hide()
        if entry is not None:
            self._say(f"Downloaded {listing.repo_id} ({label}) as “{entry.name}”: it is in the model list.")
            self.model_added.emit(entry.id)
        elif isinstance(error, DownloadCancelledError):
            self._say(str(error))
        elif error is not None:
            self._say(self._error_text(error), error=True)
        self._update_buttons()

    def _update_buttons(self) -> None:
        fit = self.selected_fit()
        self.download_button.setEnabled(fit is not None and self._download is None)
        if fit is not None:
            self.download_button.setText("&Download" if fit.fits else "&Download anyway")

    def done(self, result: int) -> None:
        # Closing the dialog pauses a running download: its part files stay for next time.
        if self._control is not None:
            self._control.pause.set()
        super().done(result)
