"""Every user-facing failure of xeforge, one class each, with where it happened and how to fix it.

Owns: the exception hierarchy. The CLI catches :class:`XeforgeError`, prints ``Error: <where>: <what>``
and the fix hint, and exits 1 — never a traceback. Code that raises picks the class that names the
failure, and says *where* (a file, a key path, a line) and *the fix*.
"""

from __future__ import annotations


class XeforgeError(Exception):
    """Base class: ``where`` (file/key/line), ``what`` happened, and the ``fix``."""

    kind = "error"

    def __init__(self, where: str, what: str, fix: str = "") -> None:
        self.where = where
        self.what = what
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class SpecError(XeforgeError):
    """A problem's spec.yaml is malformed: missing key, wrong type, unknown dim, bad formula."""

    kind = "spec"


class ProblemError(XeforgeError):
    """A problem folder is incomplete or inconsistent (no kernel.py, no Model, reference mismatch)."""

    kind = "problem"


class KernelSourceError(XeforgeError):
    """A kernel file cannot be parsed or lacks what the tool needs (a jit kernel, a launch site)."""

    kind = "kernel"


class DeviceError(XeforgeError):
    """The requested device is not available or not usable."""

    kind = "device"


class KnowledgeBaseError(XeforgeError):
    """A knowledge-base YAML file is malformed (schema, duplicate id, bad version range)."""

    kind = "kb"


class RunError(XeforgeError):
    """A port run cannot proceed (starting kernel fails verification, run folder unusable, resume mismatch)."""

    kind = "run"


class EngineError(XeforgeError):
    """An engine cannot be used as asked (e.g. ``--engine llm`` without a configured model)."""

    kind = "engine"


class ClusterError(XeforgeError):
    """The Ray cluster ``--cluster`` names cannot be reached or cannot run the bench (no GPU for a GPU bench)."""

    kind = "cluster"


class UsageError(XeforgeError):
    """A command-line argument or environment setting is invalid."""

    kind = "usage"
