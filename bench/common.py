"""Shared bits of the benchmarks: prompts and the engine under test."""

from __future__ import annotations

import os
import platform

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
    "Give me three tips for better sleep.",
    "Explain recursion to a child.",
    "Name a fruit that is yellow.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def chat_prompts(count: int) -> list[list[dict[str, str]]]:
    # A number in each prompt keeps them distinct, so no run is a prefix-cache hit of another.
    return [chat(f"{PROMPTS[i % len(PROMPTS)]} ({i})") for i in range(count)]


def machine() -> dict[str, object]:
    return {
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
