"""The default path on the real default model, against a plain PyTorch
reference of what its kernels compute.

The reference reads the imported folder's weights (dequantized exactly:
every q4_1 and q8_0 weight is a float32 number), prepares each product's
input in float32 as the kernels do (the fused RMSNorm and SwiGLU), rounds
it to int8 in groups of 32 (ggml's q8 activations: scale = max|x| / 127,
round half to even), and does all the rest in float64: the products, RoPE,
causal attention, the residual stream.

The float32 preparation matters, bit for bit: an embedding row is a q8_0
table's levels times one scale, so after the first norm many inputs land
exactly on a rounding tie, where any other arithmetic rounds some of them
the other way and moves the logits by up to ~2 (as much as dropping the
rounding altogether). Further in, an input can still sit within an ulp of a
tie; where it does, the two sides round it apart and the row moves by one
int8 step of its group. So the layers are compared one at a time from the
engine's own input (bounds below), the head from the engine's own final
hidden states, and the whole chain by its greedy tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.core.scheduler import ScheduledChunk, ScheduleResult
from engine.formats.loader import load_model, read_weights
from engine.llm import Engine
from engine.model.config import ModelConfig, rope_inverse_frequencies
from engine.model.quant import GROUP_SIZE, QuantLinear, cpu_kernel_available
from engine.params import SamplingParams
from engine.runner.cpu import ModelRunner

pytestmark = pytest.mark.skipif(not cpu_kernel_available(), reason="the quantized CPU kernels are unavailable")

LOGIT_BOUND = 1e-3
ROW_BOUND = 1e-5
FLIP_BOUND = 1e-3
PROMPT = [{"role": "user", "content": "Which planet is the largest in the solar system, and why is it so big?"}]
NEW_TOKENS = 12


def rounded_to_int8_groups(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels quantize a product's inputs, back in float64."""
    groups = x.float().reshape(*x.shape[:-1], -1, GROUP_SIZE)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    levels = torch.round(groups * inverse).clamp(-127, 127)
    # The levels come from the fp32 scale, the products use it in fp16 (ggml's block_q8_0.d).
    return (levels.double() * scale.half().double()).reshape(x.shape)


class Reference:
    """The Llama forward in float64 with int8-rounded product inputs."""

    def __init__(self, folder: Path) -> None:
        self.c = ModelConfig.from_folder(folder)
        self.w = {name: t.double() for name, t in read_weights(folder).items()}
        self.inv_freq = torch.tensor(rope_inverse_frequencies(self.c), dtype=torch.float64)

    def product(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return rounded_to_int8_groups(x) @ self.w[name].T

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """RMSNorm as the kernels fuse it: the squares summed in float64 in
        order (a cumulative sum adds them in the kernel's order), the rest in
        float32."""
        squares = x.float().double().pow(2).cumsum(-1)[..., -1:]
        mean_square = (squares / x.shape[-1]).float()
        # sqrtf and 1/x, correctly rounded (torch's float32 sqrt is not
        # always): done in float64, then rounded once to float32.
        root = torch.sqrt((mean_square + torch.tensor(self.c.rms_norm_eps, dtype=torch.float32)).double()).float()
        inverse = (1 / root.double()).float()
        return x.float() * inverse * self.w[name].float()

    @staticmethod
    def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.float(), up.float()
        return gate / (1 + torch.exp(-gate)) * up

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = torch.outer(positions.to(self.inv_freq.dtype), self.inv_freq)
        emb = torch.cat((freqs, freqs), -1)[:, None, :]
        half = x.shape[-1] // 2
        return x * emb.cos() + torch.cat((-x[..., half:], x[..., :half]), -1) * emb.sin()

    def layer(
        self, i: int, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Layer i on the residual stream x [tokens, hidden] of one prompt's
        next tokens, after `past` (the layer's keys and values of the tokens
        before them); returns its output and the keys and values so far."""
        c = self.c
        t = x.shape[0]
        start = 0 if past is None else past[0].shape[0]
        heads, kv_heads, dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        positions = torch.arange(start, start + t)
        causal = torch.arange(start + t)[None, :] <= positions[:, None]
        p = f"model.layers.{i}."
        h = self.norm(x, p + "input_layernorm.weight")
        q = self.rotate(self.product(h, p + "self_attn.q_proj.weight").view(t, heads, dim), positions)
        k = self.rotate(self.product(h, p + "self_attn.k_proj.weight").view(t, kv_heads, dim), positions)
        v = self.product(h, p + "self_attn.v_proj.weight").view(t, kv_heads, dim)
        if past is not None:
            k, v = torch.cat((past[0], k)), torch.cat((past[1], v))
        group = heads // kv_heads
        keys, values = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(dim)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        attn = torch.einsum("hqk,khd->qhd", probs, values).reshape(t, heads * dim)
        x = x + self.product(attn, p + "self_attn.o_proj.weight")
        h = self.norm(x, p + "post_attention_layernorm.weight")
        gate = self.product(h, p + "mlp.gate_proj.weight")
        up = self.product(h, p + "mlp.up_proj.weight")
        return x + self.product(self.swiglu(gate, up), p + "mlp.down_proj.weight"), (k, v)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from the last layer's output: torch's RMSNorm in float32 (as
        the engine's last step), then the rounded product with the head."""
        c = self.c
        final = torch.nn.functional.rms_norm(x.float(), (c.hidden_size,), self.w["model.norm.weight"].float(),
                                             c.rms_norm_eps)
        return self.product(final, "lm_head.weight" if "lm_head.weight" in self.w else "model.embed_tokens.weight")

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        """The greedy continuation of `ids`: the prompt in one pass, then one
        token at a time over the kept keys and values."""
        past: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.c.num_hidden_layers
        chosen: list[int] = []
        feed = list(ids)
        for _ in range(new_tokens):
            x = self.w["model.embed_tokens.weight"][torch.tensor(feed)]
            for i in range(self.c.num_hidden_layers):
                x, past[i] = self.layer(i, x, past[i])
            feed = [int(self.head(x)[-1].argmax())]
            chosen.append(feed[0])
        return chosen


@pytest.fixture(scope="module")
def reference(default_model_dir: Path) -> Reference:
    return Reference(default_model_dir)


@pytest.fixture(scope="module")
def prompt_ids(default_model_dir: Path) -> list[int]:
    with Engine(default_model_dir, device="cpu") as engine:
        return engine.encode_prompt(PROMPT)


def _native_layer_inputs(model, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The default path on `ids` in one prefill: the residual stream entering
    each layer (what its fused q/k/v product reads), the LM head's input and
    the logits."""
    streams: list[torch.Tensor] = []
    original = QuantLinear.product_into

    def record(self, x, out, **kwargs):  # type: ignore[no-untyped-def]
        if any(self is layer.qkv for layer in model.layers):
            streams.append(x.clone())
        original(self, x, out, **kwargs)

    QuantLinear.product_into = record  # type: ignore[method-assign]
    try:
        runner = ModelRunner(model, model.new_kv_cache(16, 16))
        seq = SimpleNamespace(token_ids=ids, pages=list(range(16)), sampler=None)
        step = ScheduleResult(decodes=[], prefills=[ScheduledChunk(seq, 0, len(ids))])  # type: ignore[arg-type]
        hidden, _, _ = runner.forward(step)
    finally:
        QuantLinear.product_into = original  # type: ignore[method-assign]
    return streams, hidden, model.logits(hidden)


def test_every_layer_of_the_default_path_matches_the_reference(
    default_model_dir: Path, reference: Reference, prompt_ids
) -> None:
    model = load_model(default_model_dir, "cpu")
    assert model.native_forward  # the default path: quantized kernels on the CPU
    streams, hidden, logits = _native_layer_inputs(model, prompt_ids)
    assert len(streams) == reference.c.num_hidden_layers
    # Layer by layer from the same input, so no error is carried from earlier
    # layers. Most rows agree to float32 summation (ROW_BOUND of the
    # stream's size); a row where an input sat within an ulp of a rounding
    # tie moves by a step of its int8 group (FLIP_BOUND at most). A wrong
    # layout, scale or offset anywhere would move every row by O(1).
    for i, (entering, leaving) in enumerate(zip(streams, streams[1:])):
        want, _ = reference.layer(i, entering.double())
        rows = (leaving.double() - want).abs().amax(-1) / want.abs().amax()
        assert rows.max() <= FLIP_BOUND, i
        assert (rows > ROW_BOUND).float().mean() <= 0.1, i
    # The head from the same final hidden states: the logits themselves.
    want = reference.product(hidden, "model.embed_tokens.weight")
    assert (logits.double() - want).abs().max() <= LOGIT_BOUND
    assert torch.equal(logits.argmax(-1), want.argmax(-1))
    # The bound is tight: without the inputs' int8 rounding, the same head
    # moves the logits by far more than it.
    assert (hidden.double() @ reference.w["model.embed_tokens.weight"].T - want).abs().max() > 100 * LOGIT_BOUND


def test_default_engine_decodes_the_reference_greedy_tokens(
    default_model_dir: Path, reference: Reference, prompt_ids
) -> None:
    with Engine(default_model_dir, device="cpu") as engine:
        assert not engine.deterministic
        out = engine.generate_outputs([prompt_ids], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))[0]
    assert out.token_ids == reference.greedy(prompt_ids, NEW_TOKENS)
