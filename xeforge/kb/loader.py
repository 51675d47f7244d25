"""Loading and linting the knowledge base: YAML files -> validated entries -> :class:`KnowledgeBase`.

Owns, in order:
  1. discovery — ``sources.yaml`` and ``devices/``, ``constraints/``, ``patterns/``, ``spaces/`` (``*.yaml``);
  2. parsing — YAML with line numbers (:mod:`xeforge.kb.yamlio`); bad YAML is an error at its line;
  3. schema — each file's single top-level key names its kind; pydantic errors become
     :class:`~xeforge.errors.KnowledgeBaseError` s at ``path:line key`` with a fix;
  4. cross-references — unknown device / source / fact ids, template placeholders a check does not fill,
     duplicate ids across the whole base, spaces that overlap for one device and family;
  5. :func:`load_kb` (cached per root; raises the first error) and :func:`lint_paths` (every error).
"""

from __future__ import annotations

import difflib
import os
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version
from pydantic import ValidationError

from xeforge.errors import KnowledgeBaseError
from xeforge.kb.checks import CHECKS, COMMON_PLACEHOLDERS
from xeforge.kb.entries import Constraint, Diagnosis, Pattern, Recognizer, SpaceEntry
from xeforge.kb.facts import FACT_NAMES, DeviceEntry
from xeforge.kb.knowledge import KnowledgeBase
from xeforge.kb.schema import FILE_KINDS, METADATA_FACTS, SourceSpec, sources_of
from xeforge.kb.versions import TritonInfo, version_applies
from xeforge.kb.yamlio import LineDict, LineList, YamlSyntaxError, load_yaml

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "knowledge_base"
KIND_FOLDERS = ("devices", "constraints", "patterns", "spaces", "recognizers", "diagnoses")
README_HINT = "see knowledge_base/README.md"


def default_root() -> Path:
    env = os.environ.get("XEFORGE_KB")
    return Path(env) if env else DEFAULT_ROOT


def display_path(path: Path) -> str:
    try:
        rel = os.path.relpath(path, Path.cwd())
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def is_kb_root(path: Path) -> bool:
    return path.is_dir() and (
        (path / "sources.yaml").is_file() or any((path / f).is_dir() for f in KIND_FOLDERS)
    )


def discover(root: Path) -> list[Path]:
    """The YAML files of a knowledge-base root, in load order."""
    files = []
    if (root / "sources.yaml").is_file():
        files.append(root / "sources.yaml")
    for folder in KIND_FOLDERS:
        if (root / folder).is_dir():
            files += sorted(p for p in (root / folder).rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    return files


def stray_files(root: Path) -> list[KnowledgeBaseError]:
    """YAML files under ``root`` that :func:`discover` would not load (a typo in a folder name, ...)."""
    loaded = {p.resolve() for p in discover(root)}
    out = []
    for path in sorted(root.rglob("*")):
        if path.suffix in (".yaml", ".yml") and path.is_file() and path.resolve() not in loaded:
            out.append(_err(display_path(path), 1, "", "this file is not loaded: it is not in a knowledge-base folder",
                            f"move it into one of {', '.join(f + '/' for f in KIND_FOLDERS)} (or sources.yaml)"))
    return out


# -- one file ----------------------------------------------------------------------------------------
@dataclass
class LoadedFile:
    path: Path
    display: str
    kind: str
    data: Any
    model: Any


def _err(display: str, line: int, key: str, what: str, fix: str) -> KnowledgeBaseError:
    where = f"{display}:{line}" + (f" {key}" if key else "")
    return KnowledgeBaseError(where, what, fix)


def _keypath(parts: list[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _walk(data: Any, loc: tuple[Any, ...]) -> tuple[list[Any], int, Any]:
    """Follow ``loc`` through the data, skipping pydantic's union tags: (path, line, node)."""
    parts: list[Any] = []
    node = data
    line = getattr(data, "line", 1) or 1
    for part in loc:
        if isinstance(node, LineDict) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
            parts.append(part)
        elif isinstance(node, LineList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
            parts.append(part)
    return parts, line, node


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
_PRIORITY = ("unknown_key", "missing", "version_range", "literal_error", "union_tag_invalid", "union_tag_not_found",
             "string_pattern_mismatch", "too_short", "value_error")


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_fix(expected: list[str], value: Any) -> str:
    if "a string" in expected and isinstance(value, (int, float, bool)):
        reads = "true/false" if isinstance(value, bool) else "a number"
        return f"quote the value, e.g. '{value}' (YAML reads {value} as {reads})"
    if expected == ["a whole number"]:
        return "write a whole number without quotes"
    if expected == ["a number"]:
        return "write a number without quotes"
    if "a list" in expected and len(expected) == 1:
        return "write a YAML list, e.g. [16, 32], or one '- item' per line"
    if expected == ["true or false"]:
        return "write true or false (without quotes)"
    if "a mapping" in expected:
        return "write a mapping of 'key: value' lines"
    return "write " + " or ".join(expected)


def _field_word(parts: list[Any], loc: tuple[Any, ...]) -> str:
    names = [p for p in parts if isinstance(p, str)]
    name = names[-1] if names else "value"
    if parts and isinstance(parts[-1], int) and name.endswith("s"):
        name = name[:-1]
    return name


def _schema_errors(display: str, data: Any, exc: ValidationError) -> list[KnowledgeBaseError]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    info: dict[tuple[Any, ...], tuple[list[Any], int, Any]] = {}
    for e in exc.errors():
        parts, line, node = _walk(data, tuple(e["loc"]))
        etype = e["type"]
        if etype == "unknown_key":
            key = e["ctx"]["key"]
            if isinstance(node, LineDict):
                line = node.key_lines.get(key, line)
            parts = parts + [key]
        elif etype == "missing":
            missing = e["loc"][-1]
            parts = parts + [missing]
        gkey = tuple(parts)
        groups.setdefault(gkey, []).append(e)
        info.setdefault(gkey, (parts, line, node))
    out = []
    for gkey, errs in groups.items():
        parts, line, node = info[gkey]
        errs.sort(key=lambda e: _PRIORITY.index(e["type"]) if e["type"] in _PRIORITY else len(_PRIORITY))
        e = errs[0]
        etype, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
        key = _keypath(parts)
        if etype == "unknown_key":
            hint = f"did you mean {ctx['suggest']!r}? " if ctx.get("suggest") else ""
            what = f"unknown key {ctx['key']!r}"
            fix = f"{hint}remove it, or use one of the allowed keys: {ctx['allowed']}"
        elif etype == "missing":
            what = f"missing required key {parts[-1]!r}"
            fix = f"add '{parts[-1]}: ...' ({README_HINT} for the schema)"
        elif etype == "version_range":
            what = ctx.get("problem", "bad version range")
            fix = "write a PEP 440 range such as '>=3.6' or '>=3.6,<3.9' (quoted), or 'none' for no version"
        elif etype == "literal_error":
            what = f"unknown {_field_word(parts, e['loc'])} {_short(value)}"
            fix = f"use one of: {ctx.get('expected', '')}"
        elif etype == "union_tag_invalid":
            what = f"unknown check kind {ctx.get('tag')!r}"
            fix = f"use one of the check kinds: {ctx.get('expected_tags', '')} (see xeforge/kb/checks.py)"
        elif etype == "union_tag_not_found":
            what = "the check does not say which kind it is"
            fix = f"add 'kind: <one of {', '.join(CHECKS)}>'"
        elif etype == "string_pattern_mismatch":
            what = f"{_field_word(parts, e['loc'])} {_short(value)} is not a valid id"
            fix = "ids use lowercase letters, digits, '.', '_' and '-', starting with a letter or digit"
        elif etype == "too_short":
            what = "must not be empty"
            fix = "give at least one item"
        elif etype in ("value_error", "assertion_error"):
            what = e["msg"].removeprefix("Value error, ")
            fix = f"correct the value ({README_HINT})"
        elif etype in _TYPE_WORDS:
            expected = []
            for other in errs:
                word = _TYPE_WORDS.get(other["type"])
                if word and word not in expected:
                    expected.append(word)
            what = f"should be {' or '.join(expected)}, not {_short(value)}"
            fix = _type_fix(expected, value)
        else:  # a model validator's own error; it may carry its fix in its context
            what = e["msg"]
            fix = ctx.get("fix", README_HINT)
        out.append(_err(display, line, key, what, fix))
    return out


_FILE_CACHE: dict[tuple[str, str, int, int], tuple[LoadedFile | None, list[KnowledgeBaseError]]] = {}


def load_file(path: Path) -> tuple[LoadedFile | None, list[KnowledgeBaseError]]:
    """Parse and schema-check one file (no cross-references); cached until the file changes."""
    try:
        st = path.stat()
        key = (str(path.resolve()), os.getcwd(), st.st_mtime_ns, st.st_size)
    except OSError:
        return _load_file(path)
    if key not in _FILE_CACHE:
        _FILE_CACHE[key] = _load_file(path)
    return _FILE_CACHE[key]


def _load_file(path: Path) -> tuple[LoadedFile | None, list[KnowledgeBaseError]]:
    display = display_path(path)
    try:
        data = load_yaml(path)
    except YamlSyntaxError as exc:
        return None, [_err(display, exc.line, "", exc.what, exc.fix)]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [_err(display, 1, "", f"cannot read the file ({exc})", "check the path and that it is UTF-8")]
    kinds = ", ".join(f"{k}:" for k in FILE_KINDS)
    if not isinstance(data, LineDict) or len(data) != 1 or next(iter(data)) not in FILE_KINDS:
        got = list(data) if isinstance(data, dict) else type(data).__name__
        line = getattr(data, "line", 1) or 1
        if isinstance(data, LineDict) and data:
            bad = next((k for k in data if k not in FILE_KINDS), None)
            line = data.key_lines.get(bad, line) if bad is not None else data.key_lines[list(data)[1]]
        return None, [
            _err(display, line, "", f"expected exactly one top-level key ({kinds}), found {got}",
                 "start the file with the key that names its kind, e.g. 'constraints:' followed by a list")
        ]
    kind = next(iter(data))
    model_cls, folder = FILE_KINDS[kind]
    parent = path.parent.name
    if folder and parent in KIND_FOLDERS and parent != folder:
        return None, [
            _err(display, data.key_lines[kind], kind, f"a '{kind}:' file is in {parent}/",
                 f"move it to knowledge_base/{folder}/")
        ]
    try:
        model = model_cls.model_validate(data)
    except ValidationError as exc:
        return None, _schema_errors(display, data, exc)
    return LoadedFile(path, display, kind, data, model), []


# -- the whole base ----------------------------------------------------------------------------------
def _items(f: LoadedFile) -> list[tuple[Any, LineDict, list[Any]]]:
    """(spec, its YAML mapping, its location) for each entry of a file."""
    if f.kind == "device":
        return [(f.model.device, f.data["device"], ["device"])]
    if f.kind in ("constraints", "patterns", "spaces", "recognizers", "diagnoses"):
        specs = getattr(f.model, f.kind)
        return [(spec, f.data[f.kind][i], [f.kind, i]) for i, spec in enumerate(specs)]
    return []


def _line(node: Any, key: Any = None) -> int:
    if key is not None and isinstance(node, LineDict) and key in node:
        return node.key_lines[key]
    return getattr(node, "line", 1) or 1


def _item_line(node: Any, key: str, index: int) -> int:
    seq = node.get(key) if isinstance(node, LineDict) else None
    if isinstance(seq, LineList) and index < len(seq.item_lines):
        return seq.item_lines[index]
    return _line(node, key)


#: versions probed when looking for overlapping spaces
_PROBES = [TritonInfo(Version(f"3.{minor}.0"), xpu, f"3.{minor}.0") for minor in range(0, 13) for xpu in (False, True)]


def build(files: list[LoadedFile], root: Path | None = None) -> tuple[KnowledgeBase, list[KnowledgeBaseError]]:
    """Cross-check loaded files and build the base; returns it with every error found."""
    errors: list[KnowledgeBaseError] = []
    sources: dict[str, SourceSpec] = {}
    for f in files:
        if f.kind == "sources":
            for sid, spec in f.model.sources.items():
                if sid in sources:
                    errors.append(_err(f.display, _line(f.data["sources"], sid), f"sources.{sid}",
                                       f"source id {sid!r} is defined twice", "keep one definition"))
                sources[sid] = spec

    devices: dict[str, DeviceEntry] = {}
    first_seen: dict[str, str] = {sid: "sources.yaml" for sid in sources}
    constraints: list[Constraint] = []
    patterns: list[Pattern] = []
    spaces: list[SpaceEntry] = []
    recognizers: list[Recognizer] = []
    diagnoses: list[Diagnosis] = []
    for f in files:
        for spec, node, loc in _items(f):
            where = f"{f.display}:{_line(node)}"
            key = _keypath(loc)
            if spec.id in first_seen:
                errors.append(_err(f.display, _line(node, "id"), f"{key}.id",
                                   f"id {spec.id!r} is used twice (first at {first_seen[spec.id]})",
                                   "give this entry a different id; ids are unique across the whole base"))
                continue
            first_seen[spec.id] = where
            if f.kind == "device":
                devices[spec.id] = DeviceEntry(spec, f.display, _line(node))
            elif f.kind == "constraints":
                constraints.append(Constraint(spec, f.display, _line(node)))
            elif f.kind == "patterns":
                patterns.append(Pattern(spec, f.display, _line(node)))
            elif f.kind == "recognizers":
                recognizers.append(Recognizer(spec, f.display, _line(node)))
            elif f.kind == "diagnoses":
                diagnoses.append(Diagnosis(spec, f.display, _line(node)))
            else:
                spaces.append(SpaceEntry(spec, f.display, _line(node)))

    known_devices = list(devices)
    for f in files:
        for spec, node, loc in _items(f):
            key = _keypath(loc)
            errors += _check_references(f, spec, node, key, known_devices, sources)

    errors += _check_space_overlap(spaces, devices)
    errors += _check_diagnosis_facts(files, recognizers)
    kb = KnowledgeBase(root, [f.display for f in files], sources, devices, constraints, patterns, spaces,
                       recognizers, diagnoses)
    return kb, errors


def _check_references(
    f: LoadedFile, spec: Any, node: LineDict, key: str, known_devices: list[str], sources: dict[str, SourceSpec]
) -> list[KnowledgeBaseError]:
    errors: list[KnowledgeBaseError] = []
    d = f.display
    # device ids
    for i, dev in enumerate(getattr(spec, "devices", []) or []):
        if dev not in known_devices:
            close = difflib.get_close_matches(dev, known_devices, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            errors.append(_err(d, _item_line(node, "devices", i), f"{key}.devices[{i}]", f"unknown device {dev!r}",
                               f"{hint}known devices: {', '.join(known_devices)} (or add knowledge_base/devices/{dev}.yaml)"))
    if f.kind == "spaces" and not spec.devices:
        errors.append(_err(d, _line(node), key, "a tuning space must name its devices",
                           "add 'devices: [<device id>, ...]'"))
    # sources
    refs: list[tuple[str, int, str]] = []
    if f.kind == "device":
        facts_node = node.get("facts")
        for name, value in (facts_node or {}).items():
            fact_nodes = value.values() if name in ("peak_tflops", "measured_tflops") else [value]
            sub = list(value.keys()) if name in ("peak_tflops", "measured_tflops") else [None]
            for fact_node, subkey in zip(fact_nodes, sub):
                if not isinstance(fact_node, LineDict):
                    continue
                src = fact_node.get("source")
                ids = [src] if isinstance(src, str) else list(src or [])
                path = f"{key}.facts.{name}" + (f".{subkey}" if subkey else "") + ".source"
                refs += [(sid, _line(fact_node, "source"), path) for sid in ids]
    else:
        refs += [(sid, _line(node, "source"), f"{key}.source") for sid in sources_of(spec)]
    for sid, line, path in refs:
        if sid not in sources:
            close = difflib.get_close_matches(sid, list(sources), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            errors.append(_err(d, line, path, f"unknown source {sid!r}",
                               f"{hint}add it to knowledge_base/sources.yaml (title, url) or cite an existing id"))
    # device facts named by gating and by check parameters
    for name in getattr(spec, "device_facts", {}) or {}:
        if name not in FACT_NAMES:
            errors.append(_err(d, _line(node.get("device_facts"), name), f"{key}.device_facts.{name}",
                               f"unknown device fact {name!r}", f"use one of: {', '.join(FACT_NAMES)}"))
    if f.kind == "constraints":
        kind = CHECKS[spec.check.kind]
        check_node = node.get("check")
        for param in kind.fact_params:
            value = getattr(spec.check, param, None)
            if value is not None and value not in FACT_NAMES:
                errors.append(_err(d, _line(check_node, param), f"{key}.check.{param}",
                                   f"unknown device fact {value!r}", f"use one of: {', '.join(FACT_NAMES)}"))
        allowed = kind.placeholders | COMMON_PLACEHOLDERS
        for field_name in ("message", "fix"):
            template = getattr(spec, field_name)
            try:
                names = [n for _, n, _, _ in string.Formatter().parse(template) if n is not None]
            except ValueError as exc:
                errors.append(_err(d, _line(node, field_name), f"{key}.{field_name}",
                                   f"the {field_name} template is malformed ({exc})",
                                   "write '{{' and '}}' for literal braces"))
                continue
            for name in names:
                if name not in allowed:
                    errors.append(_err(d, _line(node, field_name), f"{key}.{field_name}",
                                       f"placeholder {{{name}}} is not filled by check kind {kind.name!r}",
                                       f"use one of: {', '.join('{' + p + '}' for p in sorted(allowed))}"))
    return errors


def _check_diagnosis_facts(files: list[LoadedFile], recognizers: list[Recognizer]) -> list[KnowledgeBaseError]:
    """Every fact a diagnosis tests is one a compiled kernel has or a recognizer finds."""
    known = set(METADATA_FACTS) | {r.spec.fact for r in recognizers} | {r.spec.capture for r in recognizers
                                                                         if r.spec.capture}
    errors = []
    for f in files:
        if f.kind != "diagnoses":
            continue
        for spec, node, loc in _items(f):
            tested = [(i, [cond.fact] + [v for v in (cond.above, cond.below) if isinstance(v, str)])
                      for i, cond in enumerate(spec.when)]
            for i, names in [*tested, *([(None, [spec.share])] if spec.share else [])]:
                for name in names:
                    if name not in known:
                        close = difflib.get_close_matches(name, sorted(known), n=1)
                        hint = f"did you mean {close[0]!r}? " if close else ""
                        line, where = ((_item_line(node, "when", i), f"{_keypath(loc)}.when[{i}]") if i is not None
                                       else (_line(node, "share"), f"{_keypath(loc)}.share"))
                        errors.append(_err(f.display, line, where, f"unknown fact {name!r}",
                                           f"{hint}name a compiled kernel's fact ({', '.join(METADATA_FACTS)}) "
                                           "or one a recognizer in knowledge_base/recognizers/ defines"))
    return errors


def _check_space_overlap(spaces: list[SpaceEntry], devices: dict[str, DeviceEntry]) -> list[KnowledgeBaseError]:
    errors = []
    reported: set[tuple[str, str]] = set()
    # spaces for few rows (max_rows) overlap only each other, by the same bound
    groups = sorted({(s.spec.family, s.spec.max_rows) for s in spaces}, key=lambda fr: (fr[0], fr[1] or 0))
    for family, rows in groups:
        fam = [s for s in spaces if s.spec.family == family and s.spec.max_rows == rows]
        for dev in devices.values():
            for probe in _PROBES:
                hits = [s for s in fam if dev.id in s.spec.devices and version_applies(
                    s.spec.range("triton"), s.spec.range("triton_xpu"), probe)]
                if len(hits) > 1 and (hits[1].id, dev.id) not in reported:
                    reported.add((hits[1].id, dev.id))
                    errors.append(KnowledgeBaseError(
                        f"{hits[1].where} spaces", f"tuning spaces {hits[0].id!r} ({hits[0].where}) and "
                        f"{hits[1].id!r} both apply to {family} kernels on {dev.id} under {probe}",
                        "narrow their devices or Triton ranges so one space applies (use 'variants' for "
                        "version-specific values)"))
    return errors


def load_paths(paths: Iterable[Path], root: Path | None = None) -> tuple[KnowledgeBase, list[KnowledgeBaseError]]:
    loaded: list[LoadedFile] = []
    errors: list[KnowledgeBaseError] = []
    for path in paths:
        lf, errs = load_file(path)
        errors += errs
        if lf is not None:
            loaded.append(lf)
    kb, more = build(loaded, root)
    return kb, errors + more


# -- public entry points -----------------------------------------------------------------------------
_CACHE: dict[Path, tuple[tuple[tuple[str, float], ...], KnowledgeBase]] = {}


def _signature(files: list[Path]) -> tuple[tuple[str, float], ...]:
    return tuple((str(p), p.stat().st_mtime) for p in files)


def load_kb(root: Path | None = None) -> KnowledgeBase:
    """Load the base at ``root`` (default: ``<repo>/knowledge_base``, or ``$XEFORGE_KB``).

    Cached per root until a file changes. Raises :class:`KnowledgeBaseError` with the first error
    (``xeforge kb lint`` lists them all).
    """
    root = Path(root) if root is not None else default_root()
    root = root.resolve()
    if not root.is_dir():
        raise KnowledgeBaseError(str(root), "the knowledge-base folder does not exist",
                                 "pass the folder that holds devices/, constraints/, patterns/, spaces/")
    files = discover(root)
    sig = _signature(files)
    cached = _CACHE.get(root)
    if cached is not None and cached[0] == sig:
        return cached[1]
    kb, errors = load_paths(files, root)
    errors += stray_files(root)
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more; run `xeforge kb lint`)" if len(errors) > 1 else ""
        raise KnowledgeBaseError(first.where, first.what + more, first.fix)
    _CACHE[root] = (sig, kb)
    return kb


def lint_paths(paths: list[Path] | None = None) -> list[KnowledgeBaseError]:
    """Every error in the given files or folders, each with ``path:line``, the message and the fix.

    A file is checked in the context of the shipped base (so its device and source ids resolve, and an id
    it reuses is a duplicate); a folder that is itself a knowledge-base root is checked on its own.
    No paths: the shipped base.
    """
    kb, errors = lint_with_base(paths)
    return errors


def lint_with_base(paths: list[Path] | None = None) -> tuple[KnowledgeBase, list[KnowledgeBaseError]]:
    paths = [Path(p) for p in (paths or [default_root()])]
    given: list[Path] = []
    base_root: Path | None = None
    errors: list[KnowledgeBaseError] = []
    for p in paths:
        if is_kb_root(p):
            base_root = p.resolve()
            given += discover(p)
            errors += stray_files(p)
        elif p.is_dir():
            given += sorted(x for x in p.rglob("*") if x.suffix in (".yaml", ".yml") and x.is_file())
        elif p.is_file():
            given.append(p)
        else:
            errors.append(KnowledgeBaseError(str(p), "no such file or folder", "check the path"))
    context_root = base_root or default_root().resolve()
    given_resolved = {g.resolve() for g in given}
    context = [c for c in discover(context_root) if c.resolve() not in given_resolved]
    kb, more = load_paths(context + given, context_root)
    return kb, errors + more
