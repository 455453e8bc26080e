"""The twelve datasets of "Can Foundation Models Wrangle Your Data?" (Narayan et al., VLDB'23) and the settings
its code (fm_data_tasks) gives each: one table, so a dataset's prompt rules are read in one place.

Every value comes from fm_data_tasks `fm_data_tasks/utils/constants.py` at commit c954cfd (2023-01-18):
task from DATA2TASK, product name from MATCH_PROD_NAME, the imputed column from IMPUTE_COLS, dropped columns
from DATA2DROPCOLS (dropped before renaming), renamed columns from DATA2COLREMAP, the task instruction from
DATA2INSTRUCT, the question suffix from DATA2SUFFIX, and the column that picks a manual prompt from
DATA2EXAMPLE_SUBKEY_ATTR. A dataset is recognized by its folder's name, as the paper's code keys its tables
by `DATASET_PATH/<task folder>/<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jobs.wrangle.data import WrangleInputError

SOURCE = "fm_data_tasks/utils/constants.py @ c954cfd"
# The paper's tasks; error detection on Hospital is the spelling variant (one cell per prompt, no row).
PAPER_TASKS = ("entity_matching", "data_imputation", "error_detection_spelling", "error_detection",
               "schema_matching")
# The column whose class the paper balances with --class_balanced (read_raw_data's label_col).
CLASS_COLUMN = {"entity_matching": "label", "error_detection_spelling": "is_clean", "error_detection": "is_clean",
                "schema_matching": "label"}
# The HELM group a dataset's results belong to (crfm-helm's fm_data_tasks scenarios).
HELM_GROUP = {"entity_matching": "entity_matching", "data_imputation": "entity_data_imputation"}


@dataclass(frozen=True)
class Dataset:
    """One dataset's prompt settings (see the module's docstring for where each comes from)."""

    name: str
    folder: str  # relative to the paper's data/datasets
    task: str
    instruction: str
    suffix: str
    prod_name: str = ""
    impute_col: str | None = None
    drop: tuple[str, ...] = ()
    rename: dict[str, str] = field(default_factory=dict)
    manual_key: str | None = None  # None: one manual prompt for every row

    def __post_init__(self) -> None:
        if self.task not in PAPER_TASKS:
            raise ValueError(f"dataset {self.name}: task {self.task!r} is not one of {PAPER_TASKS}")
        if (self.task == "data_imputation") != (self.impute_col is not None):
            raise ValueError(f"dataset {self.name}: an imputed column is set exactly for imputation")

    @property
    def source(self) -> str:
        return SOURCE

    @property
    def class_column(self) -> str | None:
        return CLASS_COLUMN.get(self.task)


_EM = "entity_matching/structured/"
_SAME = "Are Product A and Product B the same? Yes or No? "
_SAME_Q = " Are Product A and Product B the same?"
_BEER = {"id": "id", "Beer_Name": "name", "Brew_Factory_Name": "factory", "Style": "style", "ABV": "ABV"}
_ITUNES = {"id": "id", "Song_Name": "name", "Artist_Name": "artist name", "Album_Name": "album name",
           "Genre": "genre", "Price": "price", "CopyRight": "CopyRight", "Time": "time", "Released": "released"}

DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("Fodors-Zagats", _EM + "Fodors-Zagats", "entity_matching", _SAME, _SAME_Q, "Product"),
    Dataset("Beer", _EM + "Beer", "entity_matching", _SAME, _SAME_Q, "Product", drop=("Style", "ABV"),
            rename=_BEER),
    Dataset("iTunes-Amazon", _EM + "iTunes-Amazon", "entity_matching",
            "Are Song A and Song B the same? Yes or No? ", " Same Song?", "Song", drop=("CopyRight",),
            rename=_ITUNES),
    Dataset("Walmart-Amazon", _EM + "Walmart-Amazon", "entity_matching", _SAME, " Are A and B the Same?",
            "Product", drop=("category", "price", "brand")),
    Dataset("Amazon-Google", _EM + "Amazon-Google", "entity_matching", _SAME, _SAME_Q, "Product",
            manual_key="manufacturer_A"),
    Dataset("DBLP-ACM", _EM + "DBLP-ACM", "entity_matching", _SAME, _SAME_Q, "Product", manual_key="venue_A"),
    Dataset("DBLP-GoogleScholar", _EM + "DBLP-GoogleScholar", "entity_matching", _SAME, _SAME_Q, "Product",
            manual_key="venue_A"),
    Dataset("Buy", "data_imputation/Buy", "data_imputation",
            "Who is the manufacturer? apple, sony, lg electronics? ", " Who is the manufacturer?",
            impute_col="manufacturer"),
    Dataset("Restaurant", "data_imputation/Restaurant", "data_imputation",
            "What is the city? san fransisco, new york, denver? ", " What is the city?", impute_col="city"),
    Dataset("Hospital", "error_detection/Hospital", "error_detection_spelling",
            "Is there a x spelling error? Yes or No? ", "?", manual_key="col_name"),
    Dataset("Adult", "error_detection/Adult", "error_detection", "Classify errors. nan values are not errors.",
            "? ", manual_key="col_name"),
    Dataset("Synthea", "schema_matching/Synthea", "schema_matching", "Are A and B semantically equal?\n\n",
            "Are A and B the same? Yes or No?", drop=("des1", "des2", "d1", "d2", "d3", "d4"),
            rename={"omop": "left", "table": "right", "label": "label"}, manual_key="left"),
)}


def dataset_of(folder: Path) -> Dataset:
    """The dataset a folder holds, by its name (as in the paper's layout)."""
    name = Path(folder).resolve().name
    if name not in DATASETS:
        raise WrangleInputError(f"--data-dir {folder} is not one of the paper's datasets (its folder name must be "
                                f"one of {', '.join(DATASETS)}); pass a dataset folder such as "
                                f"data/datasets/{DATASETS['Beer'].folder}, or --all with data/datasets")
    return DATASETS[name]


def find_datasets(root: Path) -> list[tuple[Dataset, Path]]:
    """Every paper dataset under `root` (the paper's data/datasets folder), in the table's order."""
    found = [(d, Path(root) / d.folder) for d in DATASETS.values() if (Path(root) / d.folder / "train.csv").is_file()]
    if not found:
        raise WrangleInputError(f"--all found no dataset under {root}: expected the paper's layout, e.g. "
                                f"{Path(root) / DATASETS['Beer'].folder}/train.csv; pass its data/datasets folder")
    return found
