"""attn_course.checks.compare: an answer is compared with its reference only once it has the reference's form."""

import pytest
import torch

from attn_course.checks import CheckFailed, check_close
from attn_course.checks.compare import FLOATING, matches, mismatch
from attn_course.checks.diagnosis import call_answer, check_shape, fresh_arguments, same

REFERENCE = torch.tensor([[0.25, 0.75], [0.5, 0.5]])


def test_a_close_answer_matches():
    assert matches(REFERENCE + 1e-7, REFERENCE, atol=1e-6) is True
    assert mismatch(REFERENCE.clone(), REFERENCE) is None


@pytest.mark.parametrize("answer", [
    torch.tensor(0.5),                      # [] against [2, 2]
    torch.full((1, 2), 0.5),                # broadcasts along the rows
    torch.full((2, 1), 0.5),
    torch.full((3, 2, 2), 0.5),             # broadcasts to a batch of the reference
], ids=["scalar", "row", "column", "batch"])
def test_broadcastable_shapes_do_not_match(answer):
    reference = torch.full((2, 2), 0.5)
    assert torch.allclose(answer, reference)               # what a bare allclose says
    assert matches(answer, reference, atol=1e-6) is False
    assert "shape" in mismatch(answer, reference)


@pytest.mark.parametrize("answer", [torch.empty(0), torch.empty(0, 1, 1), torch.empty(2, 0)],
                         ids=["0", "0x1x1", "2x0"])
def test_empty_answers_do_not_match(answer):
    if answer.dim() == 3:
        assert torch.allclose(answer, REFERENCE)            # "all of nothing": attack 6 of issue 31
    assert matches(answer, REFERENCE, atol=1e-6) is False
    assert "is empty" in mismatch(answer, REFERENCE)


def test_an_empty_reference_matches_an_empty_answer():
    assert matches(torch.empty(0, 3), torch.empty(0, 3), atol=0) is True


def test_wrong_dtype_does_not_match_unless_allowed():
    assert matches(REFERENCE.double(), REFERENCE, atol=1e-6) is False
    assert "dtype torch.float64" in mismatch(REFERENCE.double(), REFERENCE)
    assert matches(REFERENCE.double(), REFERENCE, atol=1e-6, dtype=FLOATING) is True
    assert matches(REFERENCE > 0.4, REFERENCE > 0.4, atol=0) is True
    assert matches((REFERENCE > 0.4).float(), REFERENCE > 0.4, atol=0) is False      # 0/1 floats for a mask


class Agreeable(torch.Tensor):
    """A tensor subclass that says yes to every comparison."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs)


def test_a_subclass_does_not_match():
    answer = torch.zeros(2, 2).as_subclass(Agreeable)
    assert torch.allclose(answer, REFERENCE)                # fooled
    assert matches(answer, REFERENCE, atol=1e-6) is False
    assert "subclass" in mismatch(answer, REFERENCE)
    assert matches(torch.nn.Parameter(REFERENCE.clone()), REFERENCE, atol=0) is True


@pytest.mark.parametrize("answer", [(REFERENCE,), [0.25, 0.75], 0.5, None, "0.5"], ids=["tuple", "list", "float",
                                                                                       "None", "str"])
def test_anything_but_a_tensor_does_not_match(answer):
    assert matches(answer, REFERENCE, atol=1.0) is False
    assert "should be a torch.Tensor" in mismatch(answer, REFERENCE)


def test_nan_does_not_match_unless_equal_nan():
    answer, reference = REFERENCE.clone(), REFERENCE.clone()
    answer[0, 0] = reference[0, 0] = float("nan")
    assert matches(answer, REFERENCE, atol=1.0) is False
    assert matches(answer, reference, atol=1e-6) is False
    assert matches(answer, reference, atol=1e-6, equal_nan=True) is True


def test_values_and_tolerances():
    assert matches(REFERENCE + 1e-3, REFERENCE, atol=1e-4) is False
    assert matches(REFERENCE * 1.001, REFERENCE, atol=0, rtol=2e-3) is True
    assert matches(torch.tensor([1, 2]), torch.tensor([1, 3]), atol=5) is False    # integers: exact
    with pytest.raises(ValueError, match="atol"):
        matches(REFERENCE, REFERENCE, atol=-1)
    with pytest.raises(ValueError, match="rtol"):
        matches(REFERENCE, REFERENCE, atol=0, rtol=float("nan"))
    with pytest.raises(TypeError, match="reference"):
        matches(REFERENCE, [0.25], atol=0)
    with pytest.raises(TypeError, match="dtype"):
        matches(REFERENCE, REFERENCE, atol=0, dtype="float32")


def test_a_huge_answer_is_refused_without_allocating():
    # Attack 4 of issue 31: a bare allclose broadcasts [2**18, 1, 1, 1, 1] against the reference and
    # allocates 2**18 times its size. Here a view of 2**40 entries (8 bytes of storage) against [4]:
    # a broadcast comparison would need 2**42 entries (16 TiB) and fail; matches reads none of it.
    answer = torch.ones(1, 1, 1).expand(2**20, 2**20, 1)
    reference = torch.ones(4)
    with pytest.raises(RuntimeError):
        torch.allclose(answer, reference)
    assert matches(answer, reference, atol=1e-6) is False
    assert mismatch(answer, reference) == "Your answer has shape [1048576, 1048576, 1] but should have shape [4]."
    with pytest.raises(CheckFailed, match="shape"):
        check_close(answer, reference)


def test_the_checks_use_it():
    with pytest.raises(CheckFailed, match="shape"):
        check_close(torch.full((1, 2), 0.5), torch.full((2, 2), 0.5))
    with pytest.raises(CheckFailed, match="is empty"):
        check_shape(torch.empty(0), REFERENCE, "Your output")
    with pytest.raises(CheckFailed, match="subclass"):
        check_close(torch.zeros(2, 2).as_subclass(Agreeable), REFERENCE)
    assert same(REFERENCE.double(), REFERENCE)                 # a check's reference may be in another precision
    assert not same(REFERENCE.bool(), REFERENCE)


def test_answers_get_copies_of_their_tensor_arguments():
    x, parts = torch.ones(3), [torch.ones(2), 7]

    def vandal(x, parts):
        x.zero_()
        parts[0].zero_()
        return x

    assert call_answer("test", vandal, x, parts).sum() == 0
    assert x.sum() == 3 and parts[0].sum() == 2
    leaf = torch.ones(2, requires_grad=True)
    (copy,) = fresh_arguments((leaf,))
    assert copy.requires_grad and copy.is_leaf and copy is not leaf
