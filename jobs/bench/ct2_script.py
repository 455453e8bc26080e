"""A CTranslate2 job as a user writes one, the baseline of `flexbatch bench workloads --whole-process`: read the
prompts of a Parquet file, tokenize them with the checkpoint's tokenizer, load the converted model, generate
greedily exactly --max-new-tokens tokens per row (min_length = max_length), decode the completions and print one
JSON line: the rows, the seconds spent generating and decoding, and each row's generated token count (the bench
checks every row generated exactly that many). It runs as a script (`python ct2_script.py ...`) and imports only
ctranslate2, tokenizers and pyarrow, as such a script would (the lighter `tokenizers` rather than `transformers`:
start-up is not made slower than a user's)."""

from __future__ import annotations

import argparse
import json
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split(":")[0])
    p.add_argument("--model", required=True, help="Folder of the model converted by ct2-transformers-converter.")
    p.add_argument("--tokenizer", required=True, help="The checkpoint's tokenizer.json.")
    p.add_argument("--input", required=True, help="Parquet file with a prompt column.")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--threads", type=int, required=True, help="intra_threads of the generator.")
    p.add_argument("--compute-type", default="int8")
    return p.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    import ctranslate2
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    prompts = pq.read_table(a.input, columns=["prompt"]).column("prompt").to_pylist()
    tok = Tokenizer.from_file(a.tokenizer)
    tokens = [e.tokens for e in tok.encode_batch(prompts)]
    gen = ctranslate2.Generator(a.model, device="cpu", compute_type=a.compute_type, intra_threads=a.threads)
    started = time.perf_counter()
    results = gen.generate_batch(tokens, max_length=a.max_new_tokens, min_length=a.max_new_tokens, sampling_topk=1,
                                 include_prompt_in_result=False)
    completions = tok.decode_batch([r.sequences_ids[0] for r in results])
    print(json.dumps({"rows": len(completions), "generate_seconds": time.perf_counter() - started,
                      "prompt_tokens": [len(t) for t in tokens],
                      "completion_tokens": [len(r.sequences_ids[0]) for r in results]}))


if __name__ == "__main__":
    main()
