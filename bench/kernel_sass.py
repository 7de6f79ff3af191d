"""The decode attention kernel compiled here, for a GPU that is not: its registers, its stack and the
instructions of its innermost loops, read from the machine code (SASS) that Triton's bundled ``ptxas``
makes and its ``cuobjdump`` prints. Seconds on the CPU, where each call of a lent GPU costs minutes.

    python -m bench.kernel_sass
    python -m bench.kernel_sass --kv-dtypes fp8 --launch TILE=32,num_warps=1 --opcodes 12

The kernel is launched as ``worker.engine.attention.decode_attention`` launches it at ``--rows`` slots whose
tables cover ``--context`` positions (by default the standard workload's full load: one split a slot), with
its own arguments and Triton's own specialisation of them (which integers and pointers it takes as
divisible by 16), on tensors that hold no memory. ``--launch`` overrides the cache dtype's settings of
``worker.engine.attention._LAUNCH``.

Why count instructions: a multiprocessor of an H200 takes its share of the memory's bandwidth, 4.8 TB/s over
132 of them at 1.98 GHz, as ~18 bytes a clock, and issues at most 4 warp instructions (128 threads' worth)
a clock. A loop that reads the cache at copy speed can afford ~7 instructions a thread per byte it
reads, fewer once their latencies count; an fp8 cache has one byte a value, so an fp8 loop's
instructions per value say how close to that its arithmetic brings it. The counts are static (each
instruction of the loop's body once, as the GPU issues them once an iteration); what they cost in time
only a GPU says.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch

from bench.decode_step import attention_inputs_of, launch_settings
from worker.engine import attention

KV_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
# One SASS instruction as cuobjdump prints it: "/*0c20*/  @!P0 LDG.E.64 R60, desc[UR32][R44.64] ;".
INSTRUCTION = re.compile(
    r"^\s+/\*(?P<address>[0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?(?P<opcode>[A-Z][A-Z0-9_]*)(?P<rest>[^;]*);"
)


@dataclass(frozen=True)
class Loop:
    """A loop of the machine code: its body from the branch's target to the branch, and its opcodes."""

    first: int
    last: int
    opcodes: collections.Counter

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    def holds(self, other: Loop) -> bool:
        return self != other and self.first <= other.first and other.last <= self.last


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each instruction, in order."""
    return [
        (int(match["address"], 16), match["opcode"], match["rest"])
        for match in map(INSTRUCTION.match, sass.splitlines())
        if match
    ]


def innermost_loops(sass: str) -> list[Loop]:
    """The loops that hold no other loop: each branch back to an earlier address closes one (the branch to
    itself that pads every kernel after its EXIT is never reached, and no loop)."""
    code = instructions(sass)
    index = {address: at for at, (address, _, _) in enumerate(code)}
    loops = []
    for at, (address, opcode, operands) in enumerate(code):
        target = re.search(r"0x([0-9a-f]+)", operands)
        start = int(target[1], 16) if target else None
        if opcode == "BRA" and start is not None and start < address and start in index:
            body = code[index[start] : at + 1]
            loops.append(Loop(body[0][0], address, collections.Counter(opcode for _, opcode, _ in body)))
    return [loop for loop in loops if not any(loop.holds(other) for other in loops)]


@dataclass(frozen=True)
class Compiled:
    kv_dtype: str
    settings: dict  # the cache dtype's entry of _LAUNCH, with --launch over it
    launch: dict  # the keywords decode_attention launched the kernel with
    registers: int
    stack_bytes: int
    loops: list[Loop]

    @property
    def values_per_iteration(self) -> int:
        """The cache values a thread reads in an iteration of the tile loop: a tile's keys and values."""
        return 2 * self.launch["TILE"] * self.launch["DIM"] // (32 * self.launch["num_warps"])


@contextlib.contextmanager
def recorded_launch() -> Iterator[dict]:
    """``decode_attention``'s launch of its split kernel recorded, not run: its JIT function, arguments
    and keywords in the dict yielded."""
    attend, merge = attention._kernels()
    call: dict = {}

    class Recorder:
        def __init__(self, function):
            self.function = function

        def __getitem__(self, grid):
            def record(*arguments, **keywords):
                call.setdefault("launch", (self.function, arguments, keywords))

            return record

    with mock.patch.object(attention, "_kernels", lambda: (Recorder(attend), Recorder(merge))):
        yield call


def compile_for(
    kv_dtype: str, launch: dict, arch: int, rows: int, heads: int, dim: int, context: int, folder: Path
) -> Compiled:
    """Compile the split kernel as ``decode_attention`` would launch it, for ``sm_{arch}``; read its SASS."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    dtype = KV_DTYPES[kv_dtype]
    size = min(dtype.itemsize, 2)
    settings = {**attention._LAUNCH[size], **launch}
    # ChatTTS's GPT gives every head its own keys and values.
    meta = torch.device("meta")
    rotary = torch.empty(2, context, dim, dtype=torch.bfloat16, device=meta)  # the runner's table on a GPU
    inputs = attention_inputs_of(heads, heads, dim, rows, context, dtype, meta, torch.Generator(), rotary)
    with launch_settings(size, settings), recorded_launch() as call:
        attention.decode_attention(**inputs)
    function, arguments, keywords = call["launch"]
    target = GPUTarget("cuda", arch, 32)
    backend = CUDABackend(target)
    binder = create_function_from_signature(function.signature, function.params, backend)
    bound, specialization, options = binder(*arguments, **keywords)
    options, signature, constexprs, attrs = function._pack_args(backend, keywords, bound, specialization, options)
    kernel = triton.compile(
        triton.compiler.ASTSource(function, signature, constexprs, attrs), target=target, options=options.__dict__
    )
    cubin = folder / f"{kv_dtype}.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    tools = Path(triton.backends.nvidia.__file__).parent / "bin"
    usage = subprocess.run([tools / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True, check=True)
    sass = subprocess.run([tools / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True)
    resources = dict(re.findall(r"(REG|STACK):(\d+)", usage.stdout))
    return Compiled(
        kv_dtype,
        settings,
        keywords,
        int(resources["REG"]),
        int(resources["STACK"]),
        innermost_loops(sass.stdout),
    )


def parse_launch(text: str) -> dict:
    """``TILE=32,num_warps=1`` as {"TILE": 32, "num_warps": 1} (True/False as booleans)."""
    launch = {}
    for assignment in filter(None, text.split(",")):
        name, _, value = assignment.partition("=")
        launch[name] = value == "True" if value in ("True", "False") else int(value)
    return launch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-dtypes", default="bf16,fp8", help="Cache dtypes, comma-separated: bf16, fp8.")
    parser.add_argument("--launch", type=parse_launch, default={}, help="Launch settings over _LAUNCH's.")
    parser.add_argument("--arch", type=int, default=90, help="The GPU's compute capability, as 90 for sm_90a.")
    parser.add_argument("--rows", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=12, help="ChatTTS's GPT: 12 heads of 64.")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--context", type=int, default=2464, help="Positions a slot's table covers.")
    parser.add_argument("--opcodes", type=int, default=8, help="The loop's most frequent opcodes shown.")
    arguments = parser.parse_args(argv)

    print(f"sm_{arguments.arch}, {arguments.rows} rows of {arguments.heads} heads, tables of {arguments.context}")
    print(
        "| kv cache | launch | registers | stack bytes | innermost loops (instructions) | a value | a byte "
        "| the tile loop's opcodes |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as folder:
        for kv_dtype in arguments.kv_dtypes.split(","):
            compiled = compile_for(
                kv_dtype,
                arguments.launch,
                arguments.arch,
                arguments.rows,
                arguments.heads,
                arguments.dim,
                arguments.context,
                Path(folder),
            )
            tile_loop = max(compiled.loops, key=lambda loop: loop.instructions)
            launch = ", ".join(f"{name}={value}" for name, value in compiled.settings.items() if name != "num_stages")
            common = tile_loop.opcodes.most_common(arguments.opcodes)
            opcodes = " ".join(f"{opcode} {count}" for opcode, count in common)
            print(
                f"| {kv_dtype} | {launch} | {compiled.registers} | {compiled.stack_bytes} "
                f"| {', '.join(str(loop.instructions) for loop in compiled.loops)} "
                f"| {tile_loop.instructions / compiled.values_per_iteration:.2f} "
                f"| {tile_loop.instructions / compiled.values_per_iteration / KV_DTYPES[kv_dtype].itemsize:.2f} "
                f"| {opcodes} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
