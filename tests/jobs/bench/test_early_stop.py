"""The W4 line of `bench engine` (rows that finish early): refill and block runs give the same tokens, the
stop string ends every other row, and every figure is filled in."""

from jobs.bench.early_stop import EarlyStopConfig, early_stop_line, w4_requests


def test_w4_requests_mix_lengths_and_stop_strings():
    reqs = w4_requests(EarlyStopConfig(prompts=40), vocab_size=512)
    lengths = [len(r.prompt.split()) for r in reqs]
    assert min(lengths) >= 64 and max(lengths) <= 512 and len(set(lengths)) > 20
    assert all(8 <= r.params.max_new_tokens <= 256 for r in reqs)
    assert sum(bool(r.params.stop) for r in reqs) == 20


def test_early_stop_line_is_exact_and_complete(tmp_path, one_thread):
    cfg = EarlyStopConfig(preset="tiny", prompts=10, prompt_lens=(4, 12), max_new=(2, 12), gbs=3, hf_batches=(4,),
                          repeats=1)
    line = early_stop_line(cfg, str(tmp_path))
    d = line.detail
    assert d["refill_equals_blocks"] is True
    assert d["rows_stopped"] == 5 and d["schedule"]["refilled_rows"] > 0
    assert line.ours > 0 and line.baseline > 0 and d["vs_blocks"] > 0
    assert d["useful_tokens"] < 10 * 12
