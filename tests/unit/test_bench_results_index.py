"""bench-results/README.md lists every result file, and every file it lists exists."""

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench-results"
LISTED = re.compile(r"^\| `([^`]+\.json)` \|", re.MULTILINE)


def listed_files(index: str) -> list[str]:
    return LISTED.findall(index)


def json_files(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*.json")}


def test_index_lists_every_json_file_and_nothing_else() -> None:
    listed = listed_files((RESULTS / "README.md").read_text(encoding="utf-8"))
    assert len(listed) == len(set(listed)), "a file is listed twice"
    on_disk = json_files(RESULTS)
    assert sorted(on_disk - set(listed)) == [], "JSON files missing from bench-results/README.md"
    assert sorted(set(listed) - on_disk) == [], "bench-results/README.md lists files that do not exist"


def test_every_result_lies_in_a_machine_folder() -> None:
    assert [name for name in json_files(RESULTS) if "/" not in name] == []


def test_the_index_parser_sees_rows_and_only_rows(tmp_path: Path) -> None:
    index = "| file | command |\n|---|---|\n| `gpu-h100/a.json` | `x` |\ntext `b.json` |\n"
    assert listed_files(index) == ["gpu-h100/a.json"]
    (tmp_path / "gpu-h100").mkdir()
    (tmp_path / "gpu-h100" / "a.json").write_text("{}")
    (tmp_path / "c.json").write_text("{}")
    assert json_files(tmp_path) == {"gpu-h100/a.json", "c.json"}
