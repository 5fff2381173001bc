"""fitllm: run GGUF language models inside a memory budget.

    import fitllm
    engine = fitllm.Engine("model.gguf", mem="1G", n_ctx=2048)
    engine.plan()                                    # where every byte goes, and whether it fits
    engine.generate("Once upon a time", max_tokens=32, temperature=0)
    for piece in engine.generate("The sky is", max_tokens=16, stream=True):
        print(piece, end="")
    engine.chat([{"role": "user", "content": "Say hello."}])

The same engine as the `fitllm` command line (one load path: plan, fit, charge, load), through
its C++ API. An Engine runs one generation at a time.
"""
import json
from typing import Iterator, List, Optional, Sequence, Union

__all__ = ["Engine", "Error", "ConfigError", "BudgetError", "DoesNotFitError", "parse_size", "__version__"]


class Error(RuntimeError):
    """Every error fitllm raises."""


class ConfigError(Error, ValueError):
    """A setting refused: a value out of range, settings that contradict each other."""


class BudgetError(Error, MemoryError):
    """An allocation the memory budget has no room for, refused before it was made.

    Attributes: pool ("kv", "weights", ...), requested, capacity and in_use, in bytes."""

    pool: str = ""
    requested: int = 0
    capacity: int = 0
    in_use: int = 0


class DoesNotFitError(Error):
    """The plan does not fit the budget: nothing was loaded.

    Attributes: device ("host" or the offload device), needed and budget in bytes, and plan_text,
    the plan as `fitllm plan` prints it."""

    device: str = ""
    needed: int = 0
    budget: int = 0
    plan_text: str = ""


from . import _fitllm  # noqa: E402  (the extension raises the classes above)

__version__ = _fitllm.__version__


def parse_size(size: Union[str, int]) -> int:
    """Bytes from "900M", "1.5G", "2GiB" or a number of bytes."""
    return size if isinstance(size, int) else _fitllm.parse_size(size)


class Engine:
    """A model loaded inside a memory budget.

    path: the GGUF file. mem: the budget ("2G", bytes; None: what the system offers less a margin).
    fit: when the plan does not fit, quantize the KV cache, stream layers, shorten the context.
    n_ctx, n_seq, n_batch, type_k, type_v, kv_rotation, context_shift, n_keep, n_threads: the
    context (as `fitllm run`'s -c, -np, -b, -ctk, -ctv, ...). device, n_gpu_layers, vram: offload.
    """

    def __init__(self, path: str, mem: Union[str, int, None] = None, *, fit: bool = False, mlock: bool = False,
                 stream_layers: int = -1, n_ctx: int = 2048, n_seq: int = 1, n_batch: int = 512,
                 type_k: str = "f16", type_v: str = "f16", kv_rotation: bool = True, context_shift: bool = False,
                 n_keep: int = 0, n_threads: int = 0, device: str = "", n_gpu_layers: int = -2,
                 vram: Union[str, int] = 0):
        self._engine = _fitllm.Engine.load(
            str(path), parse_size(mem) if mem is not None else 0, fit, mlock, stream_layers, device, n_gpu_layers,
            parse_size(vram), n_ctx, n_seq, n_batch, type_k, type_v, kv_rotation, context_shift, n_keep, n_threads)

    @property
    def architecture(self) -> str:
        return self._engine.architecture

    @property
    def n_vocab(self) -> int:
        return self._engine.n_vocab

    @property
    def n_ctx(self) -> int:
        """The context as planned (fit may have shortened it)."""
        return self._engine.n_ctx

    @property
    def chat_template_source(self) -> str:
        return self._engine.chat_template_source

    def plan(self) -> dict:
        """The plan this engine was loaded with: total, budget, fits, the rows (weights, kv, scratch,
        logits, overhead), fit_steps, text (as `fitllm plan` prints it) and details (its JSON)."""
        p = dict(self._engine.plan())
        p["details"] = json.loads(p.pop("json"))
        return p

    def memory(self) -> dict:
        """What every pool of every device holds now and held at most, the plan's total, peak RSS."""
        return self._engine.memory()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> List[int]:
        return self._engine.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._engine.detokenize(list(tokens))

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        return self._engine.apply_chat_template(list(messages), add_generation_prompt)

    def generate(self, prompt: str, max_tokens: int = 128, *, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, seed: Optional[int] = None,
                 stop: Sequence[str] = (), stream: bool = False, details: bool = False,
                 add_special: bool = True, parse_special: bool = True) -> Union[str, dict, Iterator[str]]:
        """The continuation of prompt: its text (details=True: a dict with tokens, finish_reason,
        timings), or with stream=True an iterator of its pieces as they come."""
        generation = self._engine.start(prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed,
                                        list(stop), add_special, parse_special)
        if stream:
            return _pieces(generation)
        for _ in _pieces(generation):
            pass
        result = generation.result()
        return result if details else result["text"]

    def chat(self, messages: Sequence[dict], max_tokens: int = 512, **options) -> Union[str, dict, Iterator[str]]:
        """The assistant's reply to a conversation ([{"role", "content"}, ...]) through the model's
        chat template; options as generate()."""
        prompt = self.apply_chat_template(messages)
        return self.generate(prompt, max_tokens, add_special=False, parse_special=True, **options)

    def generate_parallel(self, prompt: str, n: int, max_tokens: int = 128, *, temperature: float = 0.8,
                          top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                          seed: Optional[int] = None, stop: Sequence[str] = ()) -> List[dict]:
        """n continuations of prompt decoded together (seeds seed + i)."""
        return self._engine.generate_parallel(prompt, n, max_tokens, temperature, top_k, top_p, min_p,
                                              repeat_penalty, seed, list(stop))

    def perplexity(self, text: str, n_ctx: int = 512, n_chunks: int = -1, n_batch: int = 512, n_seq: int = 1) -> dict:
        """Perplexity over text as `fitllm perplexity` (llama-perplexity's method)."""
        return self._engine.perplexity(text, n_ctx, n_chunks, n_batch, n_seq)


def _pieces(generation) -> Iterator[str]:
    try:
        while True:
            piece = generation.next()
            if piece is None:
                return
            if piece:
                yield piece
    finally:
        if not generation.done:
            generation.cancel()
