"""`Workload`: what is asked of the engine (prompt and generation lengths, how many prompts, compute dtype), and
`Affine`, the form every cost and memory term takes: linear in the placement fractions, so that one formula
both prices a given `Policy` and becomes a constraint of the search's linear program."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import InvalidParamsError

KINDS = ("weight", "cache", "act")
TIERS = ("gpu", "cpu", "disk")
PLACEMENT = tuple(f"{kind}_{tier}" for kind in KINDS for tier in TIERS)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Workload:
    """prompt_len is the typical padded prompt length of a block (it prices time); max_prompt_len the longest
    (it sizes memory: the largest block must fit). gen_len is the largest max_new_tokens (it sizes the KV cache);
    expected_gen_len the tokens a row generates on average (its own max_new_tokens, or fewer where a stop string
    or EOS ends it; measured on the first blocks when known; gen_len when not given): without refill a block
    runs until its last row ends, with refill a finished row's slot takes the next row (engine/loop/refill.py).
    block_gen_len: the tokens a block runs for without refill, the mean of the rows' own max_new_tokens (the engine
    groups rows by it, so a block runs about as long as its rows may). shared_len: leading tokens every row shares,
    computed and cached once per block (engine/loop/shared_prefix.py); prompt_len and max_prompt_len then count each
    row's own tokens after them. scored_len: positions per row at which a scoring job runs the LM head in its
    prefill (prompt log-probabilities, `SamplingParams.prompt_logprobs`); 0 for generation, whose prefill runs it at
    the last position only."""

    prompt_len: int
    gen_len: int
    num_prompts: int
    max_prompt_len: int | None = None
    dtype: str = "bfloat16"
    expected_gen_len: float | None = None
    block_gen_len: float | None = None  # tokens a block runs for without refill (see below); gen_len when not given
    shared_len: int = 0
    scored_len: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_len", "gen_len", "num_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParamsError(f"{name}={value!r} is invalid: expected a positive integer")
        longest = self.max_prompt_len if self.max_prompt_len is not None else self.prompt_len
        if not isinstance(longest, int) or longest < self.prompt_len:
            raise InvalidParamsError(f"max_prompt_len={longest!r} is invalid: expected an integer >= prompt_len "
                                     f"({self.prompt_len})")
        object.__setattr__(self, "max_prompt_len", longest)
        expected = self.gen_len if self.expected_gen_len is None else self.expected_gen_len
        if isinstance(expected, bool) or not isinstance(expected, (int, float)) or not 1 <= expected <= self.gen_len:
            raise InvalidParamsError(f"expected_gen_len={expected!r} is invalid: expected a number in [1, gen_len "
                                     f"= {self.gen_len}]")
        object.__setattr__(self, "expected_gen_len", float(expected))
        block = self.gen_len if self.block_gen_len is None else self.block_gen_len
        if isinstance(block, bool) or not isinstance(block, (int, float)) or not expected <= block <= self.gen_len:
            raise InvalidParamsError(f"block_gen_len={block!r} is invalid: expected a number in [expected_gen_len "
                                     f"= {expected:g}, gen_len = {self.gen_len}]")
        object.__setattr__(self, "block_gen_len", float(block))
        for name in ("shared_len", "scored_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidParamsError(f"{name}={value!r} is invalid: expected an integer >= 0")
        if self.dtype not in DTYPE_BYTES:
            raise InvalidParamsError(f"dtype={self.dtype!r} is invalid: use one of {', '.join(DTYPE_BYTES)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def total_len(self) -> int:
        """T: slots of the KV cache of the longest block (prompt + generated)."""
        return self.max_prompt_len + self.gen_len


class Affine:
    """coef . x + const, where x holds the nine placement fractions in PLACEMENT order (weight_gpu, weight_cpu,
    weight_disk, cache_gpu, ..., act_disk). The unit (seconds or bytes) is the caller's."""

    __slots__ = ("coef", "const")

    def __init__(self, coef=None, const: float = 0.0):
        self.coef = np.zeros(len(PLACEMENT)) if coef is None else np.asarray(coef, dtype=float)
        self.const = float(const)

    @classmethod
    def frac(cls, name: str, scale: float = 1.0) -> Affine:
        """scale * x[name]."""
        coef = np.zeros(len(PLACEMENT))
        coef[PLACEMENT.index(name)] = scale
        return cls(coef)

    @classmethod
    def of(cls, names, scale: float = 1.0) -> Affine:
        """scale * (sum of x[name] for name in names)."""
        return sum((cls.frac(n, scale) for n in names), cls())

    def __add__(self, other) -> Affine:
        if isinstance(other, Affine):
            return Affine(self.coef + other.coef, self.const + other.const)
        return Affine(self.coef, self.const + float(other))

    __radd__ = __add__

    def __mul__(self, k: float) -> Affine:
        return Affine(self.coef * float(k), self.const * float(k))

    __rmul__ = __mul__

    def __truediv__(self, k: float) -> Affine:
        return self * (1.0 / k)

    def at(self, x) -> float:
        """Value at placement x (a vector in PLACEMENT order)."""
        return float(self.coef @ np.asarray(x, dtype=float) + self.const)


def placement_vector(policy) -> np.ndarray:
    """The policy's nine fractions in PLACEMENT order."""
    return np.array([getattr(policy, name) for name in PLACEMENT], dtype=float)
