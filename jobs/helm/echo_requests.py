"""HELM's scoring requests: `echo_prompt=True, max_tokens=0` (the `language_modeling` method, and
`multiple_choice_separate_original` / `_calibrated`, which score each choice's sentence). Such a request asks for
nothing generated and the log-probability of every prompt token; HELM's metrics read them from
`completions[0].tokens`: `language_modeling` sums the tokens after the request's `num_conditioning_tokens`,
multiple choice sums the last tokens (as many as HELM's tokenizer gives for the choice).

They are answered from a pipeline scoring job (`RunConfig(score=True)`: the prompt's `prompt_logprobs`, tokens
1..n-1 of the ids the engine ran). The echoed tokens are the prompt's own, as HELM tokenizes it (without the
special tokens the checkpoint's tokenizer adds at the start, such as a BOS): each with its log-probability given
every token before it in the engine's row, the added BOS included, so that HELM's token counts index them. A
prompt whose first token has no token before it gives that token 0.0, as HELM's HuggingFace client does. Token
texts are the prompt's characters from each token's start to the next one's, so that they join to the prompt and
HELM's `num_bytes` counts its bytes.
"""

from __future__ import annotations

SCORING_METHODS = ("language_modeling", "multiple_choice_separate_original", "multiple_choice_separate_calibrated")


def is_scoring(request: dict) -> bool:
    """Whether the HELM request (as JSON) scores its prompt instead of generating."""
    return bool(request.get("echo_prompt"))


def scoring_problem(request: dict) -> str | None:
    """Why a request that echoes its prompt cannot be answered, or None."""
    if is_scoring(request) and int(request.get("max_tokens") or 0) != 0:
        return (f"echo_prompt with max_tokens={request.get('max_tokens')} (generating after an echoed prompt) is not "
                "supported; only scoring requests (echo_prompt with max_tokens 0, as HELM's language_modeling and "
                "multiple_choice_separate methods send) are")
    if is_scoring(request) and int(request.get("num_completions") or 1) != 1:
        return f"echo_prompt with num_completions={request.get('num_completions')}: a scored prompt has one answer"
    return None


def echo_completion(prompt: str, prompt_logprobs: list[float], tokenizer) -> dict:
    """HELM's GeneratedOutput of a scored prompt: the prompt as text, its tokens with their log-probabilities
    (`prompt_logprobs`: the engine's scores of the row's tokens 1..n-1), and their sum."""
    encoded = _encode(tokenizer, prompt)
    ids = encoded["input_ids"]
    if len(prompt_logprobs) != len(ids) - 1:
        raise ValueError(f"{len(prompt_logprobs)} scores for a prompt of {len(ids)} tokens: the engine ran other "
                         "token ids than the checkpoint's tokenizer gives for this prompt")
    scores = [0.0, *prompt_logprobs]
    lead = _added_at_start(tokenizer, prompt, ids)
    texts = _token_texts(tokenizer, prompt, ids, encoded.get("offset_mapping"))
    tokens = [{"text": texts[j], "logprob": float(scores[j])} for j in range(lead, len(ids))]
    return {"text": prompt, "logprob": float(sum(t["logprob"] for t in tokens)), "tokens": tokens,
            "finish_reason": {"reason": "length"}}


def _encode(tokenizer, prompt: str) -> dict:
    """The prompt's ids by the engine's rule (the tokenizer's call, its special tokens included), with character
    offsets where the tokenizer gives them."""
    try:
        return tokenizer(prompt, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError):  # a slow tokenizer has no offsets
        return {"input_ids": tokenizer(prompt)["input_ids"]}


def _added_at_start(tokenizer, prompt: str, ids: list[int]) -> int:
    """How many special tokens the tokenizer put before the prompt's own tokens."""
    plain = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    extra = len(ids) - len(plain)
    return extra if extra > 0 and ids[extra:] == plain else 0


def _token_texts(tokenizer, prompt: str, ids: list[int], offsets) -> list[str]:
    """Each token's text: from its first character to the next token's (the last to its end), so that the texts
    join to the prompt; a token sharing its characters with the next one (a split UTF-8 character) gets ""."""
    if not offsets or len(offsets) != len(ids):
        return [tokenizer.decode([t]) for t in ids]
    starts = [start for start, _ in offsets]
    texts = []
    for j, (start, end) in enumerate(offsets):
        if start == end == 0 and j == 0 and len(ids) > 1 and ids[0] in tokenizer.all_special_ids:
            texts.append(tokenizer.decode([ids[0]]))  # an added BOS: no characters of the prompt
            continue
        stop = next((s for s in starts[j + 1:] if s >= start), len(prompt)) if j + 1 < len(ids) else len(prompt)
        texts.append(prompt[start:max(stop, start)])
    return texts
