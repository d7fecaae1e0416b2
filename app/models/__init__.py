"""The models a user has: ModelRegistry (models.json: the default model, added folders, imported GGUF
files, per-model choices), folder and GGUF checks, import jobs, and the memory estimate (which calls
the engine's own sizing rules).
"""
