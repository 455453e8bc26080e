import json

from click.testing import CliRunner

from jobs import cli
from planner.hardware import save_hardware
from tests.planner.specs import server_cpu


def test_bench_planner_reports_predicted_against_measured(tmp_path, one_thread):
    hw = save_hardware(server_cpu(), tmp_path / "hw.json")
    out = tmp_path / "planner.json"
    args = ["bench", "planner", "--models", "tiny", "--workloads", "8x3x4", "--policies", "cpu 4x1,4-bit KV 16x1",
            "--repeats", "1", "--hardware", str(hw), "--cache-dir", str(tmp_path / "cache"), "--output", str(out)]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads(out.read_text())
    assert len(report["grid"]) == 2 and len(report["chosen"]) == 1
    for row in report["grid"] + report["chosen"]:
        assert row["predicted_s"] > 0 and row["measured_s"] > 0
    assert "median |error|" in result.output and "planner on tiny" in result.output
    assert report["chosen"][0]["best_grid"] in ("cpu 4x1", "4-bit KV 16x1")


def test_bench_planner_names_a_missing_model(tmp_path):
    result = CliRunner().invoke(cli.main, ["bench", "planner", "--models", str(tmp_path / "none"),
                                           "--hardware", str(save_hardware(server_cpu(), tmp_path / "hw.json"))])
    assert result.exit_code == 2 and "does not exist" in result.output
