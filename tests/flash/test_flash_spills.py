"""Registers and spills of the FlashAttention kernels, read without a GPU.

:func:`~gpu_tools.resources.resource_usage` re-assembles a kernel's PTX with the ``ptxas`` that
Triton ships and reads its report; its parsing is tested here on captured reports. The slow test
compiles every configuration the launcher or the autotuner can select of the forward and the
two backward kernels for sm_90 (:func:`~gpu_tools.aot.spill_cases`: every head dim,
causal or not, one query head per key/value head and more, float16), the backward's Δ kernel,
the optional atomic-dQ dK/dV kernel and the TMA forward in every candidate kept for an H100/H200,
and fails on any spill: a spilled register lives in local memory, off chip, and is stored and
reloaded on every tile. 116 builds: 265 s here on 2 cores shared with other work, from an empty
Triton cache (the 100 without the TMA forward took about 70 s on an idle machine).
Compilation runs in subprocesses with ``TRITON_INTERPRET=0`` (a process has one Triton mode,
:mod:`attn_course.flash.triton_mode`), two shards in parallel.
"""

import os
import re

import pytest

pytest.importorskip("triton")

from gpu_tools import aot, resources  # noqa: E402

from helpers import run_aot_shards  # noqa: E402

# What ptxas-blackwell 13.4 printed for the dK/dV kernel at d = 64 with a run-time group count.
SPILLING_REPORT = """\
ptxas-blackwell info    : 11 bytes gmem
ptxas-blackwell info    : Compiling entry function 'attention_backward_dkdv_kernel' for 'sm_90a'
ptxas-blackwell info    : Function properties for attention_backward_dkdv_kernel
    72 bytes stack frame, 72 bytes spill stores, 72 bytes spill loads
ptxas-blackwell info    : Used 255 registers, used 1 barriers, 72 bytes cumulative stack size
ptxas-blackwell info    : Compile time = 284.295 ms
"""
# Two entry functions in one report (older ptxas words it "ptxas info"), the second without spills.
TWO_FUNCTIONS_REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'first_kernel' for 'sm_80'
ptxas info    : Function properties for first_kernel
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, 8 bytes cumulative stack size, 544 bytes cmem[0]
ptxas info    : Compiling entry function 'second_kernel' for 'sm_80'
ptxas info    : Function properties for second_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 132 registers, used 1 barriers, 544 bytes cmem[0]
"""


def test_parses_registers_and_spills_of_the_named_function():
    assert resources.parse_ptxas_log(SPILLING_REPORT, "attention_backward_dkdv_kernel") == {
        "registers": 255, "spill_stores": 72, "spill_loads": 72, "stack": 72}
    assert resources.parse_ptxas_log(TWO_FUNCTIONS_REPORT, "second_kernel") == {
        "registers": 132, "spill_stores": 0, "spill_loads": 0, "stack": 0}
    assert resources.parse_ptxas_log(TWO_FUNCTIONS_REPORT, "first_kernel")["spill_stores"] == 4


def test_a_report_without_the_function_or_its_figures_is_refused_by_name():
    with pytest.raises(ValueError, match=r"no register and spill report for 'other_kernel'.*'first_kernel'"):
        resources.parse_ptxas_log(TWO_FUNCTIONS_REPORT, "other_kernel")
    without_registers = SPILLING_REPORT.replace("Used 255 registers", "Used registers")
    with pytest.raises(ValueError, match="ptxas must run with -v"):
        resources.parse_ptxas_log(without_registers, "attention_backward_dkdv_kernel")
    with pytest.raises(ValueError, match=r"functions reported: \[\]"):
        resources.parse_ptxas_log("", "attention_backward_dkdv_kernel")    # what a ptxas without -v prints
    with pytest.raises(TypeError, match="parse_ptxas_log: log must be a str, got bytes"):
        resources.parse_ptxas_log(SPILLING_REPORT.encode(), "attention_backward_dkdv_kernel")
    with pytest.raises(TypeError, match="parse_ptxas_log: kernel_name must be a str, got NoneType"):
        resources.parse_ptxas_log(SPILLING_REPORT, None)


def test_shipped_assemblers_prefer_the_newer_ptxas_for_hopper():
    try:
        hopper, ampere = resources.shipped_assemblers(90), resources.shipped_assemblers(80)
    except FileNotFoundError as error:
        pytest.skip(str(error))
    assert sorted(hopper) == sorted(ampere) and all(os.path.isabs(path) for path in hopper)
    if len(hopper) == 2:
        assert os.path.basename(hopper[0]) == "ptxas-blackwell" and os.path.basename(ampere[0]) == "ptxas"
    with pytest.raises(TypeError, match="shipped_assemblers: capability must be an int, got str"):
        resources.shipped_assemblers("90")
    with pytest.raises(ValueError, match="compute capability times ten"):
        resources.shipped_assemblers(9)


def test_resource_usage_refuses_what_is_not_a_compiled_kernel():
    with pytest.raises(TypeError, match=r"resource_usage: compiled must be a kernel compiled by triton.compile"):
        resources.resource_usage("kernel.ptx")


def test_spill_cases_cover_every_selectable_configuration_with_both_group_counts():
    from attn_course.flash.configs import CONFIGS

    cases = aot.spill_cases()
    assert {case.capability for case in cases} == {90} and {case.groups for case in cases} == {0, 1}
    for kernel in ("forward", "backward_dkdv", "backward_dq"):
        for head_dim in (16, 32, 64, 128):
            for index in range(len(CONFIGS[kernel, head_dim])):
                for causal in (False, True):
                    for groups in (0, 1):
                        assert aot.Case(kernel, index, head_dim, "float16", causal, 90, groups=groups) in cases
    from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs

    for head_dim in (16, 32, 64, 128):
        candidates = tma_forward_configs(head_dim)
        for config in prune_tma_configs(candidates, head_dim, **HOPPER_LIMITS):
            for causal in (False, True):
                assert aot.Case("forward_tma", candidates.index(config), head_dim, "float16", causal, 90) in cases
    assert not [case for case in aot.spill_cases(80) if case.kernel == "forward_tma"]   # TMA is Hopper's
    with pytest.raises(ValueError, match=r"spill_cases: capability must be one of \[80, 90\], got 70"):
        aot.spill_cases(70)


SHARDS = 2
LINE = re.compile(r"(?P<case>.+): shared (?P<shared>\d+) limit \d+ wgmma=\w+ registers (?P<registers>\d+) "
                  r"spill_stores (?P<stores>\d+) spill_loads (?P<loads>\d+) stack (?P<stack>\d+) (?P<verdict>\S+)$")


@pytest.fixture(scope="module")
def sm90_resources():
    return [LINE.match(line) for line in run_aot_shards("--spills", shards=SHARDS)]


@pytest.mark.slow
def test_no_sm90_build_spills(sm90_resources, capsys):
    assert all(sm90_resources), "a line of `python -m gpu_tools.aot --spills` did not parse"
    assert {match["case"] for match in sm90_resources} == {case.name for case in aot.spill_cases()}
    table = [f"{'case':<58} {'registers':>9} {'spill st/ld':>11} {'stack':>5} {'shared':>7}"]
    table += [f"{m['case']:<58} {m['registers']:>9} {m['stores'] + '/' + m['loads']:>11} {m['stack']:>5} "
              f"{m['shared']:>7}" for m in sm90_resources]
    with capsys.disabled():
        print("\n" + "\n".join(table))
    spilling = [m["case"] for m in sm90_resources if int(m["stores"]) or int(m["loads"]) or int(m["stack"])]
    assert not spilling, f"{len(spilling)} sm_90 builds spill registers to local memory: {spilling}"
