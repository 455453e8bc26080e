"""Training text and held-out tasks for the demo model.

Two sources, both deterministic:

- Python stdlib docstrings, read offline with `inspect` from a fixed list of modules, formatted as
  ``def name(signature):`` followed by the docstring, so that free-text prompts can start a docstring.
- Synthetic tasks with short answers, one instance per line, every answer ending with a newline:
  ``facts`` (a fixed invented table, asked in a held-out phrasing per fact), ``compare`` (larger/smaller of
  two numbers), ``copy`` (repeat a string), ``match`` (product entity matching, Yes/No) and ``addition``
  (two-digit sums).

`build_tasks(seed)` returns a `Tasks` whose held-out instances never occur in the training text that its
`training_line(rng)` draws from.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
import warnings
from dataclasses import dataclass, field

STDLIB_MODULES = (
    "abc argparse array ast asyncio base64 binascii bisect bz2 calendar cmath code codecs collections "
    "colorsys concurrent.futures configparser contextlib copy csv dataclasses datetime decimal difflib dis "
    "doctest email.message email.utils enum filecmp fileinput fnmatch fractions ftplib functools getopt "
    "gettext glob graphlib gzip hashlib heapq hmac html html.parser http.client http.cookies http.server "
    "imaplib inspect io ipaddress itertools json keyword linecache locale logging lzma mailbox math mimetypes "
    "multiprocessing numbers operator optparse os os.path pathlib pickle pkgutil platform plistlib poplib "
    "pprint pstats queue quopri random re reprlib sched secrets selectors shelve shlex shutil smtplib socket "
    "sqlite3 stat statistics string struct subprocess sysconfig tarfile tempfile textwrap threading time "
    "timeit tokenize trace traceback tracemalloc types typing unicodedata unittest unittest.mock "
    "urllib.parse urllib.request uuid warnings wave weakref wsgiref.util xml.dom.minidom "
    "xml.etree.ElementTree zipfile zlib zoneinfo"
).split()
MAX_DOC_CHARS = 1200
MIN_DOC_CHARS = 40
MAX_CORPUS_CHARS = 2_000_000
TASKS = ("facts", "compare", "copy", "match", "addition")


# ---------------------------------------------------------------- docstrings


def _signature(obj) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    text = re.sub(r"<[^<>]*>", "...", text)  # object reprs carry memory addresses that vary per process
    return text if len(text) <= 100 else "(...)"


def _format_doc(name: str, obj, doc: str, indent: str = "") -> str:
    doc = doc.strip()[:MAX_DOC_CHARS].rsplit("\n", 1)[0] if len(doc) > MAX_DOC_CHARS else doc.strip()
    body = "\n".join((indent + "    " + line).rstrip() for line in doc.splitlines())
    head = f"{indent}class {name}:" if inspect.isclass(obj) else f"{indent}def {name}{_signature(obj)}:"
    return f'{head}\n{indent}    """{body.lstrip()}\n{indent}    """\n'


def _public_members(obj) -> list[tuple[str, object]]:
    try:
        members = inspect.getmembers(obj)
    except Exception:  # noqa: BLE001 - some stdlib objects fail on attribute access
        return []
    return [(n, m) for n, m in sorted(members, key=lambda x: x[0])
            if not n.startswith("_") and (inspect.isroutine(m) or inspect.isclass(m))]


def _new_doc(obj, seen: set[str]) -> str | None:
    """The docstring of `obj` if it is long enough and not seen before (inherited docs repeat)."""
    doc = inspect.getdoc(obj)
    if not doc or len(doc) < MIN_DOC_CHARS or doc in seen:
        return None
    seen.add(doc)
    return doc


def _module_docs(module_name: str, seen: set[str]) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # optional parts of the stdlib may be missing from a build
            return []
    docs = []
    if doc := _new_doc(module, seen):
        docs.append(f'"""{doc.strip()[:MAX_DOC_CHARS]}\n"""\n')
    for name, obj in _public_members(module):
        if getattr(obj, "__module__", module_name) not in (module_name, None) or inspect.ismodule(obj):
            continue
        if doc := _new_doc(obj, seen):
            docs.append(_format_doc(name, obj, doc))
        if inspect.isclass(obj):
            docs.extend(_format_doc(mname, meth, mdoc, indent="    ")
                        for mname, meth in _public_members(obj) if (mdoc := _new_doc(meth, seen)))
    return docs


def stdlib_docstrings(max_chars: int = MAX_CORPUS_CHARS) -> list[str]:
    """Docstring documents from `STDLIB_MODULES`, in a fixed order, at most `max_chars` in all."""
    seen: set[str] = set()
    out, total = [], 0
    for module_name in STDLIB_MODULES:
        for doc in _module_docs(module_name, seen):
            if total + len(doc) > max_chars:
                return out
            out.append(doc)
            total += len(doc)
    return out


# ---------------------------------------------------------------- names and tables

SYLLABLES = ("ka ri mo ve lu sa to nel dra bin qua fen tor ish zal por mek ul gar vin sto bel "
             "cor dun eth fal hom jas kel lor mar nim orv pel ras tev wyn yar zor ani bro").split()


def invented_names(rng: random.Random, n: int, syllables: tuple[int, int], taken: set[str]) -> list[str]:
    """`n` distinct capitalized names of 2-3 syllables, none in `taken` (which is updated)."""
    names = []
    while len(names) < n:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(*syllables))).capitalize()
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


@dataclass(frozen=True)
class Relation:
    """A fixed invented table `entity -> value`, stated and asked in several phrasings."""

    name: str
    facts: tuple[tuple[str, str], ...]
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    held_out: tuple[int, ...]  # per fact, the question template asked only at evaluation time


def _balanced(rng: random.Random, values: list, n: int) -> list:
    """`n` items cycling through `values`, shuffled: each value equally often, in no pattern."""
    out = [values[i % len(values)] for i in range(n)]
    rng.shuffle(out)
    return out


def _relations(rng: random.Random, taken: set[str], per_relation: int) -> list[Relation]:
    countries = invented_names(rng, 8, (2, 2), taken)
    makers = invented_names(rng, 8, (2, 2), taken)
    colors = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
    cities = invented_names(rng, per_relation, (2, 3), taken)
    gadgets = invented_names(rng, per_relation, (2, 3), taken)
    people = invented_names(rng, per_relation, (2, 2), taken)
    held_out = tuple(_balanced(rng, [0, 1, 2, 3], per_relation))

    def table(keys, values):
        return tuple(zip(keys, _balanced(rng, values, len(keys))))

    return [
        Relation("city", table(cities, countries),
                 ("{e} is a city in {v}.", "The city of {e} lies in {v}.", "{v} is home to the city of {e}."),
                 ("Q: In which country is {e}? A:", "Q: Where is the city of {e}? A:",
                  "Q: {e} is a city in which country? A:", "Q: What country is {e} in? A:"), held_out),
        Relation("maker", table(gadgets, makers),
                 ("The {e} is made by {v}.", "{v} makes the {e}.", "The {e} is a product of {v}."),
                 ("Q: Who makes the {e}? A:", "Q: Which company makes the {e}? A:",
                  "Q: The {e} is made by which company? A:", "Q: Who is the maker of the {e}? A:"), held_out),
        Relation("color", table(people, colors),
                 ("{e} likes the color {v}.", "The favorite color of {e} is {v}.", "{e} loves {v} things."),
                 ("Q: What is the favorite color of {e}? A:", "Q: Which color does {e} like? A:",
                  "Q: {e} likes which color? A:", "Q: What color does {e} love? A:"), held_out),
    ]


PRODUCT_TYPES = ("Wireless Headphones", "Coffee Maker", "Gaming Mouse", "Desk Lamp", "Electric Kettle",
                 "Mechanical Keyboard", "Portable Speaker", "Smart Watch", "Air Purifier", "Hair Dryer",
                 "Water Bottle", "Office Chair")
PRODUCT_COLORS = ("Black", "White", "Silver", "Blue", "Red", "Gray")
ABBREVIATIONS = {"Wireless": "Wrls", "Headphones": "Hdphns", "Mechanical": "Mech", "Keyboard": "Kbd",
                 "Portable": "Port", "Speaker": "Spkr", "Electric": "Elec", "Purifier": "Purif",
                 "Office": "Ofc", "Black": "Blk", "White": "Wht", "Silver": "Slvr", "Gray": "Gry"}


@dataclass(frozen=True)
class Product:
    brand: str
    line: str
    code: str
    kind: str
    color: str

    def title(self) -> str:
        return f"{self.brand} {self.line} {self.code} {self.kind} {self.color}"


def _products(rng: random.Random, taken: set[str], n: int) -> list[Product]:
    brands = invented_names(rng, 10, (2, 2), taken)
    lines = invented_names(rng, 60, (2, 2), taken)
    codes: set[str] = set()
    out = []
    while len(out) < n:
        brand = rng.choice(brands)
        code = f"{brand[:2].upper()}-{rng.randint(100, 999)}"
        if code in codes:
            continue
        codes.add(code)
        out.append(Product(brand, rng.choice(lines), code, rng.choice(PRODUCT_TYPES), rng.choice(PRODUCT_COLORS)))
    return out


def perturb(rng: random.Random, product: Product) -> str:
    """Another way a listing may write the same product: abbreviated, words dropped, lowercased."""
    words = product.title().split()
    if rng.random() < 0.5:
        words = [ABBREVIATIONS.get(w, w) for w in words]
    droppable = [i for i, w in enumerate(words) if i >= 3 or i == 1]  # never the brand or the code
    for i in sorted(rng.sample(droppable, rng.randint(0, 2)), reverse=True):
        del words[i]
    text = " ".join(words)
    return text.lower() if rng.random() < 0.3 else text


def match_example(rng: random.Random, products: list[Product]) -> tuple[str, str]:
    """One balanced Yes/No pair; most No pairs share the brand, so only line and code tell them apart."""
    a = rng.choice(products)
    same = rng.random() < 0.5
    if same:
        b = a
    else:
        pool = [p for p in products if p.brand == a.brand and p != a] if rng.random() < 0.7 else []
        b = rng.choice(pool or [p for p in products if p != a])
    b_text = perturb(rng, b) if rng.random() < 0.85 else b.title()
    return f"Product A: {a.title()}. Product B: {b_text}. Same?", "Yes" if same else "No"


def compare_example(rng: random.Random, a: int, b: int) -> tuple[str, str]:
    if rng.random() < 0.5:
        return f"Q: Which is larger, {a} or {b}? A:", str(max(a, b))
    return f"Q: Which is smaller, {a} or {b}? A:", str(min(a, b))


def addition_example(a: int, b: int) -> tuple[str, str]:
    return f"Q: What is {a} plus {b}? A:", str(a + b)


def copy_example(text: str) -> tuple[str, str]:
    return f"Repeat: {text} ->", text


def random_words(rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 4)))
                    for _ in range(rng.randint(2, 3)))


def _number_pairs(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """`n` distinct unordered pairs of distinct two-digit numbers, in random order."""
    pairs: set[frozenset[int]] = set()
    out = []
    while len(out) < n:
        a, b = rng.sample(range(10, 100), 2)
        if frozenset((a, b)) not in pairs:
            pairs.add(frozenset((a, b)))
            out.append((a, b))
    return out


def _instance(task: str, index: int, split: str, example: tuple[str, str]) -> dict:
    return {"id": f"{task}-{split}-{index:04d}", "input": example[0], "references": [example[1]], "split": split}


@dataclass
class Tasks:
    """The synthetic tasks: fixed tables, held-out instances, and what training must never show."""

    relations: list[Relation]
    train_products: list[Product]
    held_out: dict[str, list[dict]]
    excluded_pairs: set[frozenset[int]] = field(default_factory=set)
    excluded_copies: set[str] = field(default_factory=set)

    def _free_pair(self, rng: random.Random) -> tuple[int, int]:
        while True:
            a, b = rng.sample(range(10, 100), 2)
            if frozenset((a, b)) not in self.excluded_pairs:
                return a, b

    def _free_words(self, rng: random.Random) -> str:
        while (text := random_words(rng)) in self.excluded_copies:
            pass
        return text

    def _fact_question(self, rng: random.Random) -> tuple[str, str]:
        rel = rng.choice(self.relations)
        i = rng.randrange(len(rel.facts))
        q = rng.choice([t for k, t in enumerate(rel.questions) if k != rel.held_out[i]])
        entity, value = rel.facts[i]
        return q.format(e=entity), value

    def example(self, rng: random.Random, task: str) -> tuple[str, str]:
        """A training (input, answer) for `task`, never one of the held-out instances."""
        if task == "facts":
            return self._fact_question(rng)
        if task == "compare":
            return compare_example(rng, *self._free_pair(rng))
        if task == "addition":
            return addition_example(*self._free_pair(rng))
        if task == "copy":
            return copy_example(self._free_words(rng))
        return match_example(rng, self.train_products)

    def training_line(self, rng: random.Random) -> str:
        """One line of training text, ending with a newline; facts are also stated, not only asked."""
        task = rng.choices(TASKS, weights=(0.3, 0.15, 0.15, 0.2, 0.2))[0]
        if task == "facts" and rng.random() < 0.4:
            rel = rng.choice(self.relations)
            entity, value = rng.choice(rel.facts)
            return rng.choice(rel.statements).format(e=entity, v=value) + "\n"
        prompt, answer = self.example(rng, task)
        return f"{prompt} {answer}\n"


def _held_out_facts(relations: list[Relation]) -> list[dict]:
    out = []
    for rel in relations:
        for i, (entity, value) in enumerate(rel.facts):
            prompt = rel.questions[rel.held_out[i]].format(e=entity)
            out.append(_instance("facts", len(out), "test", (prompt, value)))
    return out


def _held_out_match(rng: random.Random, products: list[Product], n: int) -> list[dict]:
    seen: set[str] = set()
    out = []
    while len(out) < n:
        example = match_example(rng, products)
        if example[0] not in seen and (example[1] == "Yes") == (len(out) % 2 == 0):
            seen.add(example[0])
            out.append(_instance("match", len(out), "test", example))
    return out


def build_tasks(seed: int, n_held_out: int = 100, facts_per_relation: int = 48) -> Tasks:
    """Tables and held-out instances for all tasks, fixed by `seed`."""
    rng = random.Random(seed)
    taken: set[str] = set()
    relations = _relations(rng, taken, facts_per_relation)
    products = _products(rng, taken, 300)
    n_test_products = len(products) // 5
    compare_pairs = _number_pairs(rng, 2 * n_held_out)
    compare, addition = compare_pairs[:n_held_out], compare_pairs[n_held_out:]
    copies: list[str] = []
    while len(copies) < n_held_out:
        if (text := random_words(rng)) not in copies:
            copies.append(text)
    held_out = {
        "facts": _held_out_facts(relations),
        "compare": [_instance("compare", i, "test", compare_example(rng, a, b)) for i, (a, b) in enumerate(compare)],
        "copy": [_instance("copy", i, "test", copy_example(t)) for i, t in enumerate(copies)],
        "match": _held_out_match(rng, products[:n_test_products], n_held_out + n_held_out // 5),
        "addition": [_instance("addition", i, "test", addition_example(a, b)) for i, (a, b) in enumerate(addition)],
    }
    return Tasks(relations, products[n_test_products:], held_out,
                 {frozenset(p) for p in compare_pairs}, set(copies))


def few_shot(tasks: Tasks, seed: int, per_task: int = 5) -> list[dict]:
    """A few training instances per task, for few-shot prompts (never held-out ones)."""
    rng = random.Random(seed + 1)
    return [_instance(task, i, "train", tasks.example(rng, task))
            for task in TASKS for i in range(per_task)]
