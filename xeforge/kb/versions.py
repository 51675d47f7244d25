"""Which Triton is installed, and version ranges that gate knowledge-base entries.

Owns: :class:`TritonInfo` (version, whether it is Intel's triton-xpu fork, the raw text),
:func:`installed_triton` (reads package metadata and the installed ``triton/`` folder; never imports
torch or triton), and :class:`VersionRange` (a PEP 440 range such as ``">=3.6,<3.9"``, or ``none``).

Gating rule (used by every entry kind): an entry may name ``triton`` (upstream Triton) and/or
``triton_xpu`` (Intel's fork). Under upstream Triton only ``triton`` counts (an entry that names only
``triton_xpu`` is about the fork and does not apply). Under triton-xpu, ``triton_xpu`` counts when given,
else ``triton`` (the fork inherits upstream facts unless an entry says otherwise). A missing range means
every version. Pre-release, dev and local parts of a version are ignored (``3.9.0rc1+git`` gates as 3.9.0).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from xeforge.errors import UsageError

#: distributions that carry Intel's fork, checked before upstream ``triton``
XPU_DISTRIBUTIONS = ("pytorch-triton-xpu", "triton-xpu")
UPSTREAM_DISTRIBUTIONS = ("triton", "pytorch-triton")


def _release(version: Version) -> Version:
    return Version(".".join(str(p) for p in version.release))


@dataclass(frozen=True)
class TritonInfo:
    """The Triton that kernels will be compiled with."""

    version: Version
    is_xpu: bool
    text: str

    @classmethod
    def parse(cls, text: str, is_xpu: bool = False) -> TritonInfo:
        """``TritonInfo.parse("3.6.0", is_xpu=True)``. Raises :class:`UsageError` on a bad version."""
        raw = str(text).strip()
        try:
            version = _release(Version(raw))
        except InvalidVersion:
            raise UsageError(
                "--triton", f"cannot parse Triton version {raw!r}", "write a version such as 3.6.0 or 3.8"
            ) from None
        return cls(version=version, is_xpu=bool(is_xpu), text=raw)

    @property
    def flavour(self) -> str:
        return "triton-xpu" if self.is_xpu else "triton"

    def __str__(self) -> str:
        return f"{self.flavour} {self.text}"


@functools.lru_cache(maxsize=1)
def installed_triton() -> TritonInfo:
    """The installed Triton, from package metadata; ``is_xpu`` when it is Intel's fork.

    Intel's fork is recognised by its distribution name (``pytorch-triton-xpu`` / ``triton-xpu``) or by an
    ``intel`` folder in the installed ``triton/backends/``. Raises :class:`UsageError` when Triton is absent.
    """
    for dist in XPU_DISTRIBUTIONS:
        try:
            return TritonInfo.parse(importlib.metadata.version(dist), is_xpu=True)
        except importlib.metadata.PackageNotFoundError:
            continue
    spec = importlib.util.find_spec("triton")  # a top-level package: found without importing it
    intel_backend = False
    if spec is not None and spec.submodule_search_locations:
        intel_backend = any((Path(p) / "backends" / "intel").is_dir() for p in spec.submodule_search_locations)
    for dist in UPSTREAM_DISTRIBUTIONS:
        try:
            return TritonInfo.parse(importlib.metadata.version(dist), is_xpu=intel_backend)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise UsageError(
        "triton",
        "Triton is not installed, so the knowledge base cannot tell which entries apply",
        "install it (for Intel GPUs: pip install torch --index-url https://download.pytorch.org/whl/xpu), "
        "or pass --triton VERSION",
    )


class VersionRangeError(ValueError):
    pass


class VersionRange:
    """A PEP 440 version range (``">=3.6"``, ``">=3.6,<3.9"``, ``"==3.7.*"``), or ``none`` (no version)."""

    NONE = "none"

    def __init__(self, text: str) -> None:
        self.text = str(text).strip()
        if self.text == self.NONE:
            self.spec: SpecifierSet | None = None
            return
        if not self.text:
            raise VersionRangeError("the range is empty")
        try:
            self.spec = SpecifierSet(self.text)
        except InvalidSpecifier:
            raise VersionRangeError(f"cannot parse version range {self.text!r}") from None
        if not len(self.spec):
            raise VersionRangeError(f"cannot parse version range {self.text!r}")
        if self._is_empty():
            raise VersionRangeError(f"version range {self.text!r} contains no version")

    def _is_empty(self) -> bool:
        lower: tuple[Version, bool] | None = None  # (bound, inclusive)
        upper: tuple[Version, bool] | None = None
        assert self.spec is not None
        for s in self.spec:
            if "*" in s.version or s.operator in ("~=", "===", "!="):
                continue
            v = Version(s.version)
            if s.operator in (">=", ">"):
                cand = (v, s.operator == ">=")
                if lower is None or cand[0] > lower[0] or (cand[0] == lower[0] and not cand[1]):
                    lower = cand
            elif s.operator in ("<=", "<"):
                cand = (v, s.operator == "<=")
                if upper is None or cand[0] < upper[0] or (cand[0] == upper[0] and not cand[1]):
                    upper = cand
            elif s.operator == "==":
                cand_eq = (v, True)
                if lower is None or v > lower[0]:
                    lower = cand_eq
                if upper is None or v < upper[0]:
                    upper = cand_eq
        if lower is None or upper is None:
            return False
        if lower[0] > upper[0]:
            return True
        return lower[0] == upper[0] and not (lower[1] and upper[1])

    def contains(self, version: Version) -> bool:
        if self.spec is None:
            return False
        return self.spec.contains(version, prereleases=True)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"VersionRange({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VersionRange) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def version_applies(triton: VersionRange | None, triton_xpu: VersionRange | None, info: TritonInfo) -> bool:
    """The gating rule described in the module docstring."""
    if info.is_xpu:
        rng = triton_xpu if triton_xpu is not None else triton
    else:
        if triton is None and triton_xpu is not None:
            return False
        rng = triton
    return rng is None or rng.contains(info.version)


def describe_versions(triton: VersionRange | None, triton_xpu: VersionRange | None) -> str:
    parts = []
    if triton is not None:
        parts.append(f"triton {triton}")
    if triton_xpu is not None:
        parts.append(f"triton-xpu {triton_xpu}")
    return ", ".join(parts) if parts else "all versions"
