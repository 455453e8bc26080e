"""The W4 lines of `bench engine` (rows that finish early): refill, sorted and the block schedule before give the
same tokens, the stop string ends every other row, each run does what it names, and every figure is filled in."""

from jobs.bench.early_stop import EarlyStopConfig, early_stop_lines, w4_requests


def test_w4_requests_mix_lengths_and_stop_strings():
    reqs = w4_requests(EarlyStopConfig(prompts=40), vocab_size=512)
    lengths = [len(r.prompt.split()) for r in reqs]
    assert min(lengths) >= 64 and max(lengths) <= 512 and len(set(lengths)) > 20
    assert all(8 <= r.params.max_new_tokens <= 256 for r in reqs)
    assert sum(bool(r.params.stop) for r in reqs) == 20


def test_early_stop_lines_are_exact_and_complete(tmp_path, one_thread):
    from planner.hardware import save_hardware
    from tests.planner.specs import server_cpu

    cfg = EarlyStopConfig(preset="tiny", prompts=10, prompt_lens=(4, 12), max_new=(2, 12), gbs=3, hf_batches=(4,),
                          repeats=1, one_length_prompt_lens=(2, 6), one_length_max_new=12, one_length_gbs=2,
                          hardware=str(save_hardware(server_cpu(), tmp_path / "hw.json")))
    lines = early_stop_lines(cfg, str(tmp_path))
    assert [line.id for line in lines] == ["early-stop", "early-stop-blocks", "early-stop-sorted", "early-stop-choice",
                                           "early-stop-choice-one-length"]
    for choice in lines[3:]:  # the planner's pick vs the other, both measured
        picked = "refill" if choice.detail["refill"] else "sorted"
        assert picked in choice.what and choice.ours > 0 and choice.baseline > 0 and choice.target == 1.0
        assert set(choice.detail["predicted_s"]) == {"refill", "sorted"}
    assert lines[4].detail["tokens_equal"] is True
    d = lines[0].detail
    assert d["tokens_equal"] is True
    assert d["rows_stopped"] == 5 and d["schedule"]["refill"]["refilled_rows"] > 0
    runs = d["schedule"]
    assert runs["sorted"]["refilled_rows"] == runs["blocks"]["refilled_rows"] == 0
    assert runs["sorted"]["row_steps"] < runs["blocks"]["row_steps"]  # finished rows dropped only in `sorted`
    assert all(line.ours > 0 and line.baseline > 0 for line in lines) and d["vs_blocks"] > 0
    assert d["useful_tokens"] < 10 * 12
