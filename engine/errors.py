"""Errors a user can cause. Each message says what went wrong and what to do."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""


class ModelLoadError(EngineError):
    """A model folder or file cannot be used (missing, corrupt, incomplete)."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint is readable but of an architecture or format we do not run."""


class PickleCheckpointError(ModelLoadError):
    """Only pickle checkpoints (.bin/.pt) were found; they can execute code on load."""


class InvalidModelConfigError(ModelLoadError):
    """A model configuration that cannot describe a real model (zero or
    non-dividing heads, absurd sizes, layers the tensors do not have)."""


class TokenizerError(ModelLoadError):
    """The tokenizer or chat template of a model is missing or broken."""


class PromptError(EngineError):
    """A request's prompt cannot be run (empty, too long for the model)."""


class RequestTooLargeError(PromptError):
    """A request could never fit in the model's context or the KV cache."""


class KVCacheTooSmallError(RequestTooLargeError):
    """A request fits the model's context but needs more KV-cache pages than the engine has."""


class EngineClosedError(EngineError):
    """The engine was shut down; no more requests are accepted."""


class LoadCancelled(EngineError):
    """Loading a model (a GGUF import included) was cancelled by the caller."""


class GGUFFormatError(ModelLoadError):
    """A GGUF file that is truncated, damaged or not a GGUF file at all."""


class NoWeightsError(ModelLoadError):
    """A folder without any weight file."""


class CorruptSafetensorsError(ModelLoadError):
    """A safetensors file or index that is truncated, damaged or incomplete."""


class FolderWriteError(ModelLoadError):
    """A model folder could not be written (disk full, read-only, no permission)."""


class InvalidEngineConfig(EngineError, ValueError):
    """An engine option is of the wrong type or outside its allowed values."""


class MaxContextTooLargeError(EngineError):
    """max_context asks for more tokens than the model was trained on."""

    def __init__(self, requested: int, trained: int, model: str) -> None:
        self.requested = requested
        self.trained = trained
        self.model = model
        super().__init__(
            f"max_context {requested} is more than {model}'s trained context of {trained} "
            f"tokens; use at most {trained}, or leave it unset for the whole trained context"
        )


class ExposedWithoutKeyError(EngineError, ValueError):
    """A server would listen beyond this computer without an API key."""

    def __init__(self, address: str, how: str) -> None:
        self.address = address
        super().__init__(
            f"Listening on {address} would let every computer on the network use the model "
            f"without a key; {how}."
        )


class DocumentError(EngineError):
    """A file given as a document cannot be read as text (not a regular file, too large,
    a format Tandem does not read, damaged, encrypted, or a bomb); its str() is one line."""


class DocumentCancelled(DocumentError):
    """Reading a document was cancelled by the caller."""
