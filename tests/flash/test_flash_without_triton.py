"""Where Triton is not installed (macOS, Windows), the package imports and ``flash_attention`` runs the
kernels' algorithm in PyTorch; checked in processes where ``import triton`` fails
(:mod:`support.without_triton`), against SDPA in float64 with the masks written out."""

from __future__ import annotations

from support.without_triton import run_without_triton

KERNEL_MODULES = ["attn_course.flash.kernels", "attn_course.flash.kernels_backward", "attn_course.flash.kernels_tma",
                  "attn_course.flash.one_program_kernel", "attn_course.flash.classmate_window_kernel"]


def test_every_module_but_the_kernels_imports_without_triton(tmp_path):
    out = run_without_triton(f"""
        import importlib, pkgutil, sys
        import attn_course, attn_course_grading, sitecustomize
        from attn_course.flash.triton_mode import triton_installed

        kernels = {KERNEL_MODULES!r}
        for package in (attn_course, attn_course_grading):
            for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                if module.name not in kernels:
                    importlib.import_module(module.name)
        # Not even tried: nothing outside the kernel modules imports Triton when it is imported.
        assert sitecustomize.REFUSED == [] and "triton" not in sys.modules, sitecustomize.REFUSED
        assert not triton_installed()
        for name in kernels:                       # the kernels do need it (and the refusal works)
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as error:
                assert error.name == "triton", error
            else:
                raise AssertionError(name + " imported without Triton")
        print("imported")
    """, tmp_path)
    assert "imported" in out


def test_flash_and_decode_attention_run_the_algorithm_in_pytorch_and_say_so_once(tmp_path):
    out = run_without_triton("""
        import torch
        import torch.nn.functional as F
        from attn_course.flash import decode_attention, flash_attention

        def expected(q, k, v, causal):
            # float64 attention, K and V copied per query head, the bottom-right mask written out.
            group = q.shape[1] // k.shape[1]
            q, k, v = (t.double() for t in (q, k, v))
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            n_q, n_k = q.shape[2], k.shape[2]
            visible = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible if causal else None)

        generator = torch.Generator().manual_seed(0)
        for n_q, n_k, causal, dtype in [(37, 37, False, torch.float32), (37, 37, True, torch.float32),
                                        (5, 300, True, torch.float16), (20, 150, True, torch.float32)]:
            q = torch.randn(2, 4, n_q, 32, generator=generator).to(dtype).requires_grad_()
            k, v = (torch.randn(2, 2, n_k, 32, generator=generator).to(dtype).requires_grad_() for _ in range(2))
            out = flash_attention(q, k, v, causal=causal)
            assert out.dtype == dtype and out.shape == q.shape
            tol = 1e-5 if dtype == torch.float32 else 2e-3
            assert (out.double() - expected(q, k, v, causal)).abs().max() < tol, (n_q, n_k, causal)
            grad_out = torch.randn(out.shape, generator=generator).to(dtype)
            out.backward(grad_out)
            leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
            expected(*leaves, causal).backward(grad_out.double())
            for got, want in zip((q, k, v), leaves):
                assert (got.grad.double() - want.grad).abs().max() < 10 * tol, (n_q, n_k, causal)
        q = torch.randn(1, 8, 4, 64, generator=generator)
        k, v = (torch.randn(1, 2, 1000, 64, generator=generator) for _ in range(2))
        for splits in (1, 4, 7):
            for causal in (False, True):
                got = decode_attention(q, k, v, causal=causal, num_splits=splits)
                assert (got.double() - expected(q, k, v, causal)).abs().max() < 1e-5, (splits, causal)
        print("checked")
    """, tmp_path)
    assert "checked" in out
    assert out.count("Triton is not installed (it ships for Linux), so the kernels' algorithm runs in PyTorch") == 1
