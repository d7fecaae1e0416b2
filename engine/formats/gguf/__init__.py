"""engine/formats/gguf."""
