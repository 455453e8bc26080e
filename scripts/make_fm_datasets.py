"""Write small synthetic tables in the exact layout and column names of the paper's data folder (fm_data_tasks'
data/datasets), offline and deterministically, for `flexbatch wrangle --data-dir` tests and the README's demo:

    python scripts/make_fm_datasets.py --out examples/fm_datasets --seed 0

One dataset per task: entity_matching/structured/Beer (columns dropped and renamed by the paper),
entity_matching/structured/DBLP-GoogleScholar (a year column with blanks, read as floats: `year: 2003.0`),
data_imputation/Restaurant (city imputed), error_detection/Hospital (spelling errors, one cell per prompt),
error_detection/Adult (table.csv rows with col_name and is_clean) and schema_matching/Synthea. Blank cells
appear where the real data has them. The values are invented; only the layout is the paper's.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

BEERS = [("Red Oak Ale", "Big Brewing Company", "American Amber / Red Ale", "7.60%"),
         ("Holy City Mongoose", "Holy City Brewing", "Amber Ale", "6.90%"),
         ("Soho Red", "Freedom Brewery Ltd", "Amber Lager/Vienna", "4.70%"),
         ("Blarney Rock Irish Ale", "Rockyard Brewing", "Irish Ale", "6.00%"),
         ("Red Rocket Amber Ale", "Third Base Sports Bar", "American Amber / Red Ale", "6.40%"),
         ("Blue Cat Red Toad", "Blue Cat Brew Pub", "Premium Bitter/ESB", "5.70%"),
         ("Red Duck Amber Ale", "Purrumbete Brewing", "Amber Ale", "4.80%"),
         ("Imperial Red Ale", "Brew Brewing Company", "American Amber / Red Ale", "5.40%"),
         ("Copper Kettle", "Lantern Ales", "Irish Red Ale", "5.10%"),
         ("Night Harbor Stout", "Lantern Ales", "Stout", "8.00%")]
PAPERS = [("keynote address", "", "", "1995"), ("guest editorial", "", "", "2003"),
          ("storage of xml data in relations", "", "", "2001"), ("mining data streams", "", "", "2002"),
          ("open object databases", "", "", "1994"), ("workflow management research", "", "", "1996"),
          ("query optimization revisited", "", "", "1999"), ("indexing moving objects", "", "", "2000")]
RESTAURANTS = [("oceana", "55 e. 54th st.", "new york", "212/759-5941", "seafood"),
               ("bamboo garden", "4850 flamingo rd.", "las vegas", "702/871-3262", "asian"),
               ("le chardonnay", "8284 melrose ave.", "los angeles", "213/655-8880", "french"),
               ("cafe roma", "3570 las vegas blvd. s", "las vegas", "", "coffee shops"),
               ("lespinasse", "2 e. 55th st.", "new york", "212/339-6719", "american"),
               ("smith & wollensky", "201 e. 49th st.", "new york", "212/753-1530", "steakhouses"),
               ("campanile", "624 s. la brea ave.", "los angeles", "213/938-1447", "american"),
               ("buzio's", "3700 w. flamingo rd.", "las vegas", "702-252-7697", "seafood"),
               ("fog city diner", "1300 battery st.", "san francisco", "415/982-2000", "american"),
               ("zuni cafe", "1658 market st.", "san francisco", "415/552-2522", "mediterranean"),
               ("brasserie", "100 e. 53rd st.", "new york", "212/751-4840", "french"),
               ("rubicon", "558 sacramento st.", "san francisco", "", "american")]
HOSPITALS = [(10001, "callahan eye foundation", "1720 university blvd", "birmingham", "al", 35233, "jefferson"),
             (10005, "marshall medical center", "2505 us highway 431", "boaz", "al", 35957, "marshall"),
             (10006, "eliza coffee memorial", "205 marengo street", "florence", "al", 35631, "lauderdale"),
             (10007, "crestwood medical center", "one hospital dr se", "huntsville", "al", 35801, "madison")]
ADULT = [("31-50", "State-gov", "Bachelors", "Male", "LessThan50K"),
         ("50-60", "Self-emp", "Bachelors", "Male", "LessThan50K"),
         ("31-50", "Private", "HS-grad", "Female", "LessThan50K"), ("50-60", "Private", "11th", "Male", "MoreThan50K"),
         ("22-30", "Private", "Bachelors", "Female", "MoreThan50K"), ("31-50", "Private", "Masters", "Female", "")]
SYNTHEA = [("person-birth_datetime", "patients-birthdate", 1), ("person-gender_concept_id", "patients-gender", 1),
           ("visit_occurrence-visit_start_date", "encounters-start", 1), ("person-race_concept_id", "patients-ssn", 0),
           ("location-city", "patients-city", 1), ("location-zip", "patients-county", 0),
           ("death-death_date", "patients-deathdate", 1), ("person-year_of_birth", "encounters-stop", 0)]


def write(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def pairs(n: int, rng: random.Random, positive: float) -> list[list]:
    """ltable_id, rtable_id, label: a match pairs an id with itself."""
    out = []
    for _ in range(n):
        a = rng.randrange(n)
        same = rng.random() < positive
        out.append([a, a if same else (a + 1 + rng.randrange(n - 1)) % n, int(same)])
    return out


def split3(rows: list, counts: tuple[int, int, int]) -> dict[str, list]:
    a, b, _ = counts
    return {"train": rows[:a], "valid": rows[a:a + b], "test": rows[a + b:]}


def beer(root: Path, rng: random.Random) -> None:
    head = ["id", "Beer_Name", "Brew_Factory_Name", "Style", "ABV"]
    write(root / "tableA.csv", head, [[i, *b] for i, b in enumerate(BEERS)])
    write(root / "tableB.csv", head, [[i, n.lower() if i % 3 else n, "" if i == 4 else f.split()[0], s, "-"]
                                      for i, (n, f, s, _) in enumerate(BEERS)])
    for name, rows in split3(pairs(len(BEERS), rng, 0.3) + pairs(len(BEERS), rng, 0.5), (12, 4, 4)).items():
        write(root / f"{name}.csv", ["ltable_id", "rtable_id", "label"], rows)


def dblp(root: Path, rng: random.Random) -> None:
    head = ["id", "title", "authors", "venue", "year"]
    write(root / "tableA.csv", head, [[i, *p] for i, p in enumerate(PAPERS)])
    write(root / "tableB.csv", head, [[i, t, "j doe , a roe", "vldb" if i % 2 else "", y if i % 3 else ""]
                                      for i, (t, _, _, y) in enumerate(PAPERS)])
    for name, rows in split3(pairs(len(PAPERS), rng, 0.5) + pairs(len(PAPERS), rng, 0.5), (8, 4, 4)).items():
        write(root / f"{name}.csv", ["ltable_id", "rtable_id", "label"], rows)


def restaurant(root: Path) -> None:
    head = ["id", "name", "addr", "city", "phone", "type"]
    for name, rows in split3([[i, *r] for i, r in enumerate(RESTAURANTS)], (6, 3, 3)).items():
        write(root / f"{name}.csv", head, rows)


def hospital(root: Path, rng: random.Random) -> None:
    cols = ["ProviderNumber", "HospitalName", "Address1", "City", "State", "ZipCode", "CountyName"]
    table, cells = [], []
    for i, row in enumerate(HOSPITALS * 3):
        row = list(row)
        for j, col in enumerate(cols):
            dirty = rng.random() < 0.3 and isinstance(row[j], str)
            if dirty:
                k = rng.randrange(len(row[j]))
                row[j] = row[j][:k] + "x" + row[j][k + 1:]
            cells.append([i, col, int(not dirty)])
        table.append(row)
    write(root / "table.csv", cols, table)
    for name, rows in split3(cells, (36, 12, 12)).items():
        write(root / f"{name}.csv", ["row_id", "col_name", "is_clean"], rows)


def adult(root: Path, rng: random.Random) -> None:
    cols = ["age", "workclass", "education", "sex", "income"]
    table = []
    for i, row in enumerate(ADULT * 2):
        col = cols[i % len(cols)]
        dirty = i % 3 == 0
        row = ["" if (c, i) == ("education", 2) else v for c, v in zip(cols, row)]
        if dirty:
            row[cols.index(col)] = row[cols.index(col)][::-1] or "x"
        table.append([*row, col, int(not dirty)])
    write(root / "table.csv", [*cols, "col_name", "is_clean"], table)
    for name, rows in split3([[i, r[-2], r[-1]] for i, r in enumerate(table)], (6, 3, 3)).items():
        write(root / f"{name}.csv", ["row_id", "col_name", "is_clean"], rows)


def synthea(root: Path) -> None:
    head = ["omop", "table", "label", "des1", "des2", "d1", "d2", "d3", "d4"]
    rows = [[o, t, y, f"{o} description", f"{t} description", "", "", "", ""] for o, t, y in SYNTHEA * 2]
    write(root / "table.csv", ["omop", "table"], [r[:2] for r in rows])
    for name, part in split3(rows, (8, 4, 4)).items():
        write(root / f"{name}.csv", head, part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples/fm_datasets"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    beer(args.out / "entity_matching/structured/Beer", rng)
    dblp(args.out / "entity_matching/structured/DBLP-GoogleScholar", rng)
    restaurant(args.out / "data_imputation/Restaurant")
    hospital(args.out / "error_detection/Hospital", rng)
    adult(args.out / "error_detection/Adult", rng)
    synthea(args.out / "schema_matching/Synthea")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
