"""Dataset mode's results as HELM run folders, written by the HELM job's writer (jobs/helm): one run per dataset
in `OUTPUT/helm/runs/wrangle/<run>/` (run_spec.json, scenario.json, scenario_state.json with each trial's
requests and completions, stats.json and per_instance_stats.json with HELM's exact-match metrics), and the
suite's flexbatch_summary.md / .json, so the paper's datasets sit in the same tables as the HELM jobs. Runs are
named as crfm-helm names its fm_data_tasks scenarios (`entity_matching:dataset=Beer,model=...`,
`entity_data_imputation:dataset=Buy,...`); error detection and schema matching, which HELM lacks, keep the
paper's task name."""

from __future__ import annotations

from pathlib import Path

from jobs.helm.evaluate import evaluate
from jobs.helm.execute import attach_results
from jobs.helm.output import RunSummary, helm_metric_specs, metric_summaries, write_run, write_summary
from jobs.helm.schema import run_groups, write_suite_schema
from jobs.wrangle.datasets import HELM_GROUP
from jobs.wrangle.paper_job import PaperConfig, PaperRun

SUITE = "wrangle"
METRICS = ("exact_match", "quasi_exact_match", "prefix_exact_match", "quasi_prefix_exact_match")


def _adapter(config: PaperConfig, run: PaperRun, model: str) -> dict:
    return {"method": "generation", "instructions": run.dataset.instruction if config.add_task_instruction else "",
            "max_train_instances": config.k if config.sample_method == "random" else 0,
            "num_train_trials": config.num_trials, "num_outputs": 1, "temperature": 0.0,
            "max_tokens": config.max_tokens, "stop_sequences": [config.stop_token], "model": model,
            "model_deployment": model}


def _states(config: PaperConfig, run: PaperRun, model: str) -> list[dict]:
    split = "test" if config.do_test else "valid"
    shots = config.k if config.sample_method == "random" else 0
    states = []
    for j, (prompt, gold) in enumerate(zip(run.prompts, run.golds)):
        trial, i = divmod(j, run.n)
        instance = {"input": {"text": run.texts[i]}, "references": [{"output": {"text": gold.strip()},
                                                                      "tags": ["correct"]}],
                    "split": split, "id": f"id{i}"}
        request = {"model_deployment": model, "model": model, "embedding": False, "prompt": prompt,
                   "temperature": 0.0, "num_completions": 1, "top_k_per_token": 1, "max_tokens": config.max_tokens,
                   "stop_sequences": [config.stop_token], "echo_prompt": False, "top_p": 1}
        states.append({"instance": instance, "train_trial_index": trial, "request": request,
                       "num_train_instances": shots, "prompt_truncated": False})
    return states


def _write_run(config: PaperConfig, run: PaperRun, done: dict[str, dict], model: Path, suite_dir: Path
               ) -> RunSummary:
    group = HELM_GROUP.get(run.dataset.task, run.dataset.task)
    name = f"{group}:dataset={run.dataset.name},model={model.name}"
    missing = {"completion": None, "finish_reason": "error", "error": "its shard failed every try; rerun",
               "prompt_tokens": 0, "completion_tokens": 0}
    rows = {f"{j}.0": {**missing, **done.get(row_id, {}), "logprobs": None} for j, row_id in enumerate(run.ids)}
    adapter = _adapter(config, run, model.name)
    states = attach_results(_states(config, run, model.name), rows)
    per_instance, stats = evaluate(states, METRICS, adapter, model)
    scenario = {"name": group, "description": f"{run.dataset.name} ({run.dataset.task}) of fm_data_tasks",
                "tags": [run.dataset.task], "definition_path": str(run.folder)}
    run_spec = {"name": name, "scenario_spec": {"class_name": "fm_data_tasks", "args": {"dataset": run.dataset.name}},
                "adapter_spec": adapter, "metric_specs": helm_metric_specs(METRICS), "groups": [group]}
    errors = sum(r["finish_reason"] == "error" for r in rows.values())
    write_run(suite_dir / name, {"run_spec.json": run_spec, "scenario.json": scenario,
                                 "scenario_state.json": {"adapter_spec": adapter, "request_states": states},
                                 "stats.json": stats, "per_instance_stats.json": per_instance},
              {"name": name, "model": str(model), "dataset": run.dataset.name, "error_rows": errors})
    return RunSummary(name=name, model=str(model), status="done", error_rows=errors,
                      metrics=metric_summaries(per_instance, METRICS), instances=run.n)


def write_helm_runs(config: PaperConfig, runs: list[PaperRun], done: dict[str, dict], model: Path) -> Path:
    """One HELM run folder per dataset, the suite summary, and the suite's schema for `helm-summarize
    --schema-path`; returns the suite folder."""
    suite_dir = config.output / "helm" / "runs" / SUITE
    summaries = [_write_run(config, run, done, model, suite_dir) for run in runs]
    write_summary(suite_dir, SUITE, summaries)
    write_suite_schema(suite_dir, run_groups([suite_dir / s.name for s in summaries]))
    return suite_dir
