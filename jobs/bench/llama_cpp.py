"""llama.cpp as a peer of `flexbatch bench workloads --llama-cpp DIR`: the lines "llama.cpp bf16", "llama.cpp Q8_0" and
"llama.cpp Q4_0", each timed by llama.cpp's own `llama-batched-bench` (built into DIR by scripts/setup_llama_cpp.sh
from the source vendored in the llama-cpp-python sdist) on a GGUF of the bench's checkpoint.

The GGUF: convert_hf_to_gguf.py refuses the checkpoint's word-level tokenizer (an unknown tokenizer, refused by
hash) but accepts a SentencePiece `tokenizer.model`, so it converts a folder holding links to the checkpoint's
config and weights and a SentencePiece model of the same vocabulary size, trained (in DIR's venv) on generated
text; bf16 as the checkpoint is, then `llama-quantize` to Q8_0 and Q4_0. The tokenizer never runs:
llama-batched-bench makes its own random prompt tokens. The GGUFs are cached beside the checkpoint
(`<preset>-gguf/`), rebuilt when the checkpoint is.

A run: `llama-batched-bench -npp P -ntg G-1 -npl N -no-kvu` decodes N separate prompts of P tokens in one batched
prefill (logits of each prompt's last token: its first generated token), then G-1 batched decode steps of N tokens:
the P + G - 1 tokens per row that flexbatch's lines run through the layers for G generated tokens. Its table's
columns T_PP s (the prefill) and T_TG s (the decode steps) are the line's seconds: tokens/s = N * G / (T_PP + T_TG),
counted as the other lines count theirs, model load, weight repacking and its warm-up excluded (as the loaded
processes of the other lines exclude theirs). A context holds at most 256 sequences (LLAMA_MAX_SEQ): a larger
batch runs as several, as even as possible (`-npl 256,256` for 512 rows), one after the other in one process,
their seconds summed. Its logger prints from a thread of its own that the process does not wait for at exit, so on
a busy machine the last result line can be lost: a run missing any expected line is run again."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click

from engine.dtypes import cpu_info
from jobs.bench import whole_process as wp

log = logging.getLogger(__name__)
SETUP_SCRIPT = "scripts/setup_llama_cpp.sh"
FORMATS = {"bf16": "", "Q8_0": " int8", "Q4_0": " int4"}  # GGUF type -> the flexbatch line (suffix) of its width
# a config's model_type -> the class convert_hf_to_gguf.py converts (its Qwen3 and Gemma 3 converters, as its Llama
# one, take the vocabulary from a SentencePiece tokenizer.model where the folder has one; Mixtral's is its Llama
# converter, which stacks each layer's experts into one tensor per projection, as its Qwen2-MoE one does for Qwen3-MoE)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
# the converter classes that read only a BPE tokenizer they know by hash (Qwen2-MoE's, which converts Qwen3-MoE):
# for these model types the converter runs with its set_vocab taking the SentencePiece tokenizer.model, as its dense
# Qwen converter does first; every tensor and setting is converted by its own code unchanged
SPM_FIRST = {"qwen3_moe": ("conversion.qwen", "Qwen2MoeModel")}
# argv: convert_hf_to_gguf.py, the module and class of SPM_FIRST, then the converter's own arguments
CONVERT_SPM_FIRST = r"""
import importlib, pathlib, runpy, sys
script, module, name = sys.argv[1:4]
sys.path.insert(0, str(pathlib.Path(script).parent))
getattr(importlib.import_module(module), name).set_vocab = lambda self: self._set_vocab_sentencepiece()
sys.argv = [script, *sys.argv[4:]]
runpy.run_path(script, run_name="__main__")
"""
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequences one context holds
# how llama.cpp loads the GGUF (its -lm and --no-repack): "mmap", its default, maps the file and also keeps repacked
# copies of the weights its kernels reorder (at 7B in Q4_0: 3.9 GB mapped beside 3.7 GB repacked); "none" reads the
# file into its buffers, the repacked weights once; "mmap-no-repack" maps the file and computes on the mapped
# weights as they are, so they stay page cache the kernel may drop and read again (under a memory limit below the
# GGUF's size the only mode that does not hold every weight in its own memory)
LOAD_MODES = ("mmap", "none", "mmap-no-repack")
LOAD_FLAGS = {"mmap": ["-lm", "mmap"], "none": ["-lm", "none"], "mmap-no-repack": ["-lm", "mmap", "--no-repack"]}
BATCH, UBATCH = 2048, 512  # llama.cpp's defaults of -b (tokens per llama_decode call) and -ub (per graph)
ATTEMPTS = 3  # runs of llama-batched-bench until every expected result line was printed
# where llama.cpp's AMX kernels (its own layout of Q4_0/Q8_0 weights, used where the CPU has amx_int8) crash, as its
# issue 20824 reports of some machines (measured here: a SIGSEGV in ggml_backend_amx_mul_mat at the first Q4_0 or
# Q8_0 matmul, on an AMX Xeon; bf16 runs), the build without them still repacks Q4_0 for AVX-512
AMX_CRASH = ("llama.cpp's AMX kernels crash on some CPUs (ggml-org/llama.cpp#20824): build DIR without them, "
             f"{SETUP_SCRIPT} --no-amx DIR (CMAKE_C_FLAGS and CMAKE_CXX_FLAGS '-mno-amx-tile -mno-amx-int8 "
             "-mno-amx-bf16'; docs/BENCHMARKS.md, Qwen3 and Gemma 3 against llama.cpp)")
COLUMNS = ("pp", "tg", "pl", "n_kv", "t_pp", "s_pp", "t_tg", "s_tg", "t", "s")  # its table: PP .. S t/s
_NUM = r"\s*(-?(?:[\d.]+|nan|inf))\s*"
ROW = re.compile(r"^\|" + r"\|".join([_NUM] * len(COLUMNS)) + r"\|\s*$", re.M)

# Trains the SentencePiece model the converter accepts, on generated words (syllable strings, enough distinct
# ones for the vocabulary), in DIR's venv: argv out_prefix vocab_size.
SPM_TRAIN = r"""
import random, sys
import sentencepiece as spm
prefix, vocab = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(4 * vocab)]
lines = [" ".join(rng.choice(words) for _ in range(16)) for _ in range(max(2000, 3 * vocab))]
spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=vocab, model_type="bpe",
                               byte_fallback=True, character_coverage=1.0, num_threads=1, minloglevel=2)
print(spm.SentencePieceProcessor(model_file=prefix + ".model").vocab_size())
"""


@dataclass(frozen=True)
class LlamaCpp:
    """What scripts/setup_llama_cpp.sh builds in `root`."""

    root: Path

    @property
    def bench(self) -> Path:
        return self.root / "build" / "bin" / "llama-batched-bench"

    @property
    def quantize(self) -> Path:
        return self.root / "build" / "bin" / "llama-quantize"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def convert_script(self) -> Path:
        return self.root / "src" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"


def llama_cpp_tools(root: str | Path | None) -> LlamaCpp | None:
    """The llama.cpp build in `root` (None: no llama.cpp lines); a one-line error where any part is missing."""
    if root is None:
        return None
    tools = LlamaCpp(Path(root).absolute())
    missing = [p for p in (tools.bench, tools.quantize, tools.python, tools.convert_script) if not p.is_file()]
    if missing:
        raise click.UsageError(f"no llama.cpp build at {root} ({missing[0]} is missing): build it with "
                               f"{SETUP_SCRIPT} {root}, or leave --llama-cpp out")
    return tools


def _run(argv: list, what: str) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise click.ClickException(f"{what} exited {done.returncode}: {(done.stderr or done.stdout).strip()[-600:]}")
    return done.stdout


def gguf_models(tools: LlamaCpp, model_dir: Path, formats: tuple[str, ...] = tuple(FORMATS)) -> dict[str, Path]:
    """The checkpoint as GGUF files, one per type in `formats`, cached in `<checkpoint>-gguf/` beside it (all
    rebuilt when the checkpoint's complete.json changes; a type asked for later is added). The bf16 file every
    other type is quantized from is kept only where it is asked for: at a 7B size it is 14 GB of disk. Each file
    is written under a temporary name and renamed once complete, so an interrupted conversion is never cached."""
    out = model_dir.parent / f"{model_dir.name}-gguf"
    files = {fmt: out / f"{fmt}.gguf" for fmt in formats}
    stamp, built = model_dir / "complete.json", out / "complete.json"
    if not (built.is_file() and built.read_text() == stamp.read_text()):
        shutil.rmtree(out, ignore_errors=True)
    missing = [fmt for fmt in formats if not files[fmt].is_file()]
    if not missing:
        return files
    out.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to GGUF (%s) in %s", model_dir, ", ".join(missing), out)
    bf16, converted = out / "bf16.gguf", False
    if not bf16.is_file():
        _convert_bf16(tools, model_dir, bf16)
        converted = True
    for fmt in missing:
        if fmt != "bf16":
            partial = files[fmt].with_suffix(".partial")
            _run([tools.quantize, bf16, partial, fmt], f"llama-quantize to {fmt}")
            partial.rename(files[fmt])
    if converted and "bf16" not in formats:
        bf16.unlink()
    built.write_text(stamp.read_text())
    return files


def _convert_bf16(tools: LlamaCpp, model_dir: Path, bf16: Path) -> None:
    """convert_hf_to_gguf.py on a folder of links to the checkpoint, with a SentencePiece model of its vocabulary
    size (see the module docstring), bf16 as the checkpoint is."""
    with tempfile.TemporaryDirectory(prefix="flexbatch-gguf-") as tmp:
        hf = Path(tmp) / model_dir.name  # the converter names the model after its folder
        hf.mkdir()
        for f in model_dir.iterdir():
            if f.name == "generation_config.json" or f.name.startswith("model"):
                (hf / f.name).symlink_to(f.absolute())
        config = json.loads((model_dir / "config.json").read_text())
        # the converter picks its model class by the config's architectures, which a checkpoint written without
        # save_pretrained may lack (the bench's sharded 7B and 13B checkpoints before they named it)
        config.setdefault("architectures", [ARCHITECTURES[config["model_type"]]])
        (hf / "config.json").write_text(json.dumps(config))
        vocab = config["vocab_size"]
        trained = int(_run([tools.python, "-c", SPM_TRAIN, hf / "tokenizer", vocab], "training SentencePiece")
                      .split()[-1])
        assert trained == vocab, f"SentencePiece trained {trained} pieces, not {vocab}"
        partial = bf16.with_suffix(".partial")
        spm_first = SPM_FIRST.get(config["model_type"])
        script = ["-c", CONVERT_SPM_FIRST, tools.convert_script, *spm_first] if spm_first else [tools.convert_script]
        _run([tools.python, *script, hf, "--outtype", "bf16", "--outfile", partial], "convert_hf_to_gguf.py")
        partial.rename(bf16)


def sequence_chunks(rows: int) -> list[int]:
    """`rows` prompts as batches of at most MAX_SEQUENCES, as even as possible: 512 -> [256, 256]."""
    n = math.ceil(rows / MAX_SEQUENCES)
    return [rows // n + (i < rows % n) for i in range(n)]


def bench_command(tools: LlamaCpp, gguf: Path, rows: int, prompt_len: int, gen_len: int, threads: int,
                  load_mode: str = "mmap") -> list[str]:
    """llama-batched-bench on `rows` separate prompts of prompt_len tokens generating gen_len tokens each (prefill
    + gen_len - 1 decode steps), with a context of every sequence of the largest chunk (-c: pl * (pp + tg)), the
    GGUF loaded by `load_mode` (LOAD_MODES)."""
    chunks, tg = sequence_chunks(rows), gen_len - 1
    return [str(tools.bench), "-m", str(gguf), "-npp", str(prompt_len), "-ntg", str(tg),
            "-npl", ",".join(map(str, chunks)), "-no-kvu", "-fa", "auto", "-t", str(threads), "-tb", str(threads),
            "-c", str(max(chunks) * (prompt_len + tg)), "-b", str(BATCH), "-ub", str(UBATCH), *LOAD_FLAGS[load_mode]]


def parse_results(text: str) -> list[dict]:
    """The rows of llama-batched-bench's result table (Markdown): PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s,
    S_TG t/s, T s, S t/s, in order; a line cut short is not a row."""
    return [{k: (int(v) if k in ("pp", "tg", "pl", "n_kv") else float(v)) for k, v in zip(COLUMNS, m.groups())}
            for m in ROW.finditer(text)]


def missing_rows(results: list[dict], rows: int, prompt_len: int, gen_len: int) -> list[int]:
    """The chunk sizes (B) with no result row of the expected PP and TG."""
    left = sequence_chunks(rows)
    for r in results:
        if r["pp"] == prompt_len and r["tg"] == gen_len - 1 and r["pl"] in left:
            left.remove(r["pl"])
    return left


def run_batched_bench(tools: LlamaCpp, gguf: Path, rows: int, prompt_len: int, gen_len: int, threads: int,
                      load_mode: str = "mmap") -> dict:
    """One timed run (see the module docstring): seconds = the chunks' T_PP + T_TG, tokens = rows * gen_len; also
    the process's peak RSS, its wall seconds (load included) and the rows of its table."""
    argv = bench_command(tools, gguf, rows, prompt_len, gen_len, threads, load_mode)
    for attempt in range(1, ATTEMPTS + 1):
        with tempfile.TemporaryDirectory(prefix="flexbatch-llama-cpp-") as tmp:
            done = _run_batched_process(argv, threads, Path(tmp))
        results = parse_results(done["stdout"])
        if not (left := missing_rows(results, rows, prompt_len, gen_len)):
            break
        log.warning("llama-batched-bench printed no result line for B=%s (attempt %d of %d)", left, attempt, ATTEMPTS)
    else:
        raise click.ClickException(f"llama-batched-bench printed no result line for B={left} in {ATTEMPTS} runs of "
                                   f"`{' '.join(argv)}`: {done['stdout'].strip()[-300:]!r}")
    prefill, decode = sum(r["t_pp"] for r in results), sum(r["t_tg"] for r in results)
    tokens, seconds = rows * gen_len, prefill + decode
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "peak_rss_growth_bytes": None,
            "cpu_seconds": None, "tokens_per_cpu_s": None, "phase_seconds": {"prefill": prefill, "decode": decode},
            "peak_rss_bytes": done["peak_rss_bytes"], "process_seconds": done["seconds"], "attempts": attempt,
            "results": results, "command": argv}


def _run_batched_process(argv: list[str], threads: int, workdir: Path) -> dict:
    """wp.run_process, a crash on a CPU with AMX naming its known cause and the build that avoids it."""
    try:
        return wp.run_process(argv, threads, workdir)
    except click.ClickException as e:
        if " exited -11:" in e.message and "amx_int8" in (cpu_info("flags") or "").split():
            raise click.ClickException(f"{e.message}\n{AMX_CRASH}") from None
        raise


class LlamaCppLine:
    """A llama.cpp line among the loaded processes of `bench workloads` (the same run/close/added_rss_bytes as
    jobs/bench/line_process.LineProcess): each run is a llama-batched-bench process; the memory is its peak RSS."""

    def __init__(self, tools: LlamaCpp, gguf: Path, prompt_len: int, rows: int, threads: int):
        self.tools, self.gguf, self.prompt_len, self.rows, self.threads = tools, gguf, prompt_len, rows, threads
        self.added_rss_bytes = 0

    def run(self, gen_len: int) -> dict:
        res = run_batched_bench(self.tools, self.gguf, self.rows, self.prompt_len, gen_len, self.threads)
        self.added_rss_bytes = max(self.added_rss_bytes, res["peak_rss_bytes"])
        return res

    def close(self) -> None:
        pass


def llama_cpp_lines(tools: LlamaCpp, model_dir: Path, rows: int, prompt_len: int, threads: int) -> dict:
    """The lines "llama.cpp bf16", "llama.cpp Q8_0", "llama.cpp Q4_0" (GGUFs converted on first use)."""
    return {line_name(fmt): LlamaCppLine(tools, gguf, prompt_len, rows, threads)
            for fmt, gguf in gguf_models(tools, model_dir).items()}


def line_name(fmt: str) -> str:
    return f"llama.cpp {fmt}"


def same_bits_line(fmt: str, dtype: str) -> str:
    """The flexbatch line whose weights have the width of GGUF type `fmt` (bf16: the uncompressed line; in a float32
    run the line with bfloat16 weights at rest, whose weights are as many bytes as the GGUF's)."""
    if fmt == "bf16" and dtype == "float32":
        return "flexbatch float32 bf16"
    return f"flexbatch {dtype}{FORMATS[fmt]}"
