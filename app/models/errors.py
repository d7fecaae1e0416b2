"""The errors of app.models: each says what went wrong with a model and what to do."""

from __future__ import annotations

from app.errors import AppError


class ModelError(AppError):
    """A model cannot be added, imported, removed or found. The message says why and what to do."""


class UnknownModelError(ModelError, KeyError):
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        super().__init__(f"There is no model '{model_id}'; it may have been removed. Pick another model.")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateModelError(ModelError):
    def __init__(self, message: str, existing_id: str) -> None:
        self.existing_id = existing_id
        super().__init__(message)


class NotAModelError(ModelError):
    """Not a model folder or not a GGUF file (or nothing at that path)."""


class ModelNotSupportedError(ModelError):
    """A readable model of an architecture, format or tensor type Tandem does not run."""


class ModelConfigError(ModelError):
    """config.json exists but cannot be used."""


class ModelTokenizerError(ModelError):
    """The tokenizer is missing, unreadable or does not match the model."""


class PickleOnlyError(ModelNotSupportedError):
    """Only pickle checkpoints (.bin/.pt), which can run code when loaded."""


class CorruptWeightsError(ModelError):
    """A safetensors file is unreadable, or the weights do not match config.json."""


class CorruptGGUFError(ModelError):
    """A GGUF file that is truncated, damaged or incomplete."""


class ImportCancelledError(ModelError):
    pass


class ModelStorageError(ModelError):
    """models.json or an imported folder could not be written or deleted."""


class DefaultModelError(ModelError):
    pass


class ModelUnavailableError(ModelError):
    """A registered model whose files are gone (a moved folder, an unplugged drive)."""


class InvalidContextError(ModelError):
    """A context length cap the model cannot take (not a whole number of
    tokens, less than one, or more than the model was trained for)."""


class HubError(ModelError):
    """Hugging Face answered something Tandem cannot use (no such repository, nothing it runs)."""


class HubOfflineError(HubError):
    """Hugging Face cannot be reached, or the connection was lost during a download."""


class HubSlowError(HubOfflineError):
    """The Hub kept a request open without sending enough in time (a stalled or trickling connection)."""


class HubAccessError(HubError):
    """401/403: a gated repository whose licence is not accepted, or a private one without a token."""


class ChecksumMismatchError(HubError):
    """A downloaded file whose SHA-256 is not the one the repository lists; it is deleted."""


class DownloadCancelledError(ModelError):
    """The user cancelled a download; nothing of it was kept."""


class DownloadPausedError(ModelError):
    """The user paused a download; what was downloaded is kept for Resume."""
