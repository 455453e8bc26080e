"""Incremental stop strings: a row ends where decoding the whole completion at every step ended it, with the
same text, token count and finish reason, on byte-level, Metaspace and special-token tokenizers, for stop
strings inside one token and spanning several, and for token runs that split a character's bytes."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from engine.loop.row_state import RowState
from engine.loop.stops import StopScanner, stream_backend
from engine.request import Request, SamplingParams
from engine.tokenizer import load_tokenizer

TEXT = ("The quick brown fox jumps over the lazy dog. Ünïcödé ✓ — naïve café, 12 + 30 = 42.\n"
        "def add(a, b):\n    return a + b\n") * 8


def reference(tokens: list[int], tokenizer, stops: tuple[str, ...], max_new: int) -> tuple[str, int, str]:
    """The check as it was: decode the whole completion after every token, cut before the first stop."""
    for n in range(1, min(len(tokens), max_new) + 1):
        text = tokenizer.decode(tokens[:n], skip_special_tokens=True)
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            return "stop", n, text[:min(hits)]
    n = min(len(tokens), max_new)
    return "length", n, tokenizer.decode(tokens[:n], skip_special_tokens=True)


def pushed(tokens: list[int], tokenizer, stops: tuple[str, ...], max_new: int) -> tuple[str, int, str]:
    row = RowState(Request("r", "", SamplingParams(max_new_tokens=max_new, stop=stops, logprobs=True)), [1], ())
    for t in tokens:
        row.push(t, -1.0, tokenizer)
        if row.done:
            break
    c = row.completion(tokenizer)
    assert len(c.logprobs) == len(c.token_ids) == c.completion_tokens
    return c.finish_reason, c.completion_tokens, c.text


def metaspace_tokenizer() -> TokenizersBackend:
    """A SentencePiece-style tokenizer (Metaspace: a leading space marker, stripped at the start of a decode)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>",
                                                                                         *byte_tokens]))
    return TokenizersBackend(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def token_runs(tokenizer, seed: int) -> list[list[int]]:
    """Encoded text (stops found inside and across tokens) and random ids (split characters, special tokens)."""
    rng = random.Random(seed)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    start = rng.randrange(len(ids) // 2)
    return [ids[start:start + 120], [rng.randrange(len(tokenizer)) for _ in range(120)]]


def stops_for(text: str, rng: random.Random) -> list[tuple[str, ...]]:
    """Substrings of the decoded run at random places and lengths (spanning tokens), a stop that never occurs,
    and several at once."""
    picks = []
    for _ in range(6):
        if len(text) < 8:
            break
        i = rng.randrange(len(text) - 6)
        picks.append(text[i:i + rng.randrange(1, 7)])
    return [(s,) for s in picks] + [("never-there-§",), tuple(picks[:3]) + ("never-there-§",)]


def _tokenizers(checkpoint, chat_checkpoint, demo_model_dir):
    return {"byte-level": load_tokenizer(checkpoint("llama_tied")), "demo": load_tokenizer(demo_model_dir),
            "special tokens": load_tokenizer(chat_checkpoint("llama3")), "metaspace": metaspace_tokenizer()}


def test_incremental_stops_end_rows_as_full_decodes_did(checkpoint, chat_checkpoint, demo_model_dir):
    rng = random.Random(0)
    stopped = 0
    for name, tok in _tokenizers(checkpoint, chat_checkpoint, demo_model_dir).items():
        assert stream_backend(tok, ("x",)) is not None, name  # the incremental path is the one tested
        for seed in range(3):
            for tokens in token_runs(tok, seed):
                text = tok.decode(tokens, skip_special_tokens=True)
                for stops in stops_for(text, rng):
                    for max_new in (len(tokens), 40):
                        want = reference(tokens, tok, stops, max_new)
                        assert pushed(tokens, tok, stops, max_new) == want, (name, tokens, stops)
                        stopped += want[0] == "stop"
    assert stopped > 100


def test_a_tokenizer_that_cleans_up_spaces_decodes_in_full(checkpoint):
    tok = load_tokenizer(checkpoint("llama_tied"))
    cleaning = TokenizersBackend(tokenizer_object=tok.backend_tokenizer, clean_up_tokenization_spaces=True)
    assert stream_backend(cleaning, ("x",)) is None and StopScanner(("x",), cleaning).stream is None
    tokens = token_runs(tok, 0)[0]
    for stops in stops_for(tok.decode(tokens), random.Random(1)):
        assert pushed(tokens, cleaning, stops, 80) == reference(tokens, cleaning, stops, 80)


def test_a_stream_that_disagrees_with_the_full_decode_is_rescanned_the_old_way(checkpoint):
    """A decode that is not the Rust decoder's (here: one that drops every 'o'): the stream misses the stop,
    the row's end finds the disagreement, and the row is cut where the old check cut it."""
    tok = load_tokenizer(checkpoint("llama_tied"))

    class Dropping:
        backend_tokenizer, clean_up_tokenization_spaces = tok.backend_tokenizer, False

        def decode(self, ids, skip_special_tokens=False):
            return tok.decode(ids, skip_special_tokens=skip_special_tokens).replace("o", "")

    tokens = tok("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)["input_ids"]
    want = reference(tokens, Dropping(), ("brwn",), 40)
    assert want[0] == "stop" and pushed(tokens, Dropping(), ("brwn",), 40) == want


@pytest.mark.parametrize("stop", ["✓", "é,", " café"])
def test_multibyte_stops_split_over_tokens(checkpoint, stop):
    tok = load_tokenizer(checkpoint("llama_tied"))
    tokens = tok(TEXT[:200], add_special_tokens=False)["input_ids"]
    want = reference(tokens, tok, (stop,), 200)
    assert want[0] == "stop" and pushed(tokens, tok, (stop,), 200) == want
