"""Running a run's requests through the pipeline, and reading the completions back as HELM results.

Each HELM request becomes `num_completions` rows of `<run>/requests.parquet` (id `<request index>.<output
index>`, the prompt, and the per-row `max_new_tokens`, `temperature`, `top_p`, `stop` and a distinct `seed`),
completed by one pipeline job into `<run>/completions/`. Scoring requests (`echo_prompt`, `max_tokens` 0:
jobs/helm/echo_requests.py) are one row each, run as a scoring job (`score=True`: each row's `prompt_logprobs`); a job
holds requests of one kind. The requests file is rewritten only when its
content changes, so that rerunning an interrupted run resumes its job: committed shards are skipped.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.request import SamplingParams
from jobs.helm.echo_requests import echo_completion, is_scoring
from pipeline import JobSummary, RunConfig, run_job
from pipeline.execution.driver import WorkerPool
from pipeline.input.requests import derive_seed
from pipeline.plan.settings import EngineSettings

log = logging.getLogger(__name__)

REQUESTS_FILE = "requests.parquet"
COMPLETIONS_DIR = "completions"
FINISH_REASONS = {"eos": "endoftext"}  # the engine's name -> HELM's
REQUEST_SCHEMA = pa.schema([
    ("id", pa.string()), ("instance_id", pa.string()), ("prompt", pa.string()), ("max_new_tokens", pa.int64()),
    ("temperature", pa.float64()), ("top_p", pa.float64()), ("stop", pa.list_(pa.string())), ("seed", pa.int64()),
    ("guided", pa.string()),
])


def answer_letters(state: dict) -> str | None:
    """A `multiple_choice_joint` request's answer constraint (the row's `guided` column): one of its letters,
    with or without a leading space (HELM strips the completion before mapping it to a choice); None for other
    requests."""
    mapping = state.get("output_mapping")
    if not mapping or is_scoring(state["request"]):
        return None
    letters = list(mapping)
    return json.dumps({"choice": [f" {k}" for k in letters] + letters})


def request_rows(states: list[dict], constrain: bool = True) -> list[dict]:
    """One row per (request, output index). Each output of a request gets its own seed, derived from the
    request's content (prompt and `random`) and the output index: as in HELM, where identical requests share
    one cached result, the same request gets the same outputs wherever it is run (`flexbatch helm` or
    `helm-batch`). With `constrain`, a multiple-choice request's answer is one of its letters, enforced while
    decoding."""
    rows = []
    for i, state in enumerate(states):
        request = state["request"]
        for k in range(request.get("num_completions", 1)):
            row_id = f"{i}.{k}"
            rows.append({
                "id": row_id, "instance_id": str(state["instance"].get("id")), "prompt": request["prompt"],
                # a scored row makes one token (dropped): the prompt's scores come from its prefill
                "max_new_tokens": 1 if is_scoring(request) else request.get("max_tokens", 100),
                "temperature": float(request.get("temperature", 1)),
                "top_p": float(request.get("top_p", 1)), "stop": list(request.get("stop_sequences") or []),
                "seed": derive_seed(0, f"{request.get('random') or ''}\x00{request['prompt']}\x00{k}"),
                "guided": answer_letters(state) if constrain else None,
            })
    return rows


def write_requests(path: Path, rows: list[dict]) -> bool:
    """Write the rows unless the file already holds exactly them; returns whether it was (re)written."""
    table = pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)
    if path.is_file():
        try:
            if pq.read_table(path).equals(table):
                return False
        except (OSError, pa.ArrowException):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return True


def run_requests(run_dir: Path, states: list[dict], model: Path, engine: EngineSettings,
                 pool: WorkerPool | None = None, constrain: bool = True) -> JobSummary:
    """Complete every request of the run with the pipeline (resuming an interrupted job of the same requests), on
    `pool`'s engines where given (the suite's runs share them); `constrain`: see `request_rows`."""
    rows = request_rows(states, constrain)
    if write_requests(run_dir / REQUESTS_FILE, rows):
        log.info("%s: %d requests, %d rows written to %s", run_dir.name, len(states), len(rows), REQUESTS_FILE)
    score = scoring_job(states)
    params = SamplingParams(max_new_tokens=max(r["max_new_tokens"] for r in rows), logprobs=not score)
    config = RunConfig.for_job(engine, input=str(run_dir / REQUESTS_FILE), output=run_dir / COMPLETIONS_DIR,
                               model=model, params=params, score=score,
                               overwrite=True)  # same config: resume; changed requests or options: redo the run's job
    return run_job(config, pool)


def scoring_job(states: list[dict]) -> bool:
    """Whether the requests are scoring requests (a job holds one kind: the caller splits a mixed batch)."""
    kinds = {is_scoring(s["request"]) for s in states}
    assert len(kinds) == 1, "a job's requests are all scoring requests or all generation requests"
    return kinds.pop()


def read_completions(summary: JobSummary) -> dict[str, dict]:
    """Each row's completion by id, with the batch it ran in: its part's rows and generating seconds (a shard
    is the unit a worker completes in one go) and the part's commit time."""
    wanted = ["id", "completion", "completion_tokens", "finish_reason", "error", "logprobs", "token_ids",
              "prompt_logprobs"]
    batches = _batches(summary.output)
    rows = {}
    for part in summary.parts:
        batch = batches.get(Path(part).name, {})
        columns = [c for c in wanted if c in pq.read_schema(part).names]
        for row in pq.read_table(part, columns=columns).to_pylist():
            rows[row["id"]] = {**row, "batch": batch}
    return rows


def _batches(output: Path) -> dict[str, dict]:
    """The last manifest line of each part (the job is rerun with `overwrite`, so the last one is current)."""
    from pipeline.output.folder import MANIFEST_FILE

    records = {}
    path = Path(output) / MANIFEST_FILE
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "part" in record:
            records[str(record["part"])] = record
    return records


def attach_results(states: list[dict], rows: dict[str, dict], tokenizer=None) -> list[dict]:
    """The request states with HELM results.

    `rows` maps `<request index>.<output index>` to a completion row: `completion`, `finish_reason`, `error`,
    and optionally `token_ids` and `logprobs` (then `tokenizer` names the tokens), `prompt_logprobs` (a scoring
    request's, echoed with the prompt's tokens) and `batch` (its manifest record: `rows`, `seconds`,
    `committed_at`). A request with a failed row gets HELM's non-fatal failure: `success` false, the `error`, and
    one empty completion."""
    out = []
    for i, state in enumerate(states):
        got = [rows[f"{i}.{k}"] for k in range(state["request"].get("num_completions", 1))]
        errors = [r["error"] or "generation failed" for r in got if r["finish_reason"] == "error"]
        result = {"success": not errors, "embedding": [], "completions": [], "cached": False,
                  **_timing(got[0].get("batch") or {})}
        if errors:
            result.update(error=errors[0], error_flags={"is_retriable": False, "is_fatal": False},
                          completions=[{"text": "", "logprob": 0.0, "tokens": []}])
        elif is_scoring(state["request"]):
            result["completions"] = [echo_completion(state["request"]["prompt"], r["prompt_logprobs"], tokenizer)
                                     for r in got]
        else:
            result["completions"] = [helm_completion(r, tokenizer) for r in got]
        out.append({**state, "result": result})
    return out


def _timing(batch: dict) -> dict:
    """HELM's timing fields from the row's batch: the batch's size and generating seconds, each row's equal
    share of them as its request time, and the batch's commit time."""
    if not batch.get("rows"):
        return {}
    seconds, size = float(batch.get("seconds") or 0.0), int(batch["rows"])
    timing = {"request_time": seconds / size, "batch_size": size, "batch_request_time": seconds}
    committed = batch.get("committed_at")
    if committed:
        stamp = datetime.strptime(committed, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        timing["request_datetime"] = int(stamp.timestamp())
    return timing


def helm_completion(row: dict, tokenizer) -> dict:
    """HELM's GeneratedOutput: one `Token{text, logprob}` per generated token (an ending EOS is not part of the
    answer), and their summed log-probability."""
    reason = FINISH_REASONS.get(row["finish_reason"], row["finish_reason"])
    ids, logprobs = (row.get("token_ids") or [], row.get("logprobs") or []) if tokenizer is not None else ([], [])
    if row["finish_reason"] == "eos":
        ids, logprobs = ids[:-1], logprobs[:-1]
    tokens = [{"text": tokenizer.decode([t]), "logprob": float(lp)} for t, lp in zip(ids, logprobs)]
    return {"text": row["completion"] or "", "logprob": float(sum(t["logprob"] for t in tokens)), "tokens": tokens,
            "finish_reason": {"reason": reason}}
