"""``xeforge kb``: lint, show, explain (and check) — the knowledge base from the command line.

Owns: :func:`register` (adds the ``kb`` command and its sub-commands to an argparse sub-parser set) and
the handlers. Each handler takes the parsed ``args`` and returns the exit code; data goes to stdout,
progress and warnings to stderr; an :class:`~xeforge.errors.XeforgeError` prints ``Error: ...`` with its fix
and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from xeforge.errors import XeforgeError
from xeforge.kb._base import STAGES
from xeforge.kb.loader import lint_with_base, load_kb
from xeforge.kb.versions import TritonInfo, installed_triton
from xeforge.kernel_model import parse_kernel


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``kb lint | show | explain | check`` to ``subparsers``; returns the ``kb`` parser."""
    kb = subparsers.add_parser(
        "kb", help="lint, show and explain the knowledge base",
        description="The knowledge base: devices, constraints, patterns and tuning spaces (knowledge_base/).",
    )
    kb.set_defaults(func=lambda args: _usage(kb))
    sub = kb.add_subparsers(dest="kb_command", metavar="{lint,show,explain,check}")

    lint = sub.add_parser("lint", help="check knowledge-base files against the schema (exit 1 on any error)")
    lint.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                      help="files or folders to check (default: the shipped knowledge_base/)")
    lint.set_defaults(func=cmd_lint)

    show = sub.add_parser("show", help="print exactly what a stage receives for a device and Triton version")
    show.add_argument("--device", required=True, help="device id, e.g. arc-b580 (see knowledge_base/devices/)")
    show.add_argument("--stage", required=True, choices=STAGES, metavar="STAGE", help=f"one of: {', '.join(STAGES)}")
    show.add_argument("--triton", help="Triton version to gate on (default: the installed one)")
    show.add_argument("--xpu", action=argparse.BooleanOptionalAction, default=None,
                      help="treat --triton as Intel's triton-xpu (default: yes for xpu devices when --triton is given)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--kb", type=Path, default=None, help=argparse.SUPPRESS)
    show.set_defaults(func=cmd_show)

    explain = sub.add_parser("explain", help="everything about one entry: rule, sources, where it is written")
    explain.add_argument("rule_id", metavar="RULE_ID")
    explain.add_argument("--kb", type=Path, default=None, help=argparse.SUPPRESS)
    explain.set_defaults(func=cmd_explain)

    check = sub.add_parser("check", help="run the knowledge-base constraints (gate 1) on a kernel file")
    check.add_argument("kernel", type=Path, help="kernel .py file")
    check.add_argument("--device", required=True)
    check.add_argument("--triton", help="Triton version (default: the installed one)")
    check.add_argument("--xpu", action=argparse.BooleanOptionalAction, default=None)
    check.add_argument("--dtype", help="dtype of the tl.dot operands (sharpens the shared-memory estimate)")
    check.add_argument("--json", action="store_true")
    check.add_argument("--kb", type=Path, default=None, help=argparse.SUPPRESS)
    check.set_defaults(func=cmd_check)
    return kb


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fail(exc: XeforgeError) -> int:
    print(f"Error: {exc.render()}", file=sys.stderr)
    return 1


def resolve_triton(version: str | None, xpu: bool | None, backend: str) -> TritonInfo:
    """``--triton`` / ``--xpu`` as a :class:`TritonInfo`; the installed Triton when no version is given."""
    if version is None:
        info = installed_triton()
        return info if xpu is None else TritonInfo(info.version, xpu, info.text)
    return TritonInfo.parse(version, is_xpu=(backend == "xpu") if xpu is None else xpu)


def cmd_lint(args: argparse.Namespace) -> int:
    kb, errors = lint_with_base(list(args.paths) or None)
    if errors:
        for err in errors:
            print(err.render())
        print(f"kb lint: {len(errors)} error{'s' if len(errors) != 1 else ''}", file=sys.stderr)
        return 1
    checked = len(args.paths) or len(kb.files)
    print(
        f"kb lint: OK — {checked} path{'s' if checked != 1 else ''} checked; base has {len(kb.devices)} devices, "
        f"{len(kb.constraints)} constraints, {len(kb.patterns)} patterns, {len(kb.space_entries)} spaces, "
        f"{len(kb.recognizers)} recognizers, {len(kb.diagnoses)} diagnoses, {len(kb.sources)} sources"
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        kb = load_kb(args.kb)
        device = kb.device(args.device)
        triton = resolve_triton(args.triton, args.xpu, device.backend)
        if args.triton is None:
            print(f"gating on the installed {triton}", file=sys.stderr)
            if device.backend == "xpu" and not triton.is_xpu:
                print(f"warning: the installed Triton is not Intel's triton-xpu, so entries for triton-xpu are "
                      f"left out; pass --triton VERSION (e.g. 3.6.0) to see what {device.id} gets", file=sys.stderr)
        selection = kb.select(args.stage, device.id, triton)
    except XeforgeError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(selection.to_dict(), indent=2, sort_keys=False))
    else:
        sys.stdout.write(selection.render_text())
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    try:
        text = load_kb(args.kb).explain(args.rule_id)
    except XeforgeError as exc:
        return _fail(exc)
    sys.stdout.write(text)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    try:
        kb = load_kb(args.kb)
        device = kb.device(args.device)
        triton = resolve_triton(args.triton, args.xpu, device.backend)
        source = args.kernel.read_text(encoding="utf-8")
        model = parse_kernel(source, str(args.kernel))
        violations = kb.check(model, device.id, triton, dtype=args.dtype)
    except XeforgeError as exc:
        return _fail(exc)
    except OSError as exc:
        print(f"Error: {args.kernel}: cannot read the kernel ({exc})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([v.to_dict() for v in violations], indent=2))
    else:
        for v in violations:
            print(v.render(str(args.kernel)))
        errors = sum(v.is_error for v in violations)
        print(f"kb check: {errors} error(s), {len(violations) - errors} warning(s) for {device.id} under {triton}",
              file=sys.stderr)
    return 1 if any(v.is_error for v in violations) else 0
