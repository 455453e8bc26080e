"""HELM's prompt fitting (`InContextLearningAdapter._make_prompt_fit`): a prompt that does not fit the model's
context with room for `max_tokens` loses its last few-shot example, one at a time; with none left, it is cut from
the right to the longest text that fits. Tokens are counted as the engine tokenizes the prompt, so a fitted
prompt never becomes a "too long" error row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PromptWindow:
    """The model's tokenizer and context length (HELM's window service for one model)."""

    tokenizer: object
    context: int

    def __post_init__(self) -> None:
        if not isinstance(self.context, int) or self.context < 1:
            raise ValueError(f"context={self.context!r} is invalid: expected a positive number of tokens")

    def num_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def fits(self, text: str, max_tokens: int) -> bool:
        return self.num_tokens(text) + max_tokens <= self.context

    def truncate_from_right(self, text: str, max_tokens: int) -> str:
        """The longest start of `text` that fits: the first tokens that fit, decoded, then characters dropped
        from the end while the decoded text still tokenizes too long. With no room at all, `text` unchanged
        (the engine then reports the request's max_tokens as the problem)."""
        room = self.context - max_tokens
        if room < 1 or self.fits(text, max_tokens):
            return text
        ids = self.tokenizer(text)["input_ids"][:room]
        result = self.tokenizer.decode(ids, skip_special_tokens=True)
        while result and not self.fits(result, max_tokens):
            result = result[:-1]
        return result


def load_window(model_dir: Path) -> PromptWindow:
    from engine.spec import load_model_spec
    from engine.tokenizer import load_tokenizer

    return PromptWindow(load_tokenizer(model_dir), load_model_spec(model_dir).max_position_embeddings)


def fit_prompt(window: PromptWindow, max_tokens: int, make_prompt, train: list) -> tuple[str, int, bool]:
    """(prompt, train examples kept, truncated) for `make_prompt(examples)`: the longest prefix of `train` whose
    prompt fits; with none, the prompt without examples, cut from the right when it still does not fit."""
    shots = list(train)
    while shots:
        prompt = make_prompt(shots)
        if window.fits(prompt, max_tokens):
            return prompt, len(shots), False
        shots.pop()
    prompt = make_prompt([])
    cut = window.truncate_from_right(prompt, max_tokens)
    return cut, 0, len(cut) < len(prompt)
