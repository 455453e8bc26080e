"""A Ray Data stage: `ds.map_batches(flexbatch.ray.Processor, fn_constructor_kwargs={"model": DIR, ...},
concurrency=N, batch_size=B)` runs one engine per actor over the batches of an existing Ray Data pipeline.

Columns follow Ray Data LLM's processors. In: `prompt` (a string) or `messages` (a list of {role, content},
rendered by the checkpoint's chat template), and optionally `sampling_params`, a dict per row with vLLM's names
(max_tokens, temperature, top_p, top_k, stop, seed, and guided_decoding or structured_outputs: {"json": schema},
{"choice": [...]}, {"regex": ...}, {"grammar": ...}, enforced while decoding). Out: every input column plus `generated_text`,
`generated_tokens`, `num_generated_tokens`, `num_input_tokens`, `finish_reason` and `error` (a bad row fails
alone, with its reason there). With `score=True` each row is scored instead of completed, as a `--score` job
scores it (pipeline/input/scoring.py): its prompt and an optional `continuation` column, and three more columns,
`prompt_logprobs`, `continuation_logprob` and `continuation_is_greedy` (`generated_text` is then ""). The policy (and so the block size) is planned from the first batch, for batches
of that size, unless `policy` is given: from its prompt lengths and each row's own max_new_tokens and stop
strings, as a job plans its sample; a batch runs in engine calls as a job's shard does, and refill is chosen
again after each from what its rows generated (pipeline/plan/host.py). Rows without an `id` column get seeds
from their place in the batch, so sampled (not greedy) outputs then depend on the batching."""

from __future__ import annotations

from pathlib import Path

from engine.errors import InvalidParamsError
from engine.options import options_of
from engine.policy import Pins, Policy
from engine.request import TRUNCATE, Completion, Request, SamplingParams
from pipeline.errors import ConfigError
from pipeline.input.ids import ID_COLUMN
from pipeline.input.parquet import MESSAGES_COLUMN
from pipeline.input.requests import prompt_problem, row_params
from pipeline.input.scoring import CONTINUATION_COLUMN, SCORE_COLUMNS, score_columns, scored, scoring_items
from pipeline.job import RunConfig
from pipeline.plan.settings import EngineSettings

VLLM_NAMES = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
              "stop": "stop", "seed": "seed",
              # the answer constraint, as vLLM's GuidedDecodingParams (guided_decoding, up to vLLM 0.10) or
              # StructuredOutputsParams (structured_outputs) spell it: {"json": schema}, {"choice": [...]},
              # {"regex": ...}, {"grammar": ...}, {"json_object": True} (engine/guided.py)
              "guided_decoding": "guided", "structured_outputs": "guided"}
JOB_OPTIONS = options_of(RunConfig)  # the stage takes chat, score and truncate as a job does
OUTPUT_COLUMNS = ("generated_text", "generated_tokens", "num_generated_tokens", "num_input_tokens", "finish_reason",
                  "error")


class Processor:
    """One engine, loaded on the first batch; the constructor's options are the defaults of every row."""

    def __init__(self, model, max_new_tokens: int = SamplingParams.max_new_tokens,
                 temperature: float = SamplingParams.temperature, top_p: float = SamplingParams.top_p,
                 top_k: int = SamplingParams.top_k, stop: tuple[str, ...] = SamplingParams.stop,
                 seed: int = SamplingParams.seed, dtype: str = EngineSettings.dtype, chat: str = RunConfig.chat,
                 truncate: str = TRUNCATE.default, policy=None, hardware=None, budgets=None,
                 backend: str = EngineSettings.backend, offload_dir=None, engines_per_node: int = 1,
                 score: bool = RunConfig.score):
        chat, score = (JOB_OPTIONS[name].check(value) for name, value in (("chat", chat), ("score", score)))
        if not isinstance(engines_per_node, int) or engines_per_node < 1:
            raise ConfigError(f"engines_per_node={engines_per_node!r} is invalid: give how many of these actors "
                              "share one node's memory (1 or more)")
        from pipeline.plan.host import EngineHost

        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy={policy!r} is invalid: expected an engine.policy.Policy to run as it is, or "
                              "None to plan from the first batch")
        self.model, self.chat, self.truncate, self.score = model, chat, TRUNCATE.check(truncate), score
        self.spec = check_model(model)
        # a given policy runs as it is; without one, the engine plans for batches shaped like the first one
        self.settings = EngineSettings(dtype=dtype, backend=backend, budgets={} if budgets is None else budgets,
                                       hardware=hardware, offload_dir=offload_dir, plan=policy is None,
                                       pins=Pins.of(policy) if policy is not None else Pins())
        self.defaults = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       top_k=top_k, stop=tuple(stop), seed=seed)
        self.host = EngineHost(engines_per_node)

    @property
    def engine(self):
        return self.host.engine

    def __call__(self, batch) -> dict:
        columns = _columns(batch)
        n = len(next(iter(columns.values()))) if columns else 0
        chat = self.chat == "on" or (self.chat == "auto" and MESSAGES_COLUMN in columns)
        source = MESSAGES_COLUMN if chat else "prompt"
        if source not in columns:
            raise ConfigError(f"the batch has no {source!r} column (its columns: {sorted(columns)}); "
                              f"{'give messages or pass chat=off' if chat else 'give a prompt or messages column'}")
        taken = sorted(set(OUTPUT_COLUMNS + (SCORE_COLUMNS if self.score else ())) & set(columns))
        if taken:
            raise ConfigError(f"the batch already has the columns {taken}, which this stage writes; rename or drop "
                              "them before the stage (e.g. ds.rename_columns or ds.drop_columns)")
        ids = [str(v) for v in columns[ID_COLUMN]] if ID_COLUMN in columns else [f"row:{i}" for i in range(n)]
        items = [self._item(row_id, columns[source][i], (columns.get("sampling_params") or [None] * n)[i], chat)
                 for i, row_id in enumerate(ids)]
        if self.score:
            from engine.tokenizer import load_tokenizer

            items, lengths = scoring_items(items, columns.get(CONTINUATION_COLUMN), load_tokenizer(self.model),
                                           self.spec.vocab_size)
        if self.engine is None:  # planned on the first batch, for batches shaped like it
            items = self.host.take_first(Path(self.model), self.spec, self.settings, items, self.defaults)
        results = self.host.complete(items, truncate=self.truncate).completions
        if not self.score:
            return {**columns, **_output_columns(results)}
        results = [scored(c, k) for c, k in zip(results, lengths)]
        scores = {name: values.to_pylist() for name, values in score_columns(results, lengths).items()}
        return {**columns, **_output_columns(results), **scores}

    def _item(self, row_id: str, prompt, sampling: dict | None, chat: bool) -> Request | Completion:
        from engine.chat import messages_problem

        problem = messages_problem(prompt) if chat else prompt_problem(prompt, "prompt")
        if problem:
            return Completion.failed(row_id, problem)
        try:
            params = row_params(self.defaults, _vllm_params(sampling or {}), row_id)
        except InvalidParamsError as e:
            return Completion.failed(row_id, f"sampling_params: {e}")
        if chat:
            return Request(id=row_id, prompt="", params=params, messages=tuple(prompt))
        return Request(id=row_id, prompt=prompt, params=params)


def check_model(model):
    """The model folder's spec, read at once (config.json, safetensors present) so that a bad folder is refused
    when the stage is built, not at its first batch."""
    from engine.spec import load_model_spec

    return load_model_spec(model)


def build_processor(model, **options):
    """`ds.map_batches(**build_processor(model, concurrency=2, batch_size=64, max_new_tokens=32))`: the
    keyword arguments of a map_batches call that runs `Processor`; `concurrency` (that many actors, each with its
    engine), `batch_size`, `num_cpus` and `num_gpus` go to Ray Data, every other option to the `Processor`.
    Unless `engines_per_node` is given, every actor is taken to share one node's memory (the safe bound: Ray Data
    may place them all on one node)."""
    from ray.data import ActorPoolStrategy

    check_model(model)
    stage = {k: options.pop(k) for k in ("batch_size", "num_cpus", "num_gpus") if k in options}
    if "concurrency" in options:  # Ray Data >= 2.51 takes the actor count as an ActorPoolStrategy
        options.setdefault("engines_per_node", options["concurrency"])
        stage["compute"] = ActorPoolStrategy(size=options.pop("concurrency"))
    return {"fn": Processor, "fn_constructor_kwargs": {"model": model, **options}, **stage}


def _vllm_params(sampling) -> dict:
    """A row's sampling_params as flexbatch's names; an unknown key is an error rather than silently dropped."""
    sampling = _plain(sampling)
    if not isinstance(sampling, dict):
        raise InvalidParamsError(f"{sampling!r} is not a dict of sampling parameters")
    unknown = sorted(k for k, v in sampling.items() if k not in VLLM_NAMES and v is not None)
    if unknown:
        raise InvalidParamsError(f"keys {unknown} are not supported; use {', '.join(VLLM_NAMES)}")
    out = {VLLM_NAMES[k]: v for k, v in sampling.items() if k in VLLM_NAMES and v is not None}
    if out.get("top_k") == -1:  # vLLM's "disabled"
        out["top_k"] = 0
    return out


def _output_columns(results: list[Completion]) -> dict:
    return {
        "generated_text": [c.text for c in results],
        "generated_tokens": [list(c.token_ids) for c in results],
        "num_generated_tokens": [c.completion_tokens for c in results],
        "num_input_tokens": [c.prompt_tokens for c in results],
        "finish_reason": [c.finish_reason for c in results],
        "error": [c.error for c in results],
    }


def _columns(batch) -> dict[str, list]:
    """A batch in any of Ray Data's formats (dict of numpy arrays, pyarrow Table, pandas DataFrame) as plain
    Python columns."""
    if hasattr(batch, "to_pydict"):
        return {k: [_plain(v) for v in vs] for k, vs in batch.to_pydict().items()}
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):
        return {k: [_plain(v) for v in batch[k].tolist()] for k in batch.columns}
    return {k: [_plain(v) for v in vs] for k, vs in batch.items()}


def _plain(value):
    """Numpy arrays and scalars (Ray's numpy batches hold nested lists as object arrays) as Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
