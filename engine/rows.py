"""Per-row generation state: tokens so far, stop conditions, and the final `Completion`."""

from __future__ import annotations

from engine.request import Completion, Request
from engine.sampling import make_generator


class RowState:
    def __init__(self, req: Request, prompt_ids: list[int], eos_ids: tuple[int, ...]):
        self.req = req
        self.prompt_ids = prompt_ids
        self.eos_ids = eos_ids
        self.generator = make_generator(req.params)
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None
        self.text: str = ""

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
            self.text = tokenizer.decode(self.tokens, skip_special_tokens=True)
            cut = _first_stop(self.text, p.stop)
            if cut is not None:
                self.text = self.text[:cut]
                self.finish = "stop"
                return
        if len(self.tokens) >= p.max_new_tokens:
            self.finish = "length"

    def completion(self, tokenizer) -> Completion:
        if self.finish != "stop":
            body = self.tokens[:-1] if self.finish == "eos" else self.tokens
            self.text = tokenizer.decode(body, skip_special_tokens=True)
        return Completion(
            id=self.req.id,
            text=self.text,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.tokens),
            finish_reason=self.finish or "length",
            token_ids=list(self.tokens),
            logprobs=list(self.logprobs) if self.req.params.logprobs else None,
        )


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
