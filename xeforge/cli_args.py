"""Command-line arguments that more than one ``xeforge`` sub-command takes.

Owns: the llm engine's flags (:func:`add_llm_args`: ``--model``, ``--api-base``, ``--max-iters``, ``--best-k``, read
back by :func:`xeforge.engines.llm_config`), which ``xeforge port`` and ``xeforge env`` (:mod:`xeforge.cli`) and
``xeforge bench --port`` (:mod:`xeforge.bench`) share, the whole-number-at-least-one argument type
(:func:`positive_int`), the positive-number one (:func:`positive_float`) and the port's time budget
(:func:`add_time_budget`) and check lanes (:func:`add_check_lanes`), which ``port`` and ``bench --port`` both
take. It imports nothing of xeforge, so both command modules import it at module level.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (pass a whole number >= 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1 (pass a whole number >= 1)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (pass a number > 0)") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number > 0 (pass e.g. 8 or 2.5)")
    return value


def add_time_budget(p: argparse.ArgumentParser, what: str = "the stages") -> None:
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="MINUTES",
                   help=f"wall-clock minutes for {what}: each stage gets a share of what is left (device_tuning "
                        "three parts, autotuning 1.5, the others one) and each tactic a part of its stage's share, "
                        "checked before each tactic and between a tactic's candidates; what is left is skipped, "
                        "saying so, and the final gate runs on the best "
                        "kernel so far; --resume with a larger budget continues (default: $XEFORGE_PORT_MINUTES, "
                        "else no limit)")


def add_check_lanes(p: argparse.ArgumentParser, what: str = "a tactic's candidates") -> None:
    p.add_argument("--check-lanes", type=positive_int, default=None, metavar="K",
                   help=f"check {what} through gates 1, 0 and 2 with K verifiers side by side, on this host's "
                        "GPUs in turn (the CPU interpreter: K processes); gate 3 still times them one by one "
                        "(default: $XEFORGE_CHECK_LANES, else 1)")


def add_llm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="LiteLLM model string (default: $XEFORGE_MODEL)")
    p.add_argument("--api-base", default=None, help="base URL of an OpenAI-compatible server")
    p.add_argument("--max-iters", type=positive_int, default=None, help="CoVeR refinement rounds per candidate")
    p.add_argument("--best-k", type=positive_int, default=None, help="independent candidates per stage")
