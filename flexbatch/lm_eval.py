"""lm-evaluation-harness backend: the model `flexbatch` (`lm_eval.api.model.TemplateLM`) answers lm-eval's
`loglikelihood`, `loglikelihood_rolling` and `generate_until` requests as batches on one flexbatch engine.

    python -m flexbatch.lm_eval --model flexbatch --model_args pretrained=DIR,dtype=float32 --tasks hellaswag

lm-eval 0.4 finds models in its own registry only (no plugin entry point), so this module registers the model
and `python -m flexbatch.lm_eval` then runs lm-eval's own command line (`lm_eval.__main__.cli_evaluate`, every
option as there); in Python, `import flexbatch.lm_eval` before `lm_eval.simple_evaluate(model="flexbatch", ...)`.

Requests are tokenized by lm-eval's own rules (`TemplateLM._encode_pair`: the context's trailing spaces moved to
the continuation, context + continuation encoded whole and split; an empty context is the prefix token; rolling
windows by `lm_eval.utils.get_rolling_token_windows`), so token for token the rows are those of lm-eval's `hf`
backend. Each row is scored in its prefill (engine `SamplingParams.prompt_logprobs`, one token asked for and
dropped), its continuation only (`score_last`: the LM head runs at the continuation's positions alone); identical
rows run once; all of a call's rows go to the engine together, which groups them into length-bucketed blocks.
The policy is planned from the first call's rows (`plan=False` runs the pinned or default policy).

model_args: `pretrained` (the checkpoint folder), `dtype` (auto, float32, bfloat16: float32 gives the `hf`
backend's numbers), `max_length` (default: the model's context less 2, so that a window of `max_length` tokens
and its one target fit the engine's context with the token it is asked for), `max_gen_toks` (256), `add_bos_token`,
`prefix_token_id`, `backend`, `plan`, `hardware`, `cpu_mem`/`gpu_mem`/`disk_mem`, `offload_dir`, and any
`engine.policy.Policy` field as a pin (`gbs=8,num_gb=2,compress_weight=True`). lm-eval's `batch_size`,
`max_batch_size` and `device` are accepted and not used: the engine plans its own blocks and placement."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

try:
    import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry loads them only while empty)
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import handle_stop_sequences, has_bos_prefix, normalize_gen_kwargs
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("flexbatch.lm_eval needs lm-evaluation-harness: pip install 'flexbatch[lm-eval]' "
                      f"(lm-eval 0.4.x) ({e})") from e

from engine.errors import FlexbatchError
from engine.options import Option, OptionError, options_of
from engine.policy import Policy
from engine.request import Completion, Request, SamplingParams
from pipeline.errors import ConfigError
from pipeline.plan.settings import BUDGETS, EngineSettings

log = logging.getLogger(__name__)

UNUSED = ("batch_size", "max_batch_size", "device")  # lm-eval passes them to every model
GEN_KWARGS = ("do_sample", "until", "max_gen_toks", "temperature", "top_p", "top_k", "seed")
CONTEXT_SPARE = 2  # a window of max_length tokens, its one target, and the one token the engine is asked for
_LM_EVAL_ONLY = tuple((surface, "a setting of lm-eval's requests") for surface in ("cli", "python", "ray"))
# lm-eval's own model_args, as its hf backend names them
LM_EVAL_ARGS = {o.name: o for o in (
    Option("max_length", kind="int", low=1, optional=True, absent=_LM_EVAL_ONLY,
           help=f"a row's most tokens (default: the model's context less {CONTEXT_SPARE})"),
    Option("max_gen_toks", kind="int", low=1, default=256, absent=_LM_EVAL_ONLY,
           help="generate_until's default limit"),
    Option("add_bos_token", kind="bool", optional=True, absent=_LM_EVAL_ONLY,
           help="the tokenizer's own BOS rule unless told"),
    Option("prefix_token_id", kind="int", low=0, optional=True, absent=_LM_EVAL_ONLY,
           help="the token before a context-free continuation (default: BOS, else EOS)"),
)}


class RequestFailed(FlexbatchError):
    """A request the engine could not run; lm-eval needs an answer for every request, so the run stops."""


@register_model("flexbatch")
class FlexbatchLM(TemplateLM):
    def __init__(self, pretrained, **model_args):
        super().__init__()
        from engine.spec import load_model_spec
        from engine.tokenizer import load_tokenizer
        from pipeline.plan.host import EngineHost

        unused = {k: model_args.pop(k) for k in UNUSED if k in model_args}
        if any(v not in (None, 1, "1", "auto", "cpu") for v in unused.values()):
            log.info("flexbatch plans its own blocks and placement; lm-eval's %s are not used", unused)
        try:
            own, self.settings = read_model_args(model_args)
        except OptionError as e:
            raise e.given("model_args") from None
        self.pretrained = Path(str(pretrained)).expanduser().resolve()
        self.spec = load_model_spec(self.pretrained)
        self.tokenizer = load_tokenizer(self.pretrained)
        self.host = EngineHost()
        self._max_length, self._max_gen_toks = own["max_length"], own["max_gen_toks"]
        self.add_bos_token, self.custom_prefix_token_id = own["add_bos_token"], own["prefix_token_id"]

    # -- what TemplateLM asks of a model ------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or max(2, self.spec.max_position_embeddings - CONTEXT_SPARE)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return str(self.pretrained).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs) -> list[int]:
        """As lm-eval's `hf` backend encodes: its add_bos_token unless told, no second BOS before one in the text."""
        special = {"add_special_tokens": add_special_tokens} if add_special_tokens is not None else (
            {"add_special_tokens": self.add_bos_token} if self.add_bos_token is not None else {})
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        ids = self.tokenizer.encode(string, **special)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    # -- the three request types ---------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(summed log-probability, every token the argmax) of each continuation after its context, as the `hf`
        backend scores it: the last max_length + 1 tokens of context + continuation. A continuation longer than
        max_length is refused, as the `hf` backend refuses it: only its last max_length tokens could be scored."""
        for n, (_, _, continuation) in enumerate(requests):
            if len(continuation) > self.max_length:
                raise RequestFailed(f"loglikelihood request {n}: its continuation has {len(continuation)} tokens, "
                                    f"more than max_length={self.max_length}, so it cannot be scored whole (lm-eval's "
                                    "hf backend refuses it too); raise max_length (up to the model's context less "
                                    f"{CONTEXT_SPARE}) or shorten the continuation")
        rows = [(tuple((context + continuation)[-(self.max_length + 1):]), len(continuation))
                for _, context, continuation in requests]
        results = self._score(rows)
        out = []
        for (key, _, _), (_, n), c in zip(requests, rows, results):
            answer = (sum(c.prompt_logprobs[-n:]), all(c.prompt_greedy[-n:]))
            out.append(answer)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood, summed over disjoint windows of max_length tokens (lm-eval's rolling
        windows, the first conditioned on the prefix token); every request's windows run in one batch."""
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            for context, target in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, target))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, scores):
            totals[i] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each context continued until a stop string (cut before it), EOS or max_gen_toks tokens."""
        eos = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        rows = []
        for n, (context, gen_kwargs) in enumerate(req.args for req in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            unknown = sorted(set(kwargs) - set(GEN_KWARGS))
            if unknown:
                raise ConfigError(f"generation kwargs {unknown} are not supported by the flexbatch model (request "
                                  f"{n}); supported: {', '.join(GEN_KWARGS)}")
            until = handle_stop_sequences(kwargs.get("until"), eos=eos)
            limit = kwargs["max_gen_toks"]
            params = SamplingParams(max_new_tokens=limit, temperature=float(kwargs.get("temperature") or 0.0),
                                    top_p=float(kwargs.get("top_p") or 1.0), top_k=int(kwargs.get("top_k") or 0),
                                    stop=tuple(s for s in until if s), seed=int(kwargs.get("seed") or 0))
            ids = self.tok_encode(context, left_truncate_len=max(1, self.max_length - limit))
            rows.append(Request(id=f"gen:{n}", prompt="", params=params, prompt_ids=tuple(ids)))
        out = [c.text for c in self._run(rows)]
        for req, text in zip(requests, out):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out

    # -- the engine ----------------------------------------------------------------------------------------------

    def _score(self, rows: list[tuple[tuple[int, ...], int]]) -> list[Completion]:
        """Each (token row, continuation length n) scored once (identical ones share one engine row): its last n
        tokens only (`score_last`), the LM head running at those positions alone."""
        unique = list(dict.fromkeys(rows))
        done = self._run([Request(id=f"score:{i}", prompt="", prompt_ids=ids,
                                  params=SamplingParams(max_new_tokens=1, prompt_logprobs=True, score_last=n))
                          for i, (ids, n) in enumerate(unique)])
        by_row = dict(zip(unique, done))
        return [by_row[row] for row in rows]

    def _run(self, requests: list[Request]) -> list[Completion]:
        """Run `requests` on the engine (loaded, and planned on the first call's rows, by its host); a request
        that fails stops the run, naming it."""
        if not requests:
            return []
        if self.host.engine is None:
            self.host.take_first(self.pretrained, self.spec, self.settings, requests)
        out = self.host.complete(requests, truncate="left", label="flexbatch").completions
        failed = next((c for c in out if c.finish_reason == "error"), None)
        if failed is not None:
            raise RequestFailed(f"request {failed.id} failed in the engine: {failed.error}")
        return out


def read_model_args(model_args: dict) -> tuple[dict, EngineSettings]:
    """lm-eval's own model_args (`LM_EVAL_ARGS`, defaults filled in) and the engine settings from the others: the
    declared engine options lm-eval takes, each tier's budget (cpu_mem, ...) and any Policy field as a pin. A bad
    value is an `OptionError`, an unknown name a `ConfigError` naming the known ones."""
    settings = {name: o for name, o in options_of(EngineSettings).items() if o.takes("model_args")}
    budgets = {o.name: tier for tier, o in BUDGETS.items()}
    pins = options_of(Policy)
    unknown = sorted(set(model_args) - set(LM_EVAL_ARGS) - set(settings) - set(budgets) - set(pins))
    if unknown:
        raise ConfigError(f"model_args {unknown} are not known to the flexbatch model; use pretrained, "
                          f"{', '.join([*LM_EVAL_ARGS, *settings, *budgets])} or Policy fields ({', '.join(pins)})")
    own = {name: o.check(model_args.get(name, o.default)) for name, o in LM_EVAL_ARGS.items()}
    engine = EngineSettings(use_ray=False, **{k: v for k, v in model_args.items() if k in settings},
                            budgets={budgets[k]: v for k, v in model_args.items() if k in budgets},
                            pins={k: v for k, v in model_args.items() if k in pins})
    return own, engine


def main() -> None:
    """lm-eval's command line with the `flexbatch` model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "python -m flexbatch.lm_eval"
    cli_evaluate()


if __name__ == "__main__":
    main()
