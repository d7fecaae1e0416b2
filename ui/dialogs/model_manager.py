"""The model manager dialog.

The dialog lists the registry's models with their details, opens "Get
models" (ui/dialogs/get_models.py: search Hugging Face and download), adds a model
folder, imports a GGUF file (with a progress bar and a Cancel button) and
removes models. A model's details hold what it loads with, kept per model
in the registry: "Quantize at load" and "Context length" (see
ui/dialogs/load_choices.py). An import runs on a daemon thread that never touches Qt:
its progress and outcome are pushed to the GUI thread through the event loop
(ui/dialogs/background_job.py).

Message boxes and file dialogs are opened with `open()`, never `exec()`: a
nested event loop would stall the asyncio callbacks qasync runs on Qt's loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QColor, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models.memory_estimate import MemoryEstimate, estimate_memory
from app.models.registry import (
    DEFAULT_MODEL_ID,
    ImportCancelledError,
    ModelDetails,
    ModelEntry,
    ModelError,
    ModelRegistry,
)
from engine.errors import EngineError
from engine.progress import LoadProgress, display_path, format_bytes
from ui.dialogs.background_job import BackgroundJob
from ui.dialogs.get_models import GetModelsDialog
from ui.dialogs.load_choices import LoadChoices
from ui.widgets.file_folders import remember, start_folder
from ui.theme import muted_text_color
from ui.window.status_bar import describe_arithmetic, explain_arithmetic

log = logging.getLogger(__name__)


def format_parameters(count: int) -> str:
    """134_515_008 -> '135M', 7_241_732_096 -> '7.2B'."""
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    if count >= 1e8:
        return f"{count / 1e6:.0f}M"
    if count >= 1e6:
        return f"{count / 1e6:.1f}M"
    return f"{count / 1e3:.0f}K"


@dataclass(slots=True)
class _ImportJob:
    """A GGUF import on its own thread (`job`), stopped by setting `cancel`."""

    path: Path
    cancel: threading.Event
    job: BackgroundJob[LoadProgress] | None = None


class ModelManagerDialog(QDialog):
    """Lists, adds, imports and removes models; `models_changed` after each change.

    Tests (and other callers) can skip the file dialogs: `add_folder(path)`
    and `import_gguf(path)` are what the buttons call.
    """

    models_changed = Signal()

    def __init__(
        self,
        registry: ModelRegistry,
        parent: QWidget | None = None,
        *,
        is_in_use: Callable[[str], bool] | None = None,
        is_loaded: Callable[[str], bool] | None = None,
        reload_model: Callable[[str], object] | None = None,
    ) -> None:
        """`is_loaded(id)`: whether the model's engine is loaded now (a changed
        quantize choice then applies at its next load); `reload_model(id)`
        reloads it, offered after such a change; when it returns an asyncio
        task, the dialog says when that reload has finished."""
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.registry = registry
        # Panes running a model: such a model cannot be removed until they switch.
        self._is_in_use = is_in_use or (lambda model_id: False)
        self.is_loaded = is_loaded or (lambda model_id: False)
        self._reload_model = reload_model
        self._details: dict[str, ModelDetails | ModelError] = {}
        self._engine_settings: dict[str, object] = {"device": "auto", "dtype": "auto", "kv_cache_mb": None, "page_size": 16}
        self._job: _ImportJob | None = None
        self.error_box: QMessageBox | None = None
        self.confirm_box: QMessageBox | None = None
        self.file_dialog: QFileDialog | None = None
        self.get_models: GetModelsDialog | None = None

        self.model_list = QTreeWidget(self)
        self.model_list.setHeaderLabels(["Model", "Kind", "Size"])
        self.model_list.setRootIsDecorated(False)
        self.model_list.setUniformRowHeights(True)
        self.model_list.setAlternatingRowColors(True)
        self.model_list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.model_list.setAccessibleName("Models")
        header = self.model_list.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.model_list.currentItemChanged.connect(lambda *_: self.show_selected())

        self.details_box = QGroupBox("Details", self)
        form = QFormLayout(self.details_box)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        self.detail_labels: dict[str, QLabel] = {}
        for key, title in (
            ("architecture", "Architecture"),
            ("parameters", "Parameters"),
            ("context", "Trained context"),
            ("dtype", "Stored as"),
            ("size", "Size on disk"),
            ("memory", "Memory to run"),
            ("arithmetic", "Computes with"),
            ("source", "Source"),
        ):
            value = QLabel(self.details_box)
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setMinimumWidth(self.fontMetrics().averageCharWidth() * 30)
            form.addRow(f"{title}:", value)
            self.detail_labels[key] = value
        # A path does not wrap at spaces; a read-only line scrolls and copies cleanly.
        self.location_field = QLineEdit(self.details_box)
        self.location_field.setReadOnly(True)
        self.location_field.setFrame(False)
        self.location_field.setAccessibleName("Location")
        clear = self.location_field.palette()
        clear.setColor(QPalette.ColorRole.Base, QColor(0, 0, 0, 0))  # reads as text, in any theme
        self.location_field.setPalette(clear)
        form.addRow("Location:", self.location_field)

        # What the model loads with: quantize at load, context length.
        self.load_choices = LoadChoices(self, form, self._estimate)
        self.quantize_choice = self.load_choices.quantize_choice
        self.reload_button = self.load_choices.reload_button
        self.quantize_note = self.load_choices.quantize_note
        self.context_length = self.load_choices.context_length
        self.details_error = QLabel(self.details_box)
        self.details_error.setWordWrap(True)
        self.details_error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_error.hide()
        form.addRow(self.details_error)

        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self.model_list)
        # Scrolled rather than squeezed: in a short window the wrapped notes
        # would otherwise be cut and the rows drawn over each other.
        self.details_scroll = QScrollArea(self)
        self.details_scroll.setWidgetResizable(True)
        self.details_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.details_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.details_scroll.setWidget(self.details_box)
        splitter.addWidget(self.details_scroll)
        splitter.setChildrenCollapsible(False)
        splitter.setStretchFactor(0, 5)
        splitter.setStretchFactor(1, 6)

        # The import in progress: what it does, how far, and a way to stop it.
        self.import_row = QWidget(self)
        import_layout = QHBoxLayout(self.import_row)
        import_layout.setContentsMargins(0, 0, 0, 0)
        self.import_label = QLabel(self.import_row)
        self.import_label.setWordWrap(True)
        self.progress_bar = QProgressBar(self.import_row)
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setAccessibleName("Import progress")
        self.cancel_button = QPushButton("Ca&ncel import", self.import_row)
        self.cancel_button.clicked.connect(self.cancel_import)
        column = QVBoxLayout()
        column.addWidget(self.import_label)
        column.addWidget(self.progress_bar)
        import_layout.addLayout(column, 1)
        import_layout.addWidget(self.cancel_button, 0, Qt.AlignmentFlag.AlignBottom)
        self.import_row.hide()

        # The last outcome ("Imported …", "The import was cancelled …").
        self.status_label = QLabel(self)
        self.status_label.setWordWrap(True)
        self._paint_muted(self.status_label)

        self.add_button = QPushButton("&Add model folder…", self)
        self.add_button.setToolTip("A Hugging Face model folder: config.json, *.safetensors and tokenizer.json")
        self.add_button.clicked.connect(self.choose_folder)
        self.import_button = QPushButton("&Import GGUF file…", self)
        self.import_button.setToolTip("A llama.cpp .gguf file, converted once into Tandem's models folder")
        self.import_button.clicked.connect(self.choose_gguf)
        self.get_button = QPushButton("&Get models…", self)
        self.get_button.setToolTip("Search Hugging Face for GGUF and safetensors models, and download one")
        self.get_button.clicked.connect(self.open_get_models)
        self.remove_button = QPushButton("&Remove…", self)
        self.remove_button.clicked.connect(self.remove_selected)
        self.close_button = QPushButton("&Close", self)
        self.close_button.clicked.connect(self.reject)
        self.close_button.setAutoDefault(False)
        for button in (self.get_button, self.add_button, self.import_button, self.remove_button, self.cancel_button):
            button.setAutoDefault(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.get_button)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.import_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)

        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.import_row)
        layout.addWidget(self.status_label)
        layout.addLayout(buttons)

        QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.model_list, self.remove_selected)
        order = [self.model_list, *self.load_choices.tab_order(), self.get_button, self.add_button, self.import_button,
                 self.remove_button, self.close_button, self.cancel_button]
        for first, second in zip(order, order[1:]):
            QWidget.setTabOrder(first, second)

        em = self.fontMetrics().averageCharWidth()
        # Tall enough for the details with both notes; they scroll in a shorter window.
        self.resize(em * 128, self.fontMetrics().lineSpacing() * 38)
        self.refresh()
        self.model_list.setFocus()

    # -- the list ----------------------------------------------------------------

    def set_engine_settings(
        self, device: str = "auto", dtype: str = "auto", kv_cache_mb: int | None = None, page_size: int = 16
    ) -> None:
        """The engine settings the "Memory to run" estimate assumes."""
        self._engine_settings = {"device": device, "dtype": dtype, "kv_cache_mb": kv_cache_mb, "page_size": page_size}
        self.show_selected()

    def refresh(self, select_id: str | None = None) -> None:
        """Re-read the registry and the models' details."""
        current = select_id or self.selected_id() or DEFAULT_MODEL_ID
        self._details.clear()
        self.model_list.clear()
        chosen: QTreeWidgetItem | None = None
        for entry in self.registry.models():
            details = self._details_of(entry.id)
            size = format_bytes(details.size_on_disk_bytes) if isinstance(details, ModelDetails) else "—"
            name = entry.name if entry.available() else f"{entry.name} (missing)"
            item = QTreeWidgetItem([name, entry.kind_label, size])
            item.setData(0, Qt.ItemDataRole.UserRole, entry.id)
            item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setToolTip(0, display_path(entry.path) if entry.path else "Built into Tandem")
            self.model_list.addTopLevelItem(item)
            if entry.id == current:
                chosen = item
        self.model_list.setCurrentItem(chosen or self.model_list.topLevelItem(0))
        self.show_selected()

    def selected_id(self) -> str | None:
        item = self.model_list.currentItem()
        return None if item is None else item.data(0, Qt.ItemDataRole.UserRole)

    def _details_of(self, model_id: str) -> ModelDetails | ModelError:
        if model_id not in self._details:
            try:
                self._details[model_id] = self.registry.details(model_id)
            except ModelError as exc:
                self._details[model_id] = exc
            except Exception as exc:  # a bug must not take the dialog down
                log.exception("details of %s", model_id)
                self._details[model_id] = ModelError(f"The details could not be read: {exc}")
        return self._details[model_id]

    def show_selected(self) -> None:
        """Show the selected model's details (again, after a change)."""
        model_id = self.selected_id()
        self._update_buttons()
        if model_id is None:
            self.details_box.setTitle("Details")
            return
        entry = self.registry.get(model_id) if self._known(model_id) else None
        details = self._details_of(model_id)
        self.details_box.setTitle(entry.name if entry else "Details")
        labels = self.detail_labels
        if isinstance(details, ModelError):
            for label in labels.values():
                label.setText("—")
            self._set_location(display_path(entry.path) if entry and entry.path else "—")
            self.details_error.setText(str(details))
            self.details_error.show()
            self.load_choices.show_unreadable()
            return
        self.details_error.hide()
        labels["architecture"].setText(details.architecture)
        labels["parameters"].setText(format_parameters(details.parameters))
        labels["parameters"].setToolTip(f"{details.parameters:,} parameters")
        labels["context"].setText(f"{details.context_length:,} tokens")
        labels["dtype"].setText(details.dtype)
        labels["size"].setText(format_bytes(details.size_on_disk_bytes))
        self._set_location(display_path(details.path) if details.path else "Imported on first use")
        labels["source"].setText(details.source)
        quantize = entry.quantize if entry is not None and not details.quantized else None
        estimate = self._estimate(details, quantize, entry.max_context if entry is not None else None)
        if isinstance(estimate, EngineError):  # e.g. CUDA chosen in the settings, none here
            labels["memory"].setText(str(estimate))
            labels["arithmetic"].setText("")
        else:
            where = "this computer's memory" if estimate.device == "cpu" else "the GPU"
            labels["memory"].setText(f"{estimate.describe()}, in {where}")
            labels["arithmetic"].setText(describe_arithmetic(estimate.weights, estimate.dtype))
            labels["arithmetic"].setToolTip(explain_arithmetic(estimate.weights, estimate.dtype))
        self.load_choices.show(model_id, entry, details, estimate)

    def _estimate(
        self, details: ModelDetails, quantize: str | None, max_context: int | None
    ) -> MemoryEstimate | EngineError:
        """What loading the model takes with these choices and the engine settings (the
        registry's estimate, on the details read already)."""
        try:
            return estimate_memory(
                details.shape, **self._engine_settings, stored=details.stored,  # type: ignore[arg-type]
                quantize=quantize, max_context=max_context,
            )
        except EngineError as exc:
            return exc

    @property
    def can_reload(self) -> bool:
        """Whether the dialog can reload a model (the window gave it a way to)."""
        return self._reload_model is not None

    def reload_model(self, model_id: str) -> object:
        assert self._reload_model is not None
        return self._reload_model(model_id)

    def _set_location(self, text: str) -> None:
        self.location_field.setText(text)
        self.location_field.setCursorPosition(0)
        self.location_field.setToolTip(text)

    def _known(self, model_id: str) -> bool:
        return any(entry.id == model_id for entry in self.registry.models())

    def _update_buttons(self) -> None:
        busy = self._job is not None
        model_id = self.selected_id()
        in_use = model_id is not None and self._is_in_use(model_id)
        removable = model_id is not None and model_id != DEFAULT_MODEL_ID and not in_use
        self.add_button.setEnabled(not busy)
        self.import_button.setEnabled(not busy)
        self.remove_button.setEnabled(removable and not busy)
        if model_id == DEFAULT_MODEL_ID:
            self.remove_button.setToolTip("The built-in model cannot be removed")
        elif in_use:
            self.remove_button.setToolTip("A pane runs this model; switch it to another model first")
        else:
            self.remove_button.setToolTip("Remove the selected model from the list (Delete)")

    # -- adding a folder -----------------------------------------------------------

    def open_get_models(self) -> GetModelsDialog:
        """The Get models dialog (one at a time); a model it downloads joins the list."""
        if self.get_models is None:
            device = str(self._engine_settings.get("device") or "auto")
            self.get_models = GetModelsDialog(self.registry, self, device=device)
            self.get_models.model_added.connect(self._model_downloaded)
        self.get_models.show()
        self.get_models.raise_()
        self.get_models.activateWindow()
        return self.get_models

    def _model_downloaded(self, model_id: str) -> None:
        self.refresh(select_id=model_id)
        self.models_changed.emit()

    def choose_folder(self) -> None:
        dialog = QFileDialog(self, "Add a model folder")
        dialog.setFileMode(QFileDialog.FileMode.Directory)
        dialog.setOption(QFileDialog.Option.ShowDirsOnly, True)
        dialog.setDirectory(str(start_folder()))
        dialog.fileSelected.connect(remember)
        dialog.fileSelected.connect(self.add_folder)
        self.file_dialog = dialog
        dialog.open()

    def add_folder(self, path: str | Path) -> ModelEntry | None:
        """Check and register a folder; a refusal is shown, nothing registered."""
        try:
            entry = self.registry.add_folder(path)
        except ModelError as exc:
            self.show_error("The folder was not added", str(exc))
            return None
        self.status_label.setText(f"Added “{entry.name}”.")
        self.refresh(select_id=entry.id)
        self.models_changed.emit()
        return entry

    # -- importing a GGUF file -------------------------------------------------------

    def choose_gguf(self) -> None:
        dialog = QFileDialog(self, "Import a GGUF file")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setNameFilters(["GGUF models (*.gguf)", "All files (*)"])
        dialog.setDirectory(str(start_folder()))
        dialog.fileSelected.connect(remember)
        dialog.fileSelected.connect(self.import_gguf)
        self.file_dialog = dialog
        dialog.open()

    @property
    def importing(self) -> bool:
        return self._job is not None

    def import_gguf(self, path: str | Path) -> None:
        """Start importing `path` on a background thread; returns at once."""
        if self._job is not None:
            return
        job = _ImportJob(Path(path), threading.Event())
        registry = self.registry

        def work(report: Callable[[LoadProgress], None]) -> ModelEntry:
            return registry.import_gguf(job.path, on_progress=report, cancel=job.cancel)

        job.job = BackgroundJob(self, "gguf-import", work, lambda entry, error: self._imported(job, entry, error),
                                on_progress=lambda progress: self._import_progress(job, progress))
        self._job = job
        self.import_label.setText(f"Reading {job.path.name}…")
        self.progress_bar.setRange(0, 0)  # busy until the first report
        self.cancel_button.setEnabled(True)
        self.import_row.show()
        self.status_label.clear()
        self._update_buttons()
        job.job.start()
        self.cancel_button.setFocus()

    def cancel_import(self) -> None:
        if self._job is not None:
            self._job.cancel.set()
            self.cancel_button.setEnabled(False)
            self.import_label.setText(f"Cancelling the import of {self._job.path.name}…")

    def _import_progress(self, job: _ImportJob, progress: LoadProgress) -> None:
        if job.cancel.is_set():
            return
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(round(progress.fraction * 1000))
        self.import_label.setText(progress.detail)

    def _imported(self, job: _ImportJob, entry: ModelEntry | None, error: BaseException | None) -> None:
        self._job = None
        self.import_row.hide()
        if entry is not None:
            self.status_label.setText(f"Imported {job.path.name} as “{entry.name}”.")
            self.refresh(select_id=entry.id)
            self.models_changed.emit()
        elif isinstance(error, ImportCancelledError):
            self.status_label.setText(str(error))
            self._update_buttons()
        else:
            self._update_buttons()
            message = str(error) if isinstance(error, ModelError) else f"Unexpected error: {error!r}"
            if not isinstance(error, ModelError):
                log.error("GGUF import failed", exc_info=error)
            if self.isVisible():
                self.show_error(f"{job.path.name} was not imported", message)
            else:
                self.status_label.setText(message)

    def wait_for_import(self, timeout: float) -> bool:
        """Block until the running import's thread ends (for tests and shutdown)."""
        job = self._job
        return job is None or job.job is None or job.job.join(timeout)

    # -- removing ----------------------------------------------------------------

    def remove_selected(self) -> None:
        """Ask, then remove the selected model."""
        model_id = self.selected_id()
        if model_id is None or not self.remove_button.isEnabled():
            return
        entry = self.registry.get(model_id)
        if entry.kind in ("gguf", "download"):
            details = self._details.get(model_id)
            size = f" ({format_bytes(details.size_on_disk_bytes)})" if isinstance(details, ModelDetails) else ""
            source = f" The original file {entry.source.name} is kept." if entry.source and not entry.downloaded else ""
            copy = "downloaded" if entry.downloaded else "imported"
            text = f"Remove “{entry.name}”? Its {copy} copy{size} will be deleted.{source}"
        else:
            where = display_path(entry.path) if entry.path else "it"
            text = f"Remove “{entry.name}” from the list? The folder {where} itself is not deleted."
        box = QMessageBox(
            QMessageBox.Icon.Question, "Remove model", text,
            QMessageBox.StandardButton.Cancel, self,
        )
        remove = box.addButton("&Remove", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.confirm_box = box

        def finished(_result: int) -> None:
            self.confirm_box = None
            if box.clickedButton() is remove:
                self.remove_model(model_id)

        box.finished.connect(finished)
        box.open()

    def remove_model(self, model_id: str) -> bool:
        """Remove without asking; a failure is shown."""
        try:
            entry = self.registry.remove(model_id)
        except ModelError as exc:
            self.show_error("The model was not removed", str(exc))
            return False
        self.status_label.setText(f"Removed “{entry.name}”.")
        self.refresh(select_id=DEFAULT_MODEL_ID)
        self.models_changed.emit()
        return True

    # -- errors, closing -------------------------------------------------------------

    def show_error(self, title: str, message: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.error_box = box

        def finished(_result: int) -> None:
            if self.error_box is box:
                self.error_box = None

        box.finished.connect(finished)
        box.open()

    def done(self, result: int) -> None:
        # Closing the dialog stops an import it started: the user can no
        # longer see it or cancel it.
        self.cancel_import()
        if self.get_models is not None and self.get_models.isVisible():
            self.get_models.done(result)  # pauses its download; Resume continues next time
        super().done(result)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._paint_muted(self.status_label)  # follow a theme switch

    def _paint_muted(self, label: QLabel) -> None:
        palette = label.palette()
        palette.setColor(QPalette.ColorRole.WindowText, muted_text_color(self.palette()))
        label.setPalette(palette)
