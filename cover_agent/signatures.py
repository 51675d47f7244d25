"""The DSPy signatures of the CoVeR agent: one per kind of call, with typed fields.

Owns: :class:`AnalyzeStage` (plan a stage before proposing), :class:`OptimizeKernel` (the stages that
reschedule, retype, fuse or tune), :class:`RewriteAlgorithm` (the algorithmic stage: the brief carries the
PyTorch reference and the answer names the identity it relies on), :class:`DiscoverIdea` (open-ended
discovery), and :data:`SIGNATURES`, the registry the engine picks from by the kind a stage template declares.
The brief (the rendered stage template, :mod:`cover_agent.prompts`) is the single input; the instructions
below say what the answer must contain. Imported only by the engine, when the llm engine is used.
"""

from __future__ import annotations

import dspy

_BRIEF = ("everything about this stage: its goal and what to look for, the target device, the problem's shapes, "
          "FLOPs, bytes and roofline, the precision contract, detected issues, every knowledge-base entry that "
          "applies, the kernels, and the verifier's verdicts on earlier attempts")
_CODE = ("the complete new kernel file in one ```python block: imports, every @triton.jit kernel, and class Model "
         "with the same __init__ arguments, parameter names and forward signature")


class AnalyzeStage(dspy.Signature):
    """You are a GPU performance engineer porting a Triton kernel to an Intel GPU one stage at a time. Read the
    brief and plan this stage only: what in the current kernel this stage can change, in what order to try it,
    and what it should gain. Ground every point in the kernel source, the detected issues, the roofline numbers
    and the knowledge-base entries (cite their ids). Say so plainly when this stage has nothing worth trying."""

    brief: str = dspy.InputField(desc=_BRIEF)
    bottlenecks: list[str] = dspy.OutputField(
        desc="what limits the current kernel that this stage can address, most important first")
    plan: str = dspy.OutputField(
        desc="the concrete changes to try, in order, each with the knowledge-base id it relies on where one applies")
    worth_trying: bool = dspy.OutputField(desc="false only when this stage cannot improve this kernel")
    reason: str = dspy.OutputField(desc="one sentence: why this stage is, or is not, worth trying")


class OptimizeKernel(dspy.Signature):
    """You are a GPU performance engineer porting a Triton kernel to an Intel GPU one stage at a time. Follow the
    brief: make the changes this stage is about, keep the function the kernel computes, respect the precision
    contract and every knowledge-base constraint, and fix whatever the verifier reported on earlier attempts.
    Only the verifier decides whether your kernel is correct and faster."""

    brief: str = dspy.InputField(desc=_BRIEF)
    changes: str = dspy.OutputField(
        desc="what you changed and why it should be faster on this device, in a few lines")
    kernel_code: str = dspy.OutputField(desc=_CODE)


class RewriteAlgorithm(dspy.Signature):
    """You are a GPU performance engineer porting a Triton kernel to an Intel GPU. This is the algorithmic stage:
    change the mathematics so the kernel does less work for the same result, reading the PyTorch reference in the
    brief as the definition of the function. Use only identities that hold for every allowed input, within the
    precision contract, and fix whatever the verifier reported on earlier attempts."""

    brief: str = dspy.InputField(desc=_BRIEF + "; for this stage also the PyTorch reference")
    identity: str = dspy.OutputField(desc="the algebraic identity or simplification you used, and why it is exact "
                                          "(or within the precision contract) for every input")
    kernel_code: str = dspy.OutputField(desc=_CODE)


class DiscoverIdea(dspy.Signature):
    """You are a GPU performance engineer porting a Triton kernel to an Intel GPU. The earlier stages (algorithmic
    rewrites, dtypes, fusion, memory access, block I/O, persistence, launch tuning, autotuning) are done. Find one
    idea none of them covers that the roofline numbers say is worth it, explain it, and implement it; fix whatever
    the verifier reported on earlier attempts."""

    brief: str = dspy.InputField(desc=_BRIEF)
    idea: str = dspy.OutputField(
        desc="the idea, why no earlier stage covers it, and why it should pay off on this device")
    kernel_code: str = dspy.OutputField(desc=_CODE)


#: kind (declared by a stage template as ``signature``, or ``analysis``) -> (signature, its description field)
SIGNATURES: dict[str, tuple[type[dspy.Signature], str | None]] = {
    "analysis": (AnalyzeStage, None),
    "optimization": (OptimizeKernel, "changes"),
    "algorithmic": (RewriteAlgorithm, "identity"),
    "discovery": (DiscoverIdea, "idea"),
}
