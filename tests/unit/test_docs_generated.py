"""The pages rendered from code and data are current: docs/settings.md from `Settings`, the performance page's
plots from bench-results/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings

from scripts.tools import modules_doc, settings_doc

ROOT = Path(__file__).resolve().parents[2]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def test_settings_page_is_current() -> None:
    page = settings_doc.PAGE.read_text(encoding="utf-8")
    assert settings_doc.updated(page) == page, f"docs/settings.md is stale: run `{settings_doc.COMMAND}`"


def test_every_field_has_a_row_under_a_heading() -> None:
    generated = settings_doc.render()
    for name in settings_doc.Settings.model_fields:
        assert generated.count(f"| `KOKORO_{name.upper()}` |") == 1, name


def test_a_field_before_any_heading_is_refused() -> None:
    source = "class S:\n    early: int = 1\n    # --- Group ---\n    late: int = 2\n"
    with pytest.raises(ValueError, match="early"):
        settings_doc.field_groups(source, {"early", "late"})
    assert settings_doc.field_groups(source[source.index("    #") :], {"late"}) == [("Group", ["late"])]


class Sample(BaseSettings):
    mode: Literal["auto", "on"] = Field("auto", description="A mode | see docs/api.md#books.")
    limit: int | None = Field(None, ge=1, le=64, description="Calls; docs/journal/gpu.md, entry 27.")
    rate: float = Field(30.0, gt=0, description="In `docs/not-a-link.md`.")
    switch: Literal["auto"] | bool = Field("auto", description="")
    home: Path = Field(Path.home() / ".cache" / "x", description="")


@pytest.mark.parametrize(
    ("name", "kind", "default"),
    [
        ("mode", "`auto` \\| `on`", "`auto`"),
        ("limit", "int or `none`, 1-64", "unset"),
        ("rate", "number, above 0", "`30`"),
        ("switch", "`auto` or bool", "`auto`"),
        ("home", "path", "`~/.cache/x`"),
    ],
)
def test_type_and_default_are_rendered(name: str, kind: str, default: str) -> None:
    info = Sample.model_fields[name]
    text = settings_doc.type_text(info.annotation)
    if bounds := settings_doc.bounds_text(info.metadata):
        text = f"{text}, {bounds}"
    assert (text, settings_doc.default_text(info.default)) == (kind, default)


def test_descriptions_link_the_docs_they_name() -> None:
    cell = settings_doc.description_text
    assert cell(Sample.model_fields["mode"].description or "") == "A mode \\| see [api.md](api.md#books)."
    assert (
        cell("Calls; docs/journal/gpu.md, entry 27.") == "Calls; [journal/gpu.md](journal/gpu.md), entry 27."
    )
    assert cell("In `docs/not-a-link.md`.") == "In `docs/not-a-link.md`."


def test_check_names_the_command_when_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "settings.md"
    page.write_text(f"# Settings\n\n{settings_doc.BEGIN}\n| old row |\n{settings_doc.END}\n\nprose\n")
    assert settings_doc.main(["--check", "--page", str(page)]) == 1
    assert settings_doc.COMMAND in capsys.readouterr().out
    assert settings_doc.main(["--page", str(page)]) == 0
    assert settings_doc.main(["--check", "--page", str(page)]) == 0
    assert page.read_text().endswith(f"{settings_doc.END}\n\nprose\n")
    assert "| old row |" not in page.read_text()


def test_the_plots_render_from_bench_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the `bench` extra
    from scripts.bench import plot_performance

    argv = ["--results", str(ROOT / "bench-results"), "--out-dir", str(tmp_path)]
    assert plot_performance.main(argv) == 0
    for name, _, _ in plot_performance.figures(plot_performance.build_parser().parse_args(argv)):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG"), name


def test_every_image_the_performance_page_shows_exists() -> None:
    page = ROOT / "docs" / "performance.md"
    images = IMAGE.findall(page.read_text(encoding="utf-8"))
    assert {"img/cpu_throughput.png", "img/first_audio.png", "img/gpu_throughput.png"} <= set(images)
    for image in images:
        assert (page.parent / image).is_file(), image


def test_architecture_page_names_every_module() -> None:
    page = modules_doc.PAGE.read_text(encoding="utf-8")
    assert modules_doc.updated(page) == page, f"docs/architecture.md is stale: run `{modules_doc.COMMAND}`"
    for path in modules_doc.module_files():
        assert page.count(f"| `{path.relative_to(ROOT).as_posix()}` |") == 1, path


def test_every_layer_of_the_contract_has_its_modules(tmp_path: Path) -> None:
    names = [name for layer in modules_doc.layers() for name in layer]
    tops = {
        path.relative_to(modules_doc.PACKAGE).parts[0].removesuffix(".py")
        for path in modules_doc.module_files()
    }
    # Every top-level module or package but the package's own __init__ sits in a layer, so none is unchecked.
    assert tops - {"__init__"} == set(names)
    (tmp_path / "undocumented.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no docstring"):
        modules_doc.summary(tmp_path / "undocumented.py")


def test_a_long_docstring_is_cut_after_whole_sentences(tmp_path: Path) -> None:
    module = tmp_path / "long.py"
    module.write_text('"""' + "A sentence that says something. " * 20 + '"""\n')
    text = modules_doc.summary(module)
    assert len(text) <= modules_doc.MAX_SUMMARY + 2
    assert text.endswith("something. …")
