"""Knowledge-base schema and lint: the shipped base is clean; each broken fixture fails at its line with its fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xeforge.errors import KnowledgeBaseError
from xeforge.kb import load_kb, lint_paths
from xeforge.kb.loader import DEFAULT_ROOT, discover, display_path
from xeforge.kb.yamlio import LineDict, LineList, YamlSyntaxError, line_of, parse_yaml

BROKEN = Path(__file__).parent / "fixtures" / "kb" / "broken"
BROKEN_FILES = sorted(BROKEN.glob("*.yaml"))


def _expectations(path: Path) -> tuple[int, str, str]:
    head = dict(re.findall(r"^# expect-(line|what|fix): (.*)$", path.read_text(), flags=re.M))
    return int(head["line"]), head["what"], head["fix"]


def test_shipped_base_lints_clean() -> None:
    errors = lint_paths([DEFAULT_ROOT])
    assert errors == [], "\n".join(e.render() for e in errors)


def test_default_lint_is_the_shipped_base() -> None:
    assert lint_paths() == []
    assert lint_paths(None) == []


def test_shipped_base_has_every_kind() -> None:
    kb = load_kb()
    assert set(kb.devices) == {
        "arc-b580", "arc-b570", "arc-pro-b70", "max-1550", "arc-a770", "h100", "h200", "cpu-interpreter"
    }
    assert len(kb.constraints) >= 20
    assert len(kb.patterns) >= 30
    assert len(kb.space_entries) >= 16
    names = {p.parent.name for p in discover(DEFAULT_ROOT)}
    assert {"devices", "constraints", "patterns", "spaces"} <= names


def test_every_fact_and_entry_cites_a_known_source_with_confidence() -> None:
    kb = load_kb()
    for device in kb.devices.values():
        for name, fact in device.facts().items():
            assert fact.sources, (device.id, name)
            assert all(s in kb.sources for s in fact.sources), (device.id, name)
            assert fact.confidence in ("verified", "derived", "unverified")
    for entry in [*kb.constraints, *kb.patterns, *kb.space_entries]:
        src = entry.spec.source
        for sid in [src] if isinstance(src, str) else src:
            assert sid in kb.sources, (entry.id, sid)


def test_there_is_a_broken_fixture_for_each_required_failure() -> None:
    required = {
        "unknown_key", "wrong_type", "unknown_device", "unknown_stage", "duplicate_id", "bad_version_range", "bad_yaml",
    }
    assert required <= {p.stem for p in BROKEN_FILES}


@pytest.mark.parametrize("path", BROKEN_FILES, ids=lambda p: p.stem)
def test_broken_fixture_fails_at_its_line_with_its_fix(path: Path) -> None:
    line, what, fix = _expectations(path)
    errors = lint_paths([path])
    assert errors, f"{path.name} linted clean"
    shown = "\n".join(e.render() for e in errors)
    ours = [e for e in errors if e.where.startswith(f"{display_path(path)}:")]
    assert ours == errors, f"errors outside the fixture:\n{shown}"  # the shipped context stays clean
    at_line = [e for e in ours if re.match(rf".*:{line}(\s|$)", e.where)]
    assert at_line, f"no error at line {line}:\n{shown}"
    err = at_line[0]
    assert what in err.what, shown
    assert fix in err.fix, shown
    assert isinstance(err, KnowledgeBaseError)


def test_lint_reports_every_error_of_several_files() -> None:
    paths = [BROKEN / "unknown_key.yaml", BROKEN / "unknown_device.yaml", BROKEN / "bad_yaml.yaml"]
    errors = lint_paths(paths)
    files = {e.where.split(":")[0] for e in errors}
    assert files == {display_path(p) for p in paths}


def test_lint_of_a_missing_path_is_an_error(tmp_path: Path) -> None:
    errors = lint_paths([tmp_path / "nope.yaml"])
    assert len(errors) == 1 and "no such file" in errors[0].what


def test_a_standalone_kb_root_is_linted_on_its_own(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "devices").mkdir(parents=True)
    (root / "sources.yaml").write_text("sources:\n  s1: {title: A source}\n")
    (root / "devices" / "x.yaml").write_text(
        "device:\n  id: x\n  name: X\n  vendor: none\n  backend: cpu\n  facts:\n"
        "    has_fp64: {value: true, source: s1, confidence: verified}\n"
    )
    assert lint_paths([root]) == []
    kb = load_kb(root)
    assert list(kb.devices) == ["x"] and kb.constraints == []


def test_a_yaml_file_outside_the_kb_folders_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "constraint").mkdir(parents=True)  # typo: constraint/ instead of constraints/
    (root / "sources.yaml").write_text("sources:\n  s1: {title: A source}\n")
    (root / "constraint" / "c.yaml").write_text("constraints: []\n")
    errors = lint_paths([root])
    assert len(errors) == 1 and "not loaded" in errors[0].what and "constraints/" in errors[0].fix
    with pytest.raises(KnowledgeBaseError):
        load_kb(root)


def test_load_kb_raises_the_first_error_with_a_count(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "patterns").mkdir(parents=True)
    (root / "sources.yaml").write_text("sources:\n  s1: {title: A source}\n")
    (root / "patterns" / "p.yaml").write_text(
        "patterns:\n  - id: p1\n    stage: nowhere\n    title: t\n    when: w\n    effect: e\n    source: s9\n"
        "    confidence: verified\n"
    )
    (root / "patterns" / "q.yaml").write_text("patterns:\n  - id: q1\n    colour: red\n")
    with pytest.raises(KnowledgeBaseError) as info:
        load_kb(root)
    assert info.value.where.endswith("p.yaml:3 patterns[0].stage")
    assert "and 1 more" in info.value.what and "xeforge kb lint" in info.value.what
    assert "unknown stage 'nowhere'" in info.value.what


def test_load_kb_is_cached_until_a_file_changes(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "devices").mkdir(parents=True)
    src = root / "sources.yaml"
    src.write_text("sources:\n  s1: {title: A source}\n")
    assert load_kb(root) is load_kb(root)
    first = load_kb(root)
    src.write_text("sources:\n  s1: {title: A source}\n  s2: {title: Another}\n")
    import os

    os.utime(src, (os.stat(src).st_atime, os.stat(src).st_mtime + 5))
    assert load_kb(root) is not first and "s2" in load_kb(root).sources


def test_missing_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KnowledgeBaseError):
        load_kb(tmp_path / "absent")


# -- the line-numbering YAML loader ------------------------------------------------------------------
def test_yaml_loader_records_lines_of_keys_and_items() -> None:
    data = parse_yaml("a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n")
    assert isinstance(data, LineDict) and data.line == 1
    assert data["a"].key_lines == {"b": 2, "c": 3}
    seq = data["a"]["c"]
    assert isinstance(seq, LineList) and seq.item_lines == [4, 5]
    assert line_of(data, ("a", "c", 1, "d")) == 5
    assert line_of(data, ("a", "c", "tag-that-is-not-data", 0)) == 4  # pydantic union tags are skipped


def test_yaml_loader_rejects_duplicate_keys_and_reports_syntax_lines() -> None:
    with pytest.raises(YamlSyntaxError) as info:
        parse_yaml("a: 1\nb: 2\na: 3\n")
    assert info.value.line == 3 and "written twice" in info.value.what
    with pytest.raises(YamlSyntaxError) as info:
        parse_yaml("a:\n  - [1, 2\n  - 3\n")
    assert info.value.line >= 2


def test_grf_mode_values_must_be_quoted_strings() -> None:
    # '256' unquoted is an int in YAML; the schema refuses it instead of comparing 256 with '256' later
    errors = lint_paths([BROKEN / "wrong_type_grf_int.yaml"])
    assert errors and "quote the value" in errors[0].fix
