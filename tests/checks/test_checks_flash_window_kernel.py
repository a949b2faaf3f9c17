"""Chapter 07's find-the-bug check: the causal one-program kernel after a KV cache."""

from __future__ import annotations

from attn_course.flash import use_interpreter_without_gpu

use_interpreter_without_gpu()     # as the chapter's first cell: before Triton is imported, these kernels too

import pytest  # noqa: E402
import torch  # noqa: E402

from attn_course import causal_mask  # noqa: E402
from attn_course.checks.diagnosis import CheckFailed  # noqa: E402
from attn_course.checks.flash_causal_kernel import check_causal_kernel, masked_attention  # noqa: E402
from attn_course.flash.small_kernel import launch_small_attention  # noqa: E402

from support.planted.planted_07 import causal_kernel_with  # noqa: E402

# The causal condition of each variant: the solution, and the planted mistakes of the exercise.
RULES = {
    "bottom-right": "cols[None, :] <= rows[:, None] + (n_k - N_Q)",
    "top-left": "cols[None, :] <= rows[:, None]",
    "strict": "cols[None, :] < rows[:, None] + (n_k - N_Q)",
    "none": "cols[None, :] >= 0",
}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Each variant written to a file and imported: Triton reads a kernel's source from its file."""
    import importlib.util

    folder = tmp_path_factory.mktemp("kernels")
    found = {}
    for rule, condition in RULES.items():
        path = folder / f"causal_{rule.replace('-', '_')}.py"
        path.write_text("import triton\nimport triton.language as tl\n\n\n" + causal_kernel_with(condition))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found[rule] = module.fixed_causal_kernel
    return found


def test_the_reference_is_sdpa_under_the_course_causal_mask():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 8, generator=generator, dtype=torch.float64) for n in (5, 9, 9))
    mask = causal_mask(5, 9)                                              # bottom-right, as after a cache
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    i, j = torch.arange(5)[:, None], torch.arange(9)[None, :]
    torch.testing.assert_close(masked_attention(q, k, v, j <= i + 4), expected)


def test_the_solution_passes(kernels):
    assert check_causal_kernel(kernels["bottom-right"]) is True
    out, _ = launch_small_attention(kernels["bottom-right"], *(torch.randn(n, 16) for n in (16, 50, 50)))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(("rule", "hint"), [
    ("top-left", "aligns the causal mask top-left"),
    ("strict", "the diagonal hidden"),
    ("none", "applies no causal mask"),
])
def test_each_wrong_mask_gets_its_diagnosis(kernels, rule, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_causal_kernel(kernels[rule])


def test_a_function_that_is_not_a_kernel_is_refused():
    with pytest.raises(CheckFailed, match="kernel must be a @triton.jit function"):
        check_causal_kernel(lambda *args: None)

