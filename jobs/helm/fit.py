"""The checkpoint as a HELM model deployment inside this process, so that HELM's own adapters fit prompts
(`InContextLearningAdapter._make_prompt_fit`: drop the last few-shot example until the prompt fits, then cut from
the right) and HELM's own metrics count tokens with the checkpoint's tokenizer.

HELM finds a deployment's window service in its registry (`WindowServiceFactory`) and asks a `TokenizerService`
for tokens. `register_deployment` registers the deployment with HELM's `LocalWindowService` over
`CheckpointTokenizers`, which tokenizes as the engine does (the special tokens it adds included): a fitted prompt
never becomes a "too long" error row.
"""

from __future__ import annotations

import threading
from pathlib import Path

from helm.benchmark.window_services.local_window_service import LocalWindowService
from helm.benchmark.window_services.tokenizer_service import TokenizerService
from helm.common.tokenization_request import (
    DecodeRequest,
    DecodeRequestResult,
    TokenizationRequest,
    TokenizationRequestResult,
    TokenizationToken,
)

CLIENT = "jobs.helm.client.FlexbatchClient"  # never built in this process: HELM's registry needs a client_spec
WINDOW = "jobs.helm.fit.CheckpointWindowService"


PLAIN = "+plain"  # a tokenizer name with this suffix: the text's own tokens, without the special ones added


class CheckpointTokenizers(TokenizerService):
    """HELM's tokenizer service answered by the tokenizers of registered checkpoints, by tokenizer name. Encoding
    counts the special tokens the tokenizer adds (as the engine runs them), except for a name ending in `+plain`;
    tokenizing into strings (HELM's `tokenize`, which its multiple-choice metric counts a choice's tokens with)
    gives the text's own tokens only, as HELM's HuggingFace tokenizer does."""

    def __init__(self) -> None:
        super().__init__(context=None)
        self.tokenizers: dict[str, object] = {}

    def tokenize(self, request: TokenizationRequest) -> TokenizationRequestResult:
        tokenizer = self.tokenizers[request.tokenizer.removesuffix(PLAIN)]
        special = request.encode and not request.tokenizer.endswith(PLAIN)
        ids = tokenizer(request.text, add_special_tokens=special)["input_ids"]
        if request.truncation:
            ids = ids[:max(request.max_length, 0)]
        values = ids if request.encode else tokenizer.convert_ids_to_tokens(ids)
        return TokenizationRequestResult(success=True, cached=False, text=request.text,
                                         tokens=[TokenizationToken(v) for v in values])

    def decode(self, request: DecodeRequest) -> DecodeRequestResult:
        text = self.tokenizers[request.tokenizer.removesuffix(PLAIN)].decode(
            request.tokens, skip_special_tokens=True, clean_up_tokenization_spaces=request.clean_up_tokenization_spaces)
        return DecodeRequestResult(success=True, cached=False, text=text)


class CheckpointWindowService(LocalWindowService):
    """HELM's local window service, except that a prompt is left whole when not even the empty text leaves room for
    `max_tokens` (HELM's character loop would never end; the engine then names max_tokens as the problem)."""

    def truncate_from_right(self, text: str, expected_completion_token_length: int = 0) -> str:
        if not self.fits_within_context_window("", expected_completion_token_length):
            return text
        return super().truncate_from_right(text, expected_completion_token_length)


SERVICE = CheckpointTokenizers()
_lock = threading.Lock()


def register_deployment(name: str, model_dir: Path | None) -> CheckpointTokenizers:
    """Register deployment `name` in HELM's registries: with the checkpoint's tokenizer and context, or, without a
    checkpoint, as a deployment with no tokenizer (HELM's `NoTokenizerWindowService`: prompts are not fitted).
    Registering the same deployment again, or without a checkpoint a deployment known already, changes nothing.
    Returns the tokenizer service to give HELM."""
    from helm.benchmark.model_deployment_registry import (
        ClientSpec,
        ModelDeployment,
        WindowServiceSpec,
        get_model_deployment,
        register_model_deployment,
    )
    from helm.benchmark.model_metadata_registry import get_unknown_model_metadata, register_model_metadata

    deployment = ModelDeployment(name=name, model_name=name, client_spec=ClientSpec(CLIENT, {}))
    if model_dir is not None:
        from engine.spec import load_model_spec
        from engine.tokenizer import load_tokenizer

        SERVICE.tokenizers[name] = load_tokenizer(model_dir)
        deployment = ModelDeployment(name=name, model_name=name, client_spec=ClientSpec(CLIENT, {}), tokenizer_name=name,
                                     max_sequence_length=load_model_spec(model_dir).max_position_embeddings,
                                     window_service_spec=WindowServiceSpec(WINDOW, {}))
    with _lock:
        try:
            known = get_model_deployment(name)
        except ValueError:
            known = None
            register_model_metadata(get_unknown_model_metadata(name))  # else HELM warns that it has none
        if known is None or (model_dir is not None and known != deployment):
            register_model_deployment(deployment)
    return SERVICE



def scoring_window(name: str, window):
    """The window service HELM's `language_modeling` adapter cuts documents with: it counts a window's own tokens
    (HELM's `num_conditioning_tokens` index them), and leaves room for the special tokens the engine adds before
    them and the one token a scored row asks for, so that every window runs."""
    tokenizer = SERVICE.tokenizers.get(name)
    if tokenizer is None:  # a deployment without a checkpoint: HELM's own window
        return window
    added = len(tokenizer("a")["input_ids"]) - len(tokenizer("a", add_special_tokens=False)["input_ids"])
    room = window.max_sequence_length - max(added, 0) - 1
    return CheckpointWindowService(SERVICE, tokenizer_name=name + PLAIN, max_sequence_length=room,
                                   max_request_length=room)
