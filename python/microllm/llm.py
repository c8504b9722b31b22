"""Batched generation with vLLM's names: LLM, SamplingParams, RequestOutput, CompletionOutput.

    from microllm import LLM, SamplingParams
    llm = LLM("models/Qwen2.5-0.5B-Instruct", max_batch=8)
    for out in llm.generate(["Hello", "The sky is"], SamplingParams(temperature=0, max_tokens=32)):
        print(out.prompt, "->", out.outputs[0].text)

The requests run through the C++ serving engine (generate::Engine: continuous batching over a paged KV cache)
with the GIL released; this module is the glue around microllm._microllm._Engine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from ._microllm import Model, _Engine, load_model

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


@dataclass
class SamplingParams:
    """How one request samples and when it ends (vLLM's defaults: temperature 1, max_tokens 16).

    temperature 0 is greedy. seed None draws a fresh seed per request; a seed makes the text repeatable.
    stop: strings that end the text (not included). The model folder's eos ids end it too unless ignore_eos.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    seed: Optional[int] = None
    stop: Union[str, Sequence[str], None] = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False

    def to_dict(self) -> dict:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little")
        top_k = 0 if self.top_k is None or self.top_k < 0 else self.top_k  # vLLM's -1: off
        return {
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": int(top_k),
            "min_p": float(self.min_p),
            "max_tokens": int(self.max_tokens),
            "seed": seed,
            "stop": stop,
            "repetition_penalty": float(self.repetition_penalty),
            "presence_penalty": float(self.presence_penalty),
            "frequency_penalty": float(self.frequency_penalty),
            "ignore_eos": bool(self.ignore_eos),
        }


@dataclass
class CompletionOutput:
    """One completion of a request: its text, the generated ids, and why it ended ("stop", "length" or "abort")."""

    index: int
    text: str
    token_ids: List[int]
    finish_reason: str


@dataclass
class RequestOutput:
    """A request's result as vLLM returns it; .text, .token_ids and .finish_reason are its one completion's."""

    prompt: Union[str, List[int]]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = True

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> List[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason


class LLM:
    """A model folder served by the continuous-batching engine.

    max_batch: sequences decoded together; kv_blocks: KV cache blocks of block_size tokens (0: 1 GiB on the CPU,
    half the free memory on CUDA); prefill_chunk: prompt tokens per prefill forward.
    """

    def __init__(self, model: Union[str, os.PathLike, Model], device: str = "cpu", dtype: str = "f32",
                 max_batch: int = 32, kv_blocks: int = 0, block_size: int = 16, prefill_chunk: int = 512):
        self.model = model if isinstance(model, Model) else load_model(os.fspath(model), device=device, dtype=dtype)
        self._engine = _Engine(self.model, max_batch=max_batch, kv_blocks=kv_blocks, block_size=block_size,
                               prefill_chunk=prefill_chunk)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def generate(self, prompts: Union[str, List[int], Sequence[Union[str, List[int]]]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None
                 ) -> List[RequestOutput]:
        """Runs every prompt (text, or a list of ids) to its end, batched; one RequestOutput per prompt, in order.

        sampling_params: one SamplingParams for all, or one per prompt.
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params.to_dict() for _ in prompts]
        else:
            params = [p.to_dict() for p in sampling_params]
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts and {len(params)} SamplingParams")
        results = self._engine.generate(prompts, params)
        return [
            RequestOutput(prompt=prompt, prompt_token_ids=r["prompt_token_ids"],
                          outputs=[CompletionOutput(0, r["text"], r["token_ids"], r["finish_reason"])])
            for prompt, r in zip(prompts, results)
        ]

    def stats(self) -> dict:
        """The engine's counters: steps, decode steps, prefill forwards, tokens."""
        return self._engine.stats()
