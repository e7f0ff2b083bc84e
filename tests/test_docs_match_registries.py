"""README.md and docs/ list exactly what the registries hold, link only to files and headings that exist,
name only modules and files that exist, and stay short.

Each kind of name has fixed places in the pages, read here as text: the first column of a table with a
given header row (its names in backticks), the families' and methods' rows of docs/design.md's registry
table, and README's family sentence. A name the registry has and a page lacks, or one a page lists that
the registry lacks, fails naming the page and the names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from glmc.datasets import dataset_names
from glmc.models.families.registry import family_names
from glmc.settings.methods import METHODS, MULTI_METHODS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORDS = 19_000  # outside the registry lists (registry_lists), which grow with the registries
MAX_ENTRY_WORDS = 80  # each entry of those lists

REGISTRIES = {
    "families": family_names,
    "methods": lambda: list(METHODS),
    "multi-model methods": lambda: list(MULTI_METHODS),
    "datasets": dataset_names,
    "experiments": lambda: [p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")],
}

# (page, the header row's first cells, kind): the table's first column lists that kind
TABLES = [
    ("README.md", "| method | paper |", "methods"),
    ("docs/methods.md", "| method | what it interpolates |", "methods"),
    ("docs/architectures.md", "| family | Hugging Face classes", "families"),
    ("docs/architectures.md", "| family | group (space: classes) |", "families"),
    ("docs/adding-a-dataset.md", "| `data=` | kind |", "datasets"),
    ("docs/experiments.md", "| experiment | what it runs |", "experiments"),
]
DESIGN_TABLE = "| kind | registry | members |"


def prose(path: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def table_lines(text: str, header: str, where: str) -> list[str]:
    """The body lines of the table whose header row starts with `header`."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert len(starts) == 1, f"{where}: expected one table headed {header!r}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def table_rows(text: str, header: str, where: str) -> list[list[str]]:
    """The body rows (their cells) of the table whose header row starts with `header`."""
    return [cells(line) for line in table_lines(text, header, where)]


def names(cell: str) -> set[str]:
    """The names in backticks (settings such as `pairing=universe` beside them are not names)."""
    return set(re.findall(r"`(\w+)`", cell))


def assert_same(listed: set[str], kind: str, where: str) -> None:
    known = set(REGISTRIES[kind]())
    assert listed == known, (
        f"{where} lists {kind} that do not exist: {sorted(listed - known)}; "
        f"and lacks these of the registry: {sorted(known - listed)}"
    )


@pytest.mark.parametrize("page,header,kind", TABLES, ids=[f"{p}:{k}" for p, _, k in TABLES])
def test_each_table_lists_its_registry(page, header, kind):
    rows = table_rows(prose(ROOT / page), header, page)
    assert_same(set().union(*(names(row[0]) for row in rows)), kind, f"{page}, table {header!r}")


def test_design_lists_the_families_and_methods():
    rows = table_rows(prose(ROOT / "docs" / "design.md"), DESIGN_TABLE, "docs/design.md")
    listed = {row[0]: names(row[2]) for row in rows}
    for kind in ("families", "methods", "multi-model methods"):
        assert kind in listed, f"docs/design.md's registry table has no row {kind!r}"
        assert_same(listed[kind], kind, f"docs/design.md's registry row {kind!r}")


FAMILY_SENTENCE = r"The family \(one of ([^)]*)\)"


def test_readme_names_every_family():
    found = re.findall(FAMILY_SENTENCE, prose(ROOT / "README.md"))
    assert len(found) == 1, "README.md: expected one sentence 'The family (one of `vit`, ...)'"
    assert_same(names(found[0]), "families", "README.md's family sentence")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", prose(path), flags=re.M)}


def test_every_relative_link_reaches_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to no file or heading: " + "; ".join(broken)


def defines(dotted: str) -> bool:
    """Whether `dotted` (glmc.x.y[.name]) is a module of src/glmc, or a name its longest module prefix
    mentions."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:end])
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file():
                return end == len(parts) or re.search(rf"\b{parts[end]}\b", source.read_text()) is not None
    return False


def test_every_module_and_file_the_pages_name_exists():
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        missing += [f"{page.name}: {n}" for n in sorted(set(re.findall(r"`(glmc(?:\.\w+)+)", text))) if not defines(n)]
        files = set(re.findall(r"\b((?:src|tests|conf|benchmarks|experiments)/[\w/.-]+\.(?:py|yaml|json))", text))
        missing += [f"{page.name}: {f}" for f in sorted(files) if not (ROOT / f).exists()]
    assert not missing, "the pages name modules or files that do not exist (update the page): " + "; ".join(missing)


def registry_lists(page: str, text: str) -> list[str]:
    """The page's lists that the tests above check against a registry: its registry tables' rows, design.md's
    registry rows, README's family sentence. One entry each per family, method, dataset or experiment."""
    found = [line for p, header, _ in TABLES if p == page for line in table_lines(text, header, page)]
    if page == "docs/design.md":
        rows = table_lines(text, DESIGN_TABLE, page)
        found += [line for line in rows if cells(line)[0] in ("families", "methods", "multi-model methods")]
    if page == "README.md":  # the names only: the sentence's link and colon still count
        found += [" ".join(re.findall(r"`\w+`,?", sentence)) for sentence in re.findall(FAMILY_SENTENCE, text)]
    return found


def counted_words(page: str, text: str) -> int:
    """The page's words outside its registry lists: a new registry entry adds none (it only extends lists)."""
    return len(text.split()) - sum(len(item.split()) for item in registry_lists(page, text))


def test_readme_and_docs_stay_short():
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in PAGES}
    words = {page: counted_words(page, text) for page, text in texts.items()}
    total = sum(words.values())
    assert total <= MAX_WORDS, (
        f"README.md and docs/ hold {total} words outside their registry lists, over {MAX_WORDS}: {words}; "
        "link, don't repeat"
    )
    # an uncounted entry stays an entry: a row or sentence grown into prose belongs in the counted text
    long = [
        f"{page}: {len(item.split())} words in {item[:50]!r}..."
        for page, text in texts.items()
        for item in registry_lists(page, text)
        if len(item.split()) > MAX_ENTRY_WORDS
    ]
    assert not long, f"registry list entries over {MAX_ENTRY_WORDS} words (move the prose out): " + "; ".join(long)
