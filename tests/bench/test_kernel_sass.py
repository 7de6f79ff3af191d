"""bench.kernel_sass: the decode attention kernel compiled here for a GPU, its loops counted in its SASS.

Triton compiles for sm_90a without a GPU (its bundled ptxas and cuobjdump ship in its wheel), so these
run the real compiler on the real kernel, as the benchmark does.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from bench.kernel_sass import compile_for, innermost_loops, main, parse_launch  # noqa: E402

# Two loops one inside the other, a third after them, and the branch to itself that ends every kernel
# after its EXIT (never reached); the lines as cuobjdump prints them.
NESTED_SASS = """
        Function : attend_split
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   FFMA R5, R4, R4, R5 ;
        /*0040*/              @!P0 BRA 0x20 ;
        /*0050*/                   FADD R6, R5, R6 ;
        /*0060*/               @P1 BRA 0x10 ;
        /*0070*/                   HFMA2 R7, R7, R7, R7 ;
        /*0080*/                   BRA 0x70 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   BRA 0xa0 ;
"""


def test_innermost_loops_are_those_holding_no_other_loop():
    loops = innermost_loops(NESTED_SASS)

    assert [(loop.first, loop.last) for loop in loops] == [(0x20, 0x40), (0x70, 0x80)]
    assert dict(loops[0].opcodes) == {"LDG": 1, "FFMA": 1, "BRA": 1}
    assert loops[1].instructions == 2


def test_a_launch_reads_as_settings():
    assert parse_launch("TILE=32,num_warps=1,TENSOR_CORES=True") == {"TILE": 32, "num_warps": 1, "TENSOR_CORES": True}
    assert parse_launch("") == {}


@pytest.fixture(scope="module")
def fp8_kernel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cubin")
    return compile_for("fp8", {}, 90, rows=1536, heads=12, dim=64, context=2464, folder=folder)


def test_the_fp8_kernel_compiles_for_sm90_with_its_tile_loop_innermost(fp8_kernel):
    assert 0 < fp8_kernel.registers <= 255
    tile_loop = max(fp8_kernel.loops, key=lambda loop: loop.instructions)
    # The loop loads a tile of keys and values and converts them from fp8: more than one instruction a value.
    assert tile_loop.opcodes["LDG"] > 0 and tile_loop.opcodes["F2FP"] > 0
    assert tile_loop.instructions > fp8_kernel.values_per_iteration
    # A tile of 64 positions x 64 dims, keys and values, over one warp.
    assert fp8_kernel.values_per_iteration == 2 * 64 * 64 // 32


def test_a_launch_setting_changes_what_is_compiled(fp8_kernel, tmp_path):
    half_tile = compile_for("fp8", {"TILE": 32}, 90, rows=1536, heads=12, dim=64, context=2464, folder=tmp_path)

    assert half_tile.values_per_iteration == fp8_kernel.values_per_iteration // 2
    assert max(loop.instructions for loop in half_tile.loops) < max(loop.instructions for loop in fp8_kernel.loops)


def test_the_table_gives_each_cache_dtype_a_row(capsys):
    main(["--kv-dtypes", "bf16,fp8", "--opcodes", "3"])

    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| bf16", "| fp8"))]
    assert [row.split(" | ")[0] for row in rows] == ["| bf16", "| fp8"]
