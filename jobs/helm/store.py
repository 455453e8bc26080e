"""The results store of `flexbatch helm-batch`: HELM request results computed by the pipeline, by request.

A store folder holds `results.jsonl`, one line `{"key", "request", "result"}` per distinct request (HELM's
RequestResult as written in scenario_state.json, with tokens, batch timing, and HELM's non-fatal failure for a
request that failed), and `jobs/<hash>/`, the pipeline job of each batch of pending requests (generation and scoring requests apart) (rerunning the same
batch resumes its job). The key is the request's content without `model` and `model_deployment`, so a dry run's
requests and the later real run's requests of the same run entry meet; as in HELM's cache, `random` tells
identical prompts apart.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from jobs.helm.echo_requests import is_scoring, scoring_problem
from jobs.helm.errors import SpecError
from jobs.helm.fields import output_mapping_problem, request_problem, result_problem

RESULTS_FILE = "results.jsonl"
JOBS_DIR = "jobs"
_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_INTS = ("num_completions", "top_k_per_token", "max_tokens")


def request_key(request: dict) -> str:
    """The request's identity: its decoding fields (numbers normalized, so that 1 and 1.0 meet), hashed."""
    fields = {"prompt": request.get("prompt") or "", "stop_sequences": list(request.get("stop_sequences") or []),
              "echo_prompt": bool(request.get("echo_prompt", False)), "random": request.get("random"),
              "embedding": bool(request.get("embedding", False))}
    fields.update({k: float(request.get(k) if request.get(k) is not None else d)
                   for k, d in zip(_FLOATS, (1.0, 1.0, 0.0, 0.0))})
    fields.update({k: int(request.get(k) if request.get(k) is not None else d) for k, d in zip(_INTS, (1, 1, 100))})
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def read_results(store: Path) -> dict[str, dict]:
    """The stored results by request key (a later line of a key wins); a line whose result HELM's client could
    not read is a SpecError naming the line, the request and the field."""
    path = Path(store) / RESULTS_FILE
    results = {}
    for n, line in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        try:
            record = json.loads(line)
            results[record["key"]] = record["result"]
        except (ValueError, KeyError, TypeError) as e:
            raise SpecError(f"{path} line {n} is not a stored result ({type(e).__name__}); remove the line or the "
                            "store and run flexbatch helm-batch again") from e
        problem = result_problem(record["result"])
        if problem:
            raise SpecError(f"{path} line {n} (request {str(record['key'])[:12]}): {problem}; remove the line (or "
                            "the store) and run flexbatch helm-batch again to recompute it")
    return results


def add_results(store: Path, records: list[dict]) -> None:
    """Append `{"key", "request", "result"}` records: the file is rewritten whole and renamed into place, so a
    reader sees the old or the new store, never half a line."""
    path = Path(store) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else ""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(old + "".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def suite_requests(helm_output: Path, suite: str) -> list[dict]:
    """Every distinct request of the suite's HELM run folders (their scenario_state.json), in run and request
    order, as request states (instance, request, and a multiple_choice_joint request's output_mapping, which
    constrains its answer to one of the letters as `flexbatch helm` does: jobs/helm/execute.py)."""
    suite_dir = Path(helm_output) / "runs" / suite
    if not suite_dir.is_dir():
        raise SpecError(f"no suite folder {suite_dir}; run helm-run --suite {suite} --dry-run first (or give "
                        "--helm-output, HELM's output folder)")
    seen, states = set(), []
    for path in sorted(suite_dir.glob("*/scenario_state.json")):
        for i, rs in enumerate(_request_states(path)):
            request = rs.get("request") if isinstance(rs, dict) else None
            if not isinstance(request, dict):
                raise SpecError(f"{path}: request_states[{i}] has no request object; run helm-run --dry-run of that "
                                "run entry again to rewrite the file")
            _check_runnable(request, f"{path}: request_states[{i}]")
            problem = output_mapping_problem(rs.get("output_mapping"))
            if problem:
                raise SpecError(f"{path}: request_states[{i}]: {problem}; run helm-run --dry-run of that run entry "
                                "again to rewrite the file")
            key = request_key(request)
            if key not in seen:
                seen.add(key)
                mapping = {"output_mapping": rs["output_mapping"]} if rs.get("output_mapping") else {}
                states.append({"instance": rs.get("instance") or {}, "request": request, **mapping})
    return states


def _request_states(path: Path) -> list:
    """The request states of a HELM run's scenario_state.json; a file that is not one is a user error."""
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError(f"{path} is not a readable scenario_state.json ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); remove its run folder, or run helm-run "
                        "--dry-run of that run entry again to rewrite it") from e
    if not isinstance(state, dict) or not isinstance(state.get("request_states", []), list):
        raise SpecError(f"{path} is not a HELM scenario_state.json (expected an object with a request_states list, "
                        f"got {type(state).__name__}); remove its run folder, or run helm-run --dry-run of that run "
                        "entry again to rewrite it")
    return state.get("request_states") or []


def _check_runnable(request: dict, where: str) -> None:
    problem = request_problem(request)
    if problem:
        raise SpecError(f"{where} (prompt {str(request.get('prompt'))[:40]!r}): {problem}; run helm-run --dry-run of "
                        "that run entry again to rewrite the file")
    if not isinstance(request.get("prompt"), str) or not request["prompt"] or request.get("messages"):
        raise SpecError(f"{where}: no text prompt (chat `messages` and multimodal requests are not supported)")
    if request.get("embedding"):
        raise SpecError(f"{where}: embedding requests are not supported")
    problem = scoring_problem(request)
    if problem:
        raise SpecError(f"{where}: {problem}")


def batch_dir(store: Path, states: list[dict]) -> Path:
    """The pipeline job folder of a batch of requests: named by their keys, so the same batch resumes."""
    digest = hashlib.sha256("\n".join(request_key(s["request"]) for s in states).encode()).hexdigest()[:16]
    return Path(store) / JOBS_DIR / digest


def run_pending(helm_output: Path, suite: str, store: Path, model: Path, engine) -> tuple[int, int, list]:
    """Complete every request of the suite that the store lacks, as one pipeline job for the generation requests
    and one scoring job for the scoring requests (jobs/helm/echo_requests.py), and add the results of each job that
    completed to the store; returns (requests in the suite, requests run, the jobs' summaries)."""
    from engine.tokenizer import load_tokenizer
    from jobs.helm.execute import attach_results, read_completions, run_requests

    states = suite_requests(helm_output, suite)
    stored = read_results(store)
    pending = [s for s in states if request_key(s["request"]) not in stored]
    summaries = []
    for group in ([s for s in pending if not is_scoring(s["request"])], [s for s in pending if is_scoring(s["request"])]):
        if not group:
            continue
        summary = run_requests(batch_dir(store, group), group, model, engine)
        summaries.append(summary)
        if summary.ok:
            done = attach_results(group, read_completions(summary), load_tokenizer(model))
            add_results(store, [{"key": request_key(s["request"]), "request": s["request"], "result": s["result"]}
                                for s in done])
    return len(states), len(pending), summaries
