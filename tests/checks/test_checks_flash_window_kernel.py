"""Chapter 07's find-the-bug check: the one-program sliding-window kernel for decoding."""

from __future__ import annotations

from attn_course.flash import use_interpreter_without_gpu

use_interpreter_without_gpu()     # as the chapter's first cell: before Triton is imported, these kernels too

import inspect  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from attn_course.checks.diagnosis import CheckFailed  # noqa: E402
from attn_course.checks.flash_window_kernel import WINDOW, check_window_kernel, masked_attention  # noqa: E402
from attn_course.flash.classmate_window_kernel import buggy_window_kernel  # noqa: E402
from attn_course.flash.small_kernel import launch_small_attention  # noqa: E402
from attn_course.variants.masks import sliding_window_mask  # noqa: E402

from support.planted.planted_07 import AGAINST_NEW_MAX, VISIBLE, window_kernel_with  # noqa: E402

# Each variant: the solution, the classmate's kernel, and mistakes a fix can make.
VARIANTS = {
    "solution": window_kernel_with(),
    "classmate": window_kernel_with(weights=AGAINST_NEW_MAX),
    "wide": window_kernel_with(visible=VISIBLE.replace("> position[:, None] - window",
                                                       ">= position[:, None] - window")),
    "no window": window_kernel_with(visible=VISIBLE.split(" & (cols[None, :] > ")[0]),
    "positions from 0": window_kernel_with().replace("position = rows + (n_k - N_Q)", "position = rows"),
}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Each variant written to a file and imported: Triton reads a kernel's source from its file."""
    import importlib.util

    folder = tmp_path_factory.mktemp("kernels")
    found = {}
    for name, source in VARIANTS.items():
        path = folder / f"window_{name.replace(' ', '_')}.py"
        path.write_text("import triton\nimport triton.language as tl\n\n\n" + source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found[name] = module.fixed_window_kernel
    return found


def test_the_reference_is_sdpa_under_a_sliding_window_after_a_cache():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 8, generator=generator, dtype=torch.float64) for n in (5, 40, 40))
    i, j = torch.arange(5)[:, None] + 35, torch.arange(40)[None, :]            # queries at positions 35 .. 39
    mask = (j <= i) & (j > i - WINDOW)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(masked_attention(q, k, v, sliding_window_mask(5, 40, window=WINDOW)), expected)
    assert sliding_window_mask(5, 40, window=WINDOW).sum(-1).tolist() == [WINDOW] * 5


def test_the_solution_passes(kernels):
    assert check_window_kernel(kernels["solution"]) is True
    out, _ = launch_small_attention(kernels["solution"], *(torch.randn(n, 16) for n in (16, 90, 90)))
    assert torch.isfinite(out).all()


def test_the_package_keeps_the_classmates_kernel_as_planted():
    """The kernel the chapter lists and runs (attn_course/flash/classmate_window_kernel.py) is the one handed
    in unchanged by the planted students, under its own name."""
    planted = VARIANTS["classmate"].split("\n\n\nfixed_window_kernel = ")[0] + "\n"
    listed = inspect.getsource(buggy_window_kernel.fn)
    assert listed == "@triton.jit\n" + planted.replace("def fixed_window_kernel(", "def buggy_window_kernel(")


@pytest.mark.parametrize("where", ["package", "planted"])
def test_the_classmates_kernel_turns_the_rows_before_the_window_into_nan(kernels, where):
    """The chapter's statement: right with 16 keys, NaN in the last row with 40, in every row with 64."""
    classmate = buggy_window_kernel if where == "package" else kernels["classmate"]
    for n_k, rows in ((16, []), (40, [15]), (64, list(range(16)))):
        out, _ = launch_small_attention(classmate, *(torch.randn(n, 16) for n in (16, n_k, n_k)))
        assert (~torch.isfinite(out)).any(-1).nonzero().flatten().tolist() == rows
    with pytest.raises(CheckFailed, match=r"NaN or inf in rows \[15\]"):
        check_window_kernel(classmate)


@pytest.mark.parametrize(("variant", "hint"), [
    ("wide", "one key too wide"),
    ("no window", "forgets the window"),
    ("positions from 0", "places the queries at positions 0"),
])
def test_each_wrong_mask_gets_its_diagnosis(kernels, variant, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_window_kernel(kernels[variant])


def test_a_function_that_is_not_a_kernel_is_refused():
    with pytest.raises(CheckFailed, match="kernel must be a @triton.jit function"):
        check_window_kernel(lambda *args: None)
