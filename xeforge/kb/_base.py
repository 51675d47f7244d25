"""Shared vocabulary of the knowledge base: stage names, backends, families, confidence levels, base model.

Owns: :data:`STAGES` (the nine stages, in pipeline order), the other closed vocabularies, and
:class:`KBModel`, the pydantic base every YAML schema model derives from (strict types, unknown keys are
errors that name the allowed keys and the closest one).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

Stage = Literal[
    "algorithmic",
    "dtype",
    "fusion",
    "memory_access",
    "block_io",
    "persistent",
    "device_tuning",
    "autotuning",
    "discovery",
]
Backend = Literal["xpu", "cuda", "cpu"]
Family = Literal["gemm", "gemv", "reduction", "elementwise", "attention"]
Confidence = Literal["verified", "derived", "unverified"]
Severity = Literal["error", "warning"]
#: dtype keys of ``peak_tflops`` (aliases such as ``bfloat16`` / ``torch.float16`` are accepted by helpers)
DtypeKey = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4"]

STAGES: tuple[str, ...] = get_args(Stage)
BACKENDS: tuple[str, ...] = get_args(Backend)
FAMILIES: tuple[str, ...] = get_args(Family)
CONFIDENCE: tuple[str, ...] = get_args(Confidence)
SEVERITIES: tuple[str, ...] = get_args(Severity)
DTYPE_KEYS: tuple[str, ...] = get_args(DtypeKey)

ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"

_DTYPE_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8e4nv": "fp8",
    "fp8e5": "fp8",
}


def dtype_key(name: str) -> str | None:
    """Normalise ``torch.bfloat16`` / ``tl.float16`` / ``bfloat16`` / ``bf16`` to a :data:`DTYPE_KEYS` key."""
    text = str(name).strip().lower()
    for prefix in ("torch.", "tl.", "triton.language."):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if text in DTYPE_KEYS:
        return text
    return _DTYPE_ALIASES.get(text)


#: bytes per element of the dtype keys (int4 rounds up to one byte)
DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 1}


class KBModel(BaseModel):
    """Strict base: no type coercion, and an unknown key is an error that lists the allowed keys."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    close = difflib.get_close_matches(str(key), allowed, n=1)
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key {key}",
                        {"key": key, "allowed": ", ".join(allowed), "suggest": close[0] if close else ""},
                    )
        return data
