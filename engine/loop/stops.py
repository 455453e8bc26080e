"""Stop strings found as tokens arrive, at a cost per token that does not grow with the completion.

The rule is unchanged: a row stops at the first token after which the completion decoded so far
(`tokenizer.decode(tokens, skip_special_tokens=True)`) contains a stop string, and its text is that decode cut
before the first stop string. Decoding the whole completion at every step made a long generation quadratic in
its length; instead the text grows by `tokenizers`' DecodeStream (which holds back a character until its bytes
are complete) and only the tail that a new chunk can complete a stop string in is searched. A hit is
confirmed, and cut, on the full decode, so the text is the full decode's.

The stream's text equals the full decode for the tokenizers flexbatch loads (`TokenizersBackend`, whose decode
is the Rust decoder's), but not where transformers cleans up tokenization spaces, and there is no stream for a
tokenizer without a Rust backend: those rows decode in full at every step, as before. As a guard, a row that
ends without a stop compares the stream's text with its full decode; were they to differ, the row is scanned
again token by token, the old way, and cut where that finds a stop."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tokenizers.decoders import DecodeStream

log = logging.getLogger(__name__)
REPLACEMENT = "\ufffd"  # what a decode shows for bytes of an incomplete character (the stream holds them back)


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index of the earliest stop string in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def full_text(tokenizer, tokens: Sequence[int]) -> str:
    return tokenizer.decode(list(tokens), skip_special_tokens=True)


def stream_backend(tokenizer, stops: Sequence[str]):
    """The Rust tokenizer a DecodeStream can follow, or None where the stream's text could differ from
    `full_text` (transformers' clean-up of spaces, no Rust backend, a stop string with the replacement char)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    return None if any(REPLACEMENT in s for s in stops) else backend


class StopScanner:
    """One row's stop-string check. `check(tokens)` after each generated token (EOS excluded) and `settle(tokens,
    text)` when the row ends otherwise both answer where the old check stops the row: (tokens kept, text) or
    None."""

    def __init__(self, stops: Sequence[str], tokenizer, incremental: bool = True):
        self.stops, self.tokenizer = tuple(stops), tokenizer
        self.tail = max(len(s) for s in self.stops) - 1  # text before a new chunk that a stop may start in
        self.backend = stream_backend(tokenizer, self.stops) if incremental else None
        self.stream = DecodeStream(skip_special_tokens=True) if self.backend is not None else None
        self.chunks: list[str] = []  # the stream's text so far
        self.recent = ""  # its last `tail` characters

    def check(self, tokens: Sequence[int]) -> tuple[int, str] | None:
        if self.stream is not None:
            try:
                chunk = self.stream.step(self.backend, tokens[-1])
            except Exception:  # the Rust stream refuses a window whose decode does not extend the last one
                return self._rescan(tokens)
            if not chunk:
                return None
            self.chunks.append(chunk)
            window, self.recent = self.recent + chunk, (self.recent + chunk)[-self.tail:] if self.tail else ""
            if first_stop(window, self.stops) is None:
                return None
        text = full_text(self.tokenizer, tokens)
        if self.stream is not None and not self._agrees(text):
            return self._rescan(tokens)
        cut = first_stop(text, self.stops)
        return None if cut is None else (len(tokens), text[:cut])

    def settle(self, tokens: Sequence[int], text: str) -> tuple[int, str] | None:
        """For a row that ended without a stop, whose full decode is `text`."""
        return None if self.stream is None or self._agrees(text) else self._rescan(tokens)

    def _agrees(self, text: str) -> bool:
        """The stream's text is the full decode, but for the bytes of a last character still incomplete."""
        streamed = "".join(self.chunks)
        return text.startswith(streamed) and not text[len(streamed):].strip(REPLACEMENT)

    def _rescan(self, tokens: Sequence[int]) -> tuple[int, str] | None:
        """The old check, token by token, after the stream's text was found to differ from the full decode."""
        log.warning("incremental decoding differs from the full decode (%r); checking the row token by token",
                    self.recent)
        self.stream = None
        for n in range(1, len(tokens) + 1):
            text = full_text(self.tokenizer, tokens[:n])
            cut = first_stop(text, self.stops)
            if cut is not None:
                return n, text[:cut]
        return None
