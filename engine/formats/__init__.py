"""engine/formats: reading model files.

safetensors.py (weight files, headers, tensors), gguf/ (reader, tables,
tokenizer, importer), loader.py (a checkpoint folder into a DecoderModel),
weight_names.py (the weights a config calls for, by name and shape; no
torch, so the app can check folders before torch is imported), weight_memory.py (what the loaded weights take), staged_folder.py (folders
written complete or not at all), default_model.py (the built-in model),
model_json.py (the bounded reader of a folder's JSON files).
"""
