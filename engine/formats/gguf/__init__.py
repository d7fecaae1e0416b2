"""GGUF files: the bounded reader (reader), the type and tensor-name tables of each family (tables),
each family's metadata as config.json fields (hparams), the tokenizer rebuilt from metadata
(tokenizer) and the import into a safetensors folder (importer).
"""
