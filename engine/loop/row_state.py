"""Per-row generation state: tokens so far, stop conditions, and the final `Completion`."""

from __future__ import annotations

from engine.loop.sampling import make_generator
from engine.loop.stops import StopScanner
from engine.request import Completion, Request


class RowState:
    def __init__(self, req: Request, prompt_ids: list[int], eos_ids: tuple[int, ...], matcher=None):
        self.req = req
        self.matcher = matcher  # the row's grammar state where its request is constrained (engine/loop/grammar.py)
        self.error: str | None = None  # why the row failed while decoding (finish "error")
        self.cut = False  # its text was cut at a stop string
        self.prompt_ids = prompt_ids
        self.shared = 0  # leading prompt tokens its block computes once for all its rows (engine/loop/shared_prefix.py)
        self.eos_ids = eos_ids
        self.generator = make_generator(req.params)
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None
        self.text: str = ""
        self.stops: StopScanner | None = None
        self.prompt_logprobs: list[float] | None = None  # with params.prompt_logprobs, set by the prefill
        self.prompt_greedy: list[bool] | None = None

    @property
    def own_ids(self) -> list[int]:
        """The prompt's tokens after the block's shared prefix: what the row's own cache holds."""
        return self.prompt_ids[self.shared :]

    @property
    def done(self) -> bool:
        return self.finish is not None

    def push(self, token: int, logprob: float | None, tokenizer) -> None:
        """Record one generated token and decide whether the row has finished."""
        if self.done:
            return
        p = self.req.params
        self.tokens.append(token)
        if p.logprobs:
            self.logprobs.append(logprob)
        if token in self.eos_ids:
            self.finish = "eos"
            return
        if p.stop:
            self.stops = self.stops or StopScanner(p.stop, tokenizer)
            hit = self.stops.check(self.tokens)
            if hit is not None:
                self._stop(*hit)
                return
        if len(self.tokens) >= p.max_new_tokens:
            self.finish = "length"

    def _stop(self, kept: int, text: str) -> None:
        """Finish at a stop string: the row keeps its first `kept` tokens (all but where a check came late)."""
        self.tokens, self.logprobs = self.tokens[:kept], self.logprobs[:kept]
        self.text, self.finish, self.cut = text, "stop", True

    def fail(self, message: str) -> None:
        """End the row as an error (its Completion carries `message`); the batch's other rows go on."""
        self.finish, self.error = "error", message

    def completion(self, tokenizer) -> Completion:
        if self.finish == "error":
            return Completion.failed(self.req.id, self.error or "failed", len(self.prompt_ids))
        if not self.cut:
            body = self.tokens[:-1] if self.finish == "eos" else self.tokens
            self.text = tokenizer.decode(body, skip_special_tokens=True)
            hit = self.stops and self.stops.settle(body, self.text)
            if hit:
                self._stop(*hit)
        return Completion(
            id=self.req.id,
            text=self.text,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.tokens),
            finish_reason=self.finish or "length",
            token_ids=list(self.tokens),
            logprobs=list(self.logprobs) if self.req.params.logprobs else None,
            prompt_logprobs=self.prompt_logprobs,
            prompt_greedy=self.prompt_greedy,
        )
