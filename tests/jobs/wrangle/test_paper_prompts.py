"""Dataset mode's prompts equal fm_data_tasks' (commit c954cfd) on the bundled synthetic tables in its layout
(examples/fm_datasets, made by scripts/make_fm_datasets.py). The expected strings are fixtures written from
that code's rules: `Product A is <attr: value. ...>. Product B is <...>.<suffix> ` stripped, few-shot rows
`text + answer` stripped and joined by a blank line, then a blank line and the row; the instruction and a space
first. The k=3 draws are numpy's legacy `permutation` after the class balancing and the shuffle with
random_state 42; they were checked against the paper's own read_data on these files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.wrangle.data import Format, WrangleInputError
from jobs.wrangle.datasets import DATASETS, dataset_of, find_datasets
from jobs.wrangle.paper_job import PaperConfig, build_runs
from jobs.wrangle.paper_prompts import load_manual_prompts
from jobs.wrangle.paper_rows import grouped_join, read_split

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "examples" / "fm_datasets"
BEER = ROOT / "entity_matching/structured/Beer"
HOSPITAL = ROOT / "error_detection/Hospital"
SAME = "Are Product A and Product B the same?"


def prompts(folder: Path, **kw) -> tuple[list[str], list[str]]:
    run = build_runs(PaperConfig(data_dir=folder, output=Path("unused"), **kw))[0]
    return run.prompts, run.golds


def test_k0_with_the_task_instruction():
    got, golds = prompts(BEER, k=0, add_task_instruction=True, nan_tok="", do_test=True)
    assert got[0] == (f"{SAME} Yes or No?  Product A is name: Night Harbor Stout. factory: Lantern Ales. "
                      f"Product B is name: Night Harbor Stout. factory: Lantern. {SAME}")
    assert golds == ["Yes\n", "Yes\n", "No\n", "No\n"] and len(got) == 4


def test_k3_random_class_balanced():
    got, _ = prompts(BEER, k=3, class_balanced=True, nan_tok="", do_test=True)
    shots = [
        "Product A is name: Copper Kettle. factory: Lantern Ales. Product B is name: Blarney Rock Irish Ale. "
        f"factory: Rockyard. {SAME} No",
        "Product A is name: Red Rocket Amber Ale. factory: Third Base Sports Bar. Product B is name: red rocket "
        f"amber ale. factory: . {SAME} Yes",
        "Product A is name: Holy City Mongoose. factory: Holy City Brewing. Product B is name: imperial red ale. "
        f"factory: Brew. {SAME} No",
    ]
    row = ("Product A is name: Night Harbor Stout. factory: Lantern Ales. Product B is name: Night Harbor Stout. "
           f"factory: Lantern. {SAME}")
    assert got[0] == "\n\n".join([*shots, row])
    assert all(p.startswith("\n\n".join(shots) + "\n\n") for p in got)  # one draw for the trial


def test_hospital_spelling_template():
    got, golds = prompts(HOSPITAL, k=0)
    assert got[0] == "Is there a x spelling error in HospitalName: marshxll medical center?"
    assert golds[0] == "Yes\n"
    got, _ = prompts(HOSPITAL, k=0, add_task_instruction=True)
    assert got[0] == ("Is there a x spelling error? Yes or No?  Is there a x spelling error in HospitalName: "
                      "marshxll medical center?")


def test_imputation_and_the_separator_and_nan_tokens():
    got, golds = prompts(ROOT / "data_imputation/Restaurant", k=0, add_task_instruction=True, do_test=True)
    assert got[0] == ("What is the city? san fransisco, new york, denver?  name: zuni cafe. addr: 1658 market st.. "
                      "phone: 415/552-2522. type: mediterranean. What is the city?")
    assert golds[0] == "san francisco\n"
    rows = read_split(ROOT / "data_imputation/Restaurant", DATASETS["Restaurant"], "train", Format(";", "NA"))
    assert rows[3].text == "name: cafe roma ; addr: 3570 las vegas blvd. s ; phone: NA ; type: coffee shops ; What is the city? "


def test_values_keep_pandas_types():
    """A year column with blanks reads as floats (`2003.0`), one without as integers; blanks are --nan-tok."""
    rows = read_split(ROOT / "entity_matching/structured/DBLP-GoogleScholar", DATASETS["DBLP-GoogleScholar"],
                      "train", Format(nan_tok=""))
    assert rows[4].text == ("Product A is title: guest editorial. authors: . venue: . year: 2003. Product B is title: "
                            f"guest editorial. authors: j doe , a roe. venue: vldb. year: 2003.0. {SAME} ")
    assert rows[4].key == "nan"  # the manual prompt key of a blank venue_A, as the paper's prompts are keyed


def test_a_pair_without_its_table_row_is_dropped_with_a_warning(tmp_path, caplog):
    import shutil

    folder = tmp_path / "Beer"
    shutil.copytree(BEER, folder)
    test = folder / "test.csv"
    test.write_text(test.read_text() + "42,1,0\n")
    rows = read_split(folder, DATASETS["Beer"], "test", Format())
    assert len(rows) == 4 and "1 rows have a ltable_id found in no table row (e.g. 42)" in caplog.text


def test_merge_order_is_pandas_1x():
    """pandas 1.x's inner merge grouped rows by key in order of first appearance (pandas 2.2 keeps the left
    order); the paper's splits were read with pandas ^1.4."""
    left = [{"k": 1, "n": 0}, {"k": 2, "n": 1}, {"k": 1, "n": 2}, {"k": 3, "n": 3}]
    joined = grouped_join(left, "k", {1: [{"v": "a"}], 2: [{"v": "b"}]})
    assert [(row["n"], match["v"]) for row, match in joined] == [(0, "a"), (2, "a"), (1, "b")]


MANUAL = '''
DATASET_PATH = "x"
PREFIXES = {
    f"{DATASET_PATH}/entity_matching/structured/Beer": "Product A is name: a. Product B is name: a. Same? Yes\\n",
    f"{DATASET_PATH}/error_detection/Hospital": {
        "HospitalName": "Is there a x spelling error in HospitalName: axb? Yes\\n",
        "Address1": "Is there a x spelling error in Address1: 1 main st? No\\n",
    },
}
'''


def test_manual_prompts_from_the_papers_constants_file(tmp_path):
    constants = tmp_path / "constants.py"
    constants.write_text(MANUAL)
    got, _ = prompts(BEER, sample_method="manual", manual_prompts=constants, nan_tok="", do_test=True)
    assert got[0] == ("Product A is name: a. Product B is name: a. Same? Yes\n\nProduct A is name: Night Harbor "
                      f"Stout. factory: Lantern Ales. Product B is name: Night Harbor Stout. factory: Lantern. {SAME}")
    got, _ = prompts(HOSPITAL, sample_method="manual", manual_prompts=constants, num_run=2)
    assert got == ["Is there a x spelling error in HospitalName: axb? Yes\n\nIs there a x spelling error in "
                   "HospitalName: marshxll medical center?",
                   "Is there a x spelling error in Address1: 1 main st? No\n\nIs there a x spelling error in "
                   "Address1: 2505 us highway 431?"]
    as_json = tmp_path / "prompts.json"
    as_json.write_text(json.dumps(load_manual_prompts(constants)))
    assert prompts(HOSPITAL, sample_method="manual", manual_prompts=as_json, num_run=2)[0] == got
    with pytest.raises(WrangleInputError, match="no Hospital prompt for col_name = 'City'"):
        prompts(HOSPITAL, sample_method="manual", manual_prompts=constants, num_run=3)


def test_trials_draw_different_examples_and_trial_0_is_the_papers():
    one, _ = prompts(BEER, k=3, do_test=True)
    run = build_runs(PaperConfig(data_dir=BEER, output=Path("unused"), k=3, num_trials=3, do_test=True))[0]
    prefixes = {p.rsplit("\n\n", 1)[0] for p in run.prompts}
    assert run.n == 4 and len(run.prompts) == 12 and len(prefixes) == 3
    assert run.prompts[:4] == one and run.ids[4] == "Beer/1/0"


@pytest.mark.parametrize(("kw", "fragment"), [
    ({"sample_method": "validation_clusters"}, "validation_clusters needs the paper's clusters"),
    ({"sample_method": "manual"}, "pass --manual-prompts"),
    ({"k": 99}, "--k 99 exceeds the 12 train rows"),
    ({"task_instruction_idx": 1}, "--task-instruction-idx 1 is invalid"),
    ({"num_run": 0}, "--num-run 0 is invalid"),
])
def test_bad_flags_name_the_fix(kw, fragment):
    with pytest.raises(WrangleInputError, match=fragment):
        prompts(BEER, **kw)


def test_datasets_are_found_by_folder_name():
    assert [d.name for d, _ in find_datasets(ROOT)] == ["Beer", "DBLP-GoogleScholar", "Restaurant", "Hospital",
                                                         "Adult", "Synthea"]
    assert dataset_of(BEER).prod_name == "Product" and DATASETS["iTunes-Amazon"].prod_name == "Song"
    assert len(DATASETS) == 12
    with pytest.raises(WrangleInputError, match="is not one of the paper's datasets"):
        dataset_of(ROOT)
    with pytest.raises(WrangleInputError, match="--all found no dataset under"):
        find_datasets(BEER)


def test_the_script_makes_the_bundled_tables(tmp_path):
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_fm_datasets.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.csv"))
    assert made == sorted(p.relative_to(ROOT) for p in ROOT.rglob("*.csv")) and len(made) == 25
    assert all((tmp_path / p).read_bytes() == (ROOT / p).read_bytes() for p in made)
