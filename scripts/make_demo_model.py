"""Train the small Llama demo model under examples/, offline and deterministically.

    python scripts/make_demo_model.py --out examples/demo-model --steps 2400 --seed 0 --threads 2

writes the checkpoint (config, safetensors, tokenizer, eval.json) to --out and, next to it, the held-out
data (demo-data/), the bundled prompts (prompts.parquet) and the report (DEMO_MODEL.md).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402

log = logging.getLogger("make_demo_model")
EOS = "<|endoftext|>"
DOC_ROW_FRACTION = 0.25  # share of batch rows drawn from docstrings; the rest are synthetic task lines
CHANCE = {"facts": 1 / 8, "compare": 1 / 2, "copy": 0.0, "match": 1 / 2, "addition": 1 / 179}
CHANCE_NOTE = {"facts": "1 of 8 values per relation", "compare": "one of the two numbers",
               "copy": "random strings", "match": "balanced Yes/No", "addition": "sums 20..198"}
FREE_PROMPTS = ('def read_lines(path):\n    """', '"""Return the', "def is_valid(name):\n    \"\"\"Return True if",
                "class Queue:\n    \"\"\"")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("examples/demo-model"), help="checkpoint folder")
    p.add_argument("--steps", type=int, default=2400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="train matmuls in fp32, not bf16 autocast")
    p.add_argument("--max-new-tokens", type=int, default=16)
    return p.parse_args(argv)


# ---------------------------------------------------------------- tokenizer


def _pair_stats(words: list[list[str]], counts: list[int]):
    pairs: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pairs[pair] += counts[i]
            where[pair].add(i)
    return pairs, where


def _merge_word(word: list[str], pair: tuple[str, str]) -> list[str]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def bpe_merges(word_counts: Counter, n_tokens: int) -> list[tuple[str, str]]:
    """BPE merges making `n_tokens` new tokens, most frequent pair first, ties broken by the smaller pair:
    the same on every run (the `tokenizers` trainer breaks ties in hash-map order, so its merges vary
    between processes)."""
    keys = sorted(word_counts)
    words, counts = [list(k) for k in keys], [word_counts[k] for k in keys]
    pairs, where = _pair_stats(words, counts)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    made: set[str] = set()  # two merges may make the same string ("a"+"bc", "ab"+"c")
    while heap and len(made) < n_tokens:
        neg, best = heapq.heappop(heap)
        if pairs.get(best, 0) != -neg or neg == 0:
            continue  # stale entry: the count changed after it was pushed
        merges.append(best)
        made.add(best[0] + best[1])
        changed = set()
        for i in sorted(where.pop(best)):
            old, new = words[i], _merge_word(words[i], best)
            for pair in zip(old, old[1:]):
                pairs[pair] -= counts[i]
                changed.add(pair)
            for pair in zip(new, new[1:]):
                pairs[pair] += counts[i]
                where[pair].add(i)
                changed.add(pair)
            words[i] = new
        for pair in sorted(changed):
            if pairs[pair] > 0:
                heapq.heappush(heap, (-pairs[pair], pair))
    return merges


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (digits split one by one), `<|endoftext|>` as bos/eos, prepended to every encoding."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    word_counts = Counter(w for text in texts for w, _ in pre.pre_tokenize_str(text))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = bpe_merges(word_counts, vocab_size - 1 - len(alphabet))
    tokens = list(dict.fromkeys([EOS, *alphabet, *(a + b for a, b in merges)]))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True)])
    tok.post_processor = processors.TemplateProcessing(single=f"{EOS} $A", pair=f"{EOS} $A {EOS} $B",
                                                       special_tokens=[(EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS,
                                   unk_token=None, model_max_length=512)


def tokenizer_texts(docs: list[str], tasks: demo_corpus.Tasks, seed: int, n_lines: int = 20000) -> list[str]:
    rng = random.Random(seed + 2)
    lines = [tasks.training_line(rng) for _ in range(n_lines)]
    return docs + ["".join(lines[i:i + 20]) for i in range(0, n_lines, 20)]


# ---------------------------------------------------------------- data files


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_data(tasks: demo_corpus.Tasks, seed: int, root: Path) -> None:
    """Held-out instances per task, a few-shot train file, and the bundled prompts for `make demo`."""
    for task, rows in tasks.held_out.items():
        write_jsonl(root / "demo-data" / f"{task}.jsonl", rows)
    write_jsonl(root / "demo-data" / "train.jsonl", demo_corpus.few_shot(tasks, seed))
    rows = [r for task in demo_corpus.TASKS for r in tasks.held_out[task][:4]]
    ids = [r["id"] for r in rows] + [f"free-{i:04d}" for i in range(len(FREE_PROMPTS))]
    prompts = [r["input"] for r in rows] + list(FREE_PROMPTS)
    # task answers end at a newline: those rows carry their own stop string (a per-row override)
    stops = [["\n"]] * len(rows) + [None] * len(FREE_PROMPTS)
    table = pa.table({"id": pa.array(ids, pa.string()), "prompt": pa.array(prompts, pa.string()),
                      "stop": pa.array(stops, pa.list_(pa.string()))})
    pq.write_table(table, root / "prompts.parquet")


# ---------------------------------------------------------------- batches


def docstring_stream(tok: PreTrainedTokenizerFast, docs: list[str]) -> torch.Tensor:
    """All docstrings as one token stream, each document starting with bos."""
    encoded = tok.backend_tokenizer.encode_batch(docs)
    return torch.tensor([t for enc in encoded for t in enc.ids], dtype=torch.long)


def synthetic_row(rng: random.Random, tasks: demo_corpus.Tasks, tok: PreTrainedTokenizerFast,
                  length: int) -> list[int]:
    """bos followed by task lines, cut to `length` tokens."""
    ids: list[int] = []
    while len(ids) < length:
        text = "".join(tasks.training_line(rng) for _ in range(12))
        ids += tok(text, add_special_tokens=not ids)["input_ids"]
    return ids[:length]


def make_batch(rng: random.Random, tasks: demo_corpus.Tasks, tok: PreTrainedTokenizerFast,
               stream: torch.Tensor, batch_size: int, seq_len: int) -> torch.Tensor:
    """(B, seq_len + 1) token ids: random docstring windows and fresh synthetic rows."""
    rows = []
    for _ in range(batch_size):
        if rng.random() < DOC_ROW_FRACTION:
            start = rng.randrange(len(stream) - seq_len - 1)
            rows.append(stream[start:start + seq_len + 1])
        else:
            rows.append(torch.tensor(synthetic_row(rng, tasks, tok, seq_len + 1)))
    return torch.stack(rows)


# ---------------------------------------------------------------- model and training


def build_model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=688, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id, do_sample=False)
    return model


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warmup over 5 % of the steps, then cosine down to 10 % of the peak."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: LlamaForCausalLM, next_batch, args: argparse.Namespace) -> dict:
    """Train for `args.steps`; returns wall time, steps/s and the mean loss of the last 50 steps."""
    opt = make_optimizer(model, args.lr)
    model.train()
    losses, start = [], time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        batch = next_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=batch[:, :-1]).logits  # (B, S, V)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 25 == 0 or step == args.steps - 1:
            elapsed = time.time() - start
            log.info("step %d/%d loss %.4f lr %.2e elapsed %.0fs %.3f steps/s", step, args.steps, loss.item(),
                     opt.param_groups[0]["lr"], elapsed, (step + 1) / elapsed)
    wall = time.time() - start
    tail = losses[-50:]
    return {"steps": args.steps, "wall_s": round(wall, 1), "steps_per_s": round(args.steps / wall, 3),
            "final_loss": round(sum(tail) / len(tail), 4)}


# ---------------------------------------------------------------- evaluation


def newline_token_ids(tok: PreTrainedTokenizerFast) -> list[int]:
    """Every token whose text contains a newline: generation stops at the first one."""
    return [i for i in range(len(tok)) if "\n" in tok.decode([i])]


@torch.no_grad()
def complete(model, tok, prompt: str, max_new_tokens: int, stop_ids: list[int]) -> str:
    """Greedy completion of `prompt`, cut at the first newline."""
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=stop_ids)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0]


def evaluate(model, tok, held_out: dict[str, list[dict]], max_new_tokens: int) -> dict:
    """Exact-match accuracy (whitespace stripped) per task on the held-out instances."""
    model.eval()
    stop_ids = newline_token_ids(tok)
    results = {}
    for task, rows in held_out.items():
        outputs = [complete(model, tok, r["input"], max_new_tokens, stop_ids).strip() for r in rows]
        correct = sum(o in r["references"] for o, r in zip(outputs, rows))
        results[task] = {"n": len(rows), "correct": correct, "accuracy": round(correct / len(rows), 4),
                         "chance": round(CHANCE[task], 4),
                         "samples": [{"input": r["input"], "output": o, "reference": r["references"][0]}
                                     for r, o in list(zip(rows, outputs))[:3]]}
        log.info("%s: %d/%d = %.1f %% (chance %.1f %%)", task, correct, len(rows), 100 * correct / len(rows),
                 100 * CHANCE[task])
    return results


@torch.no_grad()
def free_text(model, tok, max_new_tokens: int = 40) -> list[dict]:
    """Greedy continuations of the free-text prompts, to show what the model writes."""
    model.eval()
    out = []
    for prompt in FREE_PROMPTS:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False)
        out.append({"prompt": prompt, "output": tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)})
    return out


# ---------------------------------------------------------------- report

REPORT_HEAD = """# The demo model

A {params_m:.1f}M-parameter Llama-architecture checkpoint (`demo-model/`), trained from scratch on this
machine's CPUs by `scripts/make_demo_model.py` so that tests, `make demo` and benchmarks have a real,
trained model that loads offline in milliseconds. It is a toy: its value is that its outputs are
deterministic and checkable, not that they are good.

- Architecture: `LlamaForCausalLM`, hidden 256, 6 layers, 4 query heads and 2 KV heads (GQA), MLP 688,
  RoPE, RMSNorm, untied embeddings, max 512 positions, float32 safetensors.
- Tokenizer: byte-level BPE (`tokenizers`), vocabulary {vocab}, digits split one by one; `<|endoftext|>`
  (id {eos}) is bos, eos and pad, and the tokenizer prepends it to every prompt.
- Corpus: Python {python} stdlib docstrings read with `inspect` ({doc_chars:,} characters, formatted as
  `def name(signature):` + docstring; {doc_pct:.0f} % of the rows) and synthetic task lines (the rest),
  generated fresh for every batch (`scripts/demo_corpus.py`).
- Training: {steps} steps of AdamW (peak lr {lr}, betas 0.9/0.95, weight decay 0.1, 5 % warmup, cosine to
  10 %), batch {batch} x {seq} tokens, bf16 autocast: {bf16}, seed {seed}, {threads} threads, torch {torch},
  transformers {transformers}. Wall time {wall_min:.1f} min ({sps:.2f} steps/s, on a shared 2-core machine);
  mean loss over the last 50 steps {loss:.3f}.

Reproduce with `python scripts/make_demo_model.py --out examples/demo-model --steps {steps} --seed {seed}
--threads {threads}` (bit-exact results need the same torch build and thread count).

## Held-out accuracy

Greedy decoding (HF `generate`, at most {max_new} new tokens, cut at the first newline), exact match after
stripping whitespace. The instances are in `demo-data/<task>.jsonl`; none occurs in the training text.

| task | example prompt | n | accuracy | chance |
|---|---|---|---|---|
"""

TASK_NOTES = """
- `facts`: an invented table (48 cities -> 8 invented countries, 48 gadgets -> 8 invented makers, 48 people
  -> 8 colors). Training states each fact in three phrasings and asks it in three of four question templates;
  the held-out question uses the fourth template for that fact (each template is seen with other facts).
- `compare`: larger/smaller of two two-digit numbers; held-out number pairs never appear in training (in
  any order, in any task).
- `copy`: `Repeat: <2-3 random letter strings> ->`; held-out strings never appear in training.
- `match`: product entity matching, Yes/No balanced; Yes = same product written differently (abbreviated,
  words dropped, lowercased), No = a different product, mostly of the same brand. Held-out pairs are built
  from a fifth of the product table that training never shows.
- `addition`: two-digit sums; held-out pairs never appear in training (in either order).
"""


def write_report(path: Path, info: dict, results: dict, samples: list[dict]) -> None:
    lines = [REPORT_HEAD.format(**info)]
    for task, r in results.items():
        prompt = r["samples"][0]["input"].replace("|", "\\|")
        lines.append(f"| {task} | `{prompt}` | {r['n']} | {100 * r['accuracy']:.1f} % | "
                     f"{100 * r['chance']:.1f} % ({CHANCE_NOTE[task]}) |\n")
    lines.append(TASK_NOTES)
    lines.append("\n## Free text (greedy, 40 new tokens)\n\n")
    for s in samples:
        lines.append(f"```\n{s['prompt']}{s['output']}\n```\n\n")
    path.write_text("".join(lines))


def run_info(args: argparse.Namespace, model, tok, docs: list[str], stats: dict) -> dict:
    return {"params_m": sum(p.numel() for p in model.parameters()) / 1e6, "vocab": len(tok),
            "eos": tok.eos_token_id, "python": sys.version.split()[0], "doc_chars": sum(map(len, docs)),
            "doc_pct": 100 * DOC_ROW_FRACTION, "steps": args.steps, "lr": args.lr, "batch": args.batch_size,
            "seq": args.seq_len, "bf16": "yes" if args.bf16 else "no", "seed": args.seed,
            "threads": args.threads, "torch": torch.__version__, "transformers": transformers.__version__,
            "wall_min": stats["wall_s"] / 60, "sps": stats["steps_per_s"], "loss": stats["final_loss"],
            "max_new": args.max_new_tokens}


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    root = args.out.resolve().parent
    docs = demo_corpus.stdlib_docstrings()
    tasks = demo_corpus.build_tasks(args.seed)
    write_data(tasks, args.seed, root)
    tok = train_tokenizer(tokenizer_texts(docs, tasks, args.seed), args.vocab_size)
    stream = docstring_stream(tok, docs)
    log.info("docstrings: %d documents, %d tokens; vocab %d", len(docs), len(stream), len(tok))
    model = build_model(tok)
    log.info("model: %.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)
    rng = random.Random(args.seed)
    stats = train(model, lambda: make_batch(rng, tasks, tok, stream, args.batch_size, args.seq_len), args)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    results = evaluate(model, tok, tasks.held_out, args.max_new_tokens)
    samples = free_text(model, tok)
    info = run_info(args, model, tok, docs, stats)
    (args.out / "eval.json").write_text(json.dumps({"training": stats, "tasks": results, "free_text": samples,
                                                    "run": info}, indent=2) + "\n")
    write_report(root / "DEMO_MODEL.md", info, results, samples)
    log.info("wrote %s and %s", args.out, root / "DEMO_MODEL.md")


if __name__ == "__main__":
    main()
