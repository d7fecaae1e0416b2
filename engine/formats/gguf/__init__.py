"""GGUF files: the bounded reader (reader), the type and tensor-name tables (tables), the tokenizer
rebuilt from metadata (tokenizer) and the import into a safetensors folder (importer).
"""
