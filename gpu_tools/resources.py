"""What a kernel compiled ahead of time (:mod:`gpu_tools.aot`) takes of the GPU: registers, spills, stack
and shared memory, read from the ``ptxas`` that Triton ships (``python -m gpu_tools.aot --spills``)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import NamedTuple

__all__ = ["ResourceUsage", "parse_ptxas_log", "resource_usage", "shipped_assemblers"]


class ResourceUsage(NamedTuple):
    """What one compiled kernel takes of the GPU: registers per thread (at most 255 on sm_80/sm_90), the
    bytes per thread the assembler, short of registers, spills to local memory (off chip: traffic on every
    tile) and reads back, the stack frame they live in, shared memory per program (bytes), and the
    ``ptxas`` that produced the figures."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int
    assembler: str

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_PTXAS_FUNCTION = re.compile(r"Function properties for (?P<name>\S+)\s*\n"
                             r"\s*(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
                             r"(?P<loads>\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Compiling entry function '(?P<name>[^']+)'[^\n]*\n(?:[^\n]*\n)*?"
                              r"[^\n]*Used (?P<registers>\d+) registers")
_CUOBJDUMP_FUNCTION = re.compile(r"Function (?P<name>\S+):\s*\n\s*REG:(?P<registers>\d+) STACK:(?P<stack>\d+)")


def parse_ptxas_log(log: str, kernel_name: str) -> dict[str, int]:
    """Registers and spills of ``kernel_name`` from the report of ``ptxas -v``.

    Args:
        log: what ``ptxas -v`` wrote (it writes to stderr).
        kernel_name: the entry function (Triton's ``metadata.name``).

    Returns:
        ``{"registers": R, "spill_stores": T, "spill_loads": L, "stack": S}``.

    Raises:
        TypeError: ``log`` or ``kernel_name`` not a string.
        ValueError: the report has no such function, or not all of its figures.

    Example:
        >>> parse_ptxas_log(\'\'\'ptxas info    : Compiling entry function 'k' for 'sm_90a'
        ... ptxas info    : Function properties for k
        ...     8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
        ... ptxas info    : Used 255 registers, used 1 barriers, 8 bytes cumulative stack size\'\'\', "k")
        {'registers': 255, 'spill_stores': 8, 'spill_loads': 4, 'stack': 8}
    """
    for argument, value in (("log", log), ("kernel_name", kernel_name)):
        if not isinstance(value, str):
            raise TypeError(f"parse_ptxas_log: {argument} must be a str, got {type(value).__name__}")
    properties = [m for m in _PTXAS_FUNCTION.finditer(log) if m["name"] == kernel_name]
    registers = [m for m in _PTXAS_REGISTERS.finditer(log) if m["name"] == kernel_name]
    if not properties or not registers:
        found = sorted(set(re.findall(r"Compiling entry function '([^']+)'", log)))
        raise ValueError(f"parse_ptxas_log: no register and spill report for {kernel_name!r} in the ptxas output "
                         f"(functions reported: {found}); ptxas must run with -v. Output began: {log[:300]!r}")
    match = properties[0]
    return {"registers": int(registers[0]["registers"]), "spill_stores": int(match["stores"]),
            "spill_loads": int(match["loads"]), "stack": int(match["stack"])}


def shipped_assemblers(capability: int) -> list[str]:
    """The ``ptxas`` programs that come with Triton, in the order to try them for ``sm_<capability>``: for
    sm_90 and newer ``ptxas-blackwell`` first (Triton writes PTX of the version it reads, which the older
    plain ``ptxas`` refuses), for sm_80 the plain one first, as Triton does.

    Raises:
        TypeError, ValueError: ``capability`` not an int of at least 50.
        FileNotFoundError: Triton (or its NVIDIA backend) ships no ``ptxas`` here.
    """
    if not isinstance(capability, int) or isinstance(capability, bool):
        raise TypeError(f"shipped_assemblers: capability must be an int, got {type(capability).__name__}")
    if capability < 50:
        raise ValueError(f"shipped_assemblers: capability must be compute capability times ten (80, 90, ...), "
                         f"got {capability}")
    import triton

    folder = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    names = ("ptxas-blackwell", "ptxas") if capability >= 90 else ("ptxas", "ptxas-blackwell")
    found = [os.path.join(folder, name) for name in names if os.access(os.path.join(folder, name), os.X_OK)]
    if not found:
        raise FileNotFoundError(f"shipped_assemblers: no executable ptxas or ptxas-blackwell in {folder} "
                                f"(Triton {triton.__version__}); is Triton's NVIDIA backend installed?")
    return found


def resource_usage(compiled) -> ResourceUsage:
    """Registers, spills and shared memory of a kernel compiled for a CUDA GPU, without a GPU.

    Triton keeps only the binary and reads its registers when a GPU loads it, so the PTX is assembled
    again with Triton's own flags (the register allocation, hence the spills, depend on them). Where
    Triton ships ``cuobjdump``, the binary's registers and stack must be the re-assembly's.

    Args:
        compiled: what :func:`~gpu_tools.aot.compile_case` (``triton.compile``) returns for a CUDA target.

    Returns:
        A :class:`ResourceUsage`.

    Raises:
        TypeError, ValueError: ``compiled`` not a Triton kernel with PTX, or not compiled for CUDA.
        FileNotFoundError: no shipped ``ptxas``.
        RuntimeError: every shipped ``ptxas`` failed (their messages included), or the re-assembly
            disagrees with Triton's binary.
    """
    asm, metadata = getattr(compiled, "asm", None), getattr(compiled, "metadata", None)
    if not isinstance(asm, dict) or not isinstance(asm.get("ptx"), str) or metadata is None:
        raise TypeError(f"resource_usage: compiled must be a kernel compiled by triton.compile for a CUDA target "
                        f"(with .asm['ptx'] and .metadata), got {type(compiled).__name__}")
    target = metadata.target
    if target.backend != "cuda":
        raise ValueError(f"resource_usage: compiled must target CUDA, got the {target.backend!r} backend")
    capability = int(target.arch)
    gpu_name = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    flags = ["-v", "--regAllocOptLevel=2", *([] if metadata.enable_fp_fusion else ["--fmad=false"]),
             *(metadata.ptx_options.split() if getattr(metadata, "ptx_options", None) else []),
             f"--gpu-name={gpu_name}"]
    failures = []
    with tempfile.TemporaryDirectory(prefix="attn_course_ptxas_") as folder:
        ptx = os.path.join(folder, "kernel.ptx")
        with open(ptx, "w") as file:
            file.write(asm["ptx"])
        for assembler in shipped_assemblers(capability):
            result = subprocess.run([assembler, *flags, ptx, "-o", os.path.join(folder, "kernel.cubin")],
                                    capture_output=True, text=True, timeout=600)
            log = result.stderr + result.stdout
            if result.returncode != 0:
                failures.append(f"{assembler} (exit {result.returncode}): {log.strip()[-500:]}")
                continue
            try:
                figures = parse_ptxas_log(log, metadata.name)
            except ValueError as error:
                failures.append(f"{assembler}: {error}")
                continue
            usage = ResourceUsage(**figures, shared=int(metadata.shared), assembler=assembler)
            _check_against_binary(usage, asm.get("cubin"), metadata.name)
            return usage
    raise RuntimeError("resource_usage: no shipped ptxas could assemble the PTX of "
                       f"{metadata.name} for {gpu_name}:\n" + "\n".join(failures))


def _check_against_binary(usage: ResourceUsage, cubin, kernel_name: str) -> None:
    """Refuse figures that are not those of Triton's own binary (when ``cuobjdump`` can tell)."""
    cuobjdump = os.path.join(os.path.dirname(usage.assembler), "cuobjdump")
    if not isinstance(cubin, bytes) or not os.access(cuobjdump, os.X_OK):
        return
    with tempfile.TemporaryDirectory(prefix="attn_course_cubin_") as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(cubin)
        result = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True,
                                timeout=120)
    matches = [m for m in _CUOBJDUMP_FUNCTION.finditer(result.stdout) if m["name"] == kernel_name]
    if result.returncode != 0 or not matches:
        return      # an older cuobjdump that cannot read this binary: nothing to compare with
    registers, stack = int(matches[0]["registers"]), int(matches[0]["stack"])
    if (registers, stack) != (usage.registers, usage.stack):
        raise RuntimeError(f"resource_usage: re-assembling {kernel_name} gave {usage.registers} registers and "
                           f"{usage.stack} bytes of stack, but Triton's binary has {registers} and {stack}: "
                           "this Triton assembles with other ptxas flags than the ones mirrored here")
