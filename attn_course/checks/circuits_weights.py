"""Check chapter 11's exercises that read a head off its weights: the K-composition score of a layer-1 head
reading a layer-0 head, and the classmate's copying score fixed.

Both take weights in the course's row convention (``q = x @ W_Q``, a head writes ``z @ W_O``): random heads of
several sizes drawn by a private generator, heads built with the eigenvalues a case needs, and the cached
seed-0 model's. The references are written out here in float64, not :mod:`attn_course.circuits`, which the
answers may not call.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.circuits import cached_model
from attn_course.checks.diagnosis import CheckFailed, call_answer, number, watched
from attn_course.checks.forbidden import forbid

__all__ = ["check_k_composition", "check_fixed_copying_score"]

#: What the K-composition exercise may not call: the course's composition scores and their matrices.
COMPOSITION_RULES = forbid("the exercise is to write the composition score from the weights yourself",
                           *(f"attn_course.circuits.composition.{name}" for name in
                             ("composition_score", "composition_scores", "qk_matrix", "ov_matrix",
                              "random_composition_baseline")))
#: What the copying exercise may not call: the course's OV circuit and its copying scores.
COPYING_RULES = forbid("the exercise is to read the eigenvalues yourself",
                       *(f"attn_course.circuits.ov_circuit.{name}" for name in
                         ("full_ov_circuit", "copying_scores", "CopyingScores")))

NOT_A_NUMBER = "Your score should be one number (a float or a 0-dim tensor), got {type}."

# --- K-composition ----------------------------------------------------------------------------------------------

Q_COMPOSITION = ("Your score is ‖W_OV @ W_QK‖ / (‖W_QK‖ ‖W_OV‖): the writer's output in the reader's *queries*, "
                 "(x_i + y W_OV) W_QK x_jᵀ, Q-composition (the same number comes from W_QK built as W_K @ W_Q.T, "
                 "which swaps query and key). K-composition puts it in the keys: x_i W_QK (y W_OV)ᵀ.")
NO_TRANSPOSE = ("Your score is ‖W_QK @ W_OV‖ / (…): the paper's W_QK W_OV, written in its column convention. In "
                "the course's rows the writer adds y W_OV to the key, and the key enters the score transposed: "
                "x_i W_QK (y W_OV)ᵀ.")
PAPER_Q = ("Your score is ‖W_QKᵀ @ W_OV‖ / (…) (the same as ‖W_OVᵀ @ W_QK‖): the paper's Q-composition formula, "
           "copied in its column convention. Write where the writer's output enters the reader's score, "
           "x_i W_QK (y W_OV)ᵀ, and read the matrix off that.")
OV_ORDER = ("You built the writer's matrix as W_O @ W_V: that is [d, E] @ [E, d] = [d, d], and it only fitted here "
            "because this head is as wide as the stream (d = E = {d}). The head writes (y @ W_V) @ W_O, so its "
            "matrix is W_V @ W_O, [E, d] @ [d, E] = [E, E].")
NOT_NORMALISED = ("Your score is ‖W_QK @ W_OV.T‖ itself, {got:.4g}: divide it by ‖W_QK‖ ‖W_OV‖, so that the score "
                  "says how much the two line up, whatever their sizes (at most 1).")
SPECTRAL = ("Your score uses spectral norms (the largest singular value, ord=2): the composition score is "
            "Frobenius norms throughout, torch.linalg.matrix_norm's default ('fro').")
FACTOR_NORMS = ("You divided by the norms of the four factors, ‖W_Q‖ ‖W_K‖ ‖W_V‖ ‖W_O‖: divide by the norms of the "
                "two matrices that compose, ‖W_QK‖ ‖W_OV‖.")
KEY_ONLY = ("Your score lines the writer's output up with the reader's W_K alone: the reader scores with "
            "W_QK = W_Q @ W_K.T, and the composition is of W_QK with W_OV.")
COMPOSITION_WRONG = ("Your score for {case} is {got:.4f}; expected {expected:.4f} (the reader's W_Q, W_K "
                     "{reader}, the writer's W_V {v}, W_O {o}).")


def _fro(matrix: torch.Tensor) -> float:
    return torch.linalg.matrix_norm(matrix).item()


def _spectral(matrix: torch.Tensor) -> float:
    return torch.linalg.matrix_norm(matrix, ord=2).item()


def _composition(w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor) -> tuple[float, list]:
    """(the K-composition score, ``(message, what that mistake gives)`` pairs), in float64."""
    w_q, w_k, w_v, w_o = (w.double() for w in (w_q, w_k, w_v, w_o))
    qk, ov = w_q @ w_k.T, w_v @ w_o                                                   # [E, E] each
    norms = _fro(qk) * _fro(ov)
    mistakes = [(Q_COMPOSITION, _fro(ov @ qk) / norms), (NO_TRANSPOSE, _fro(qk @ ov) / norms),
                (PAPER_Q, _fro(qk.T @ ov) / norms), (NOT_NORMALISED, _fro(qk @ ov.T)),
                (SPECTRAL, _spectral(qk @ ov.T) / (_spectral(qk) * _spectral(ov))),
                (SPECTRAL, _fro(qk @ ov.T) / (_spectral(qk) * _spectral(ov))),
                (FACTOR_NORMS, _fro(qk @ ov.T) / (_fro(w_q) * _fro(w_k) * _fro(w_v) * _fro(w_o))),
                (KEY_ONLY, _fro(ov @ w_k) / (_fro(ov) * _fro(w_k)))]
    if w_o.shape[0] == w_o.shape[1]:                                                  # d = E: W_O @ W_V fits
        swapped = w_o @ w_v
        below = _fro(qk) * _fro(swapped)
        mistakes += [(OV_ORDER.format(d=w_o.shape[0]), _fro(m) / below)
                     for m in (qk @ swapped.T, qk @ swapped, swapped @ qk)]
    return _fro(qk @ ov.T) / norms, mistakes


def _close(got: float, expected: float, atol: float = 1e-6, rtol: float = 1e-4) -> bool:
    return math.isfinite(got) and abs(got - expected) <= atol + rtol * abs(expected)


#: (E, d, dtype) of the random pairs: a head as wide as the stream first (where W_O @ W_V has a shape that fits),
#: then narrower ones, in float64 and float32.
COMPOSITION_SIZES = ((6, 6, torch.float64), (10, 3, torch.float64), (16, 4, torch.float32))


def _composition_cases(generator: torch.Generator):
    """(what the pair is, W_Q, W_K, W_V, W_O): random pairs, then every pair of the cached seed-0 model, a
    layer-0 writer into a layer-1 reader."""
    for width, d, dtype in COMPOSITION_SIZES:
        factors = torch.randn(4, width, d, generator=generator, dtype=torch.float64).to(dtype)
        yield f"random weights (E = {width}, d = {d})", factors[0], factors[1], factors[2], factors[3].T.contiguous()
    model = cached_model()
    for writer in range(model.config.n_heads):
        for reader in range(model.config.n_heads):
            yield (f"seed 0's cached model, layer-0 head {writer} into layer-1 head {reader}",
                   model.W_Q(1)[reader].clone(), model.W_K(1)[reader].clone(),
                   model.W_V(0)[writer].clone(), model.W_O(0)[writer].clone())


def check_k_composition(composition_fn: Callable, *, seed: int = 0) -> bool:
    """Check ``fn(W_Q, W_K, W_V, W_O) -> float``: Elhage et al.'s K-composition score of a reader head (its
    ``W_Q``, ``W_K`` ``[E, d]``) reading what a writer head (its ``W_V [E, d]``, ``W_O [d, E]``) wrote, in the
    course's row convention: ``‖W_QK @ W_OVᵀ‖_F / (‖W_QK‖_F ‖W_OV‖_F)`` with ``W_QK = W_Q @ W_Kᵀ`` and
    ``W_OV = W_V @ W_O``. Tried on random heads (one as wide as the stream, narrower ones, float64 and float32) and
    on every layer-0 head of the cached seed-0 model against every layer-1 head.

    Raises:
        TypeError: ``composition_fn`` not callable.
        CheckFailed: naming Q-composition (or W_QK transposed), the paper's column-convention product, the
            paper's Q-composition formula, W_O @ W_V, no normalisation, spectral norms, the factors' norms,
            W_K alone, an answer that is not one number, a forbidden call, or the first pair that differs.

    Example (a wrong answer, and what it is told):
        >>> check_k_composition(lambda W_Q, W_K, W_V, W_O: torch.linalg.matrix_norm(W_Q @ W_K.T @ (W_V @ W_O).T))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your score is ‖W_QK @ W_OV.T‖ itself, ...
    """
    where = "check_k_composition"
    composition_fn = watched(where, composition_fn, COMPOSITION_RULES)
    generator = torch.Generator().manual_seed(seed)
    for case, w_q, w_k, w_v, w_o in _composition_cases(generator):
        expected, mistakes = _composition(w_q, w_k, w_v, w_o)
        described = (f"W_Q and W_K of shape {list(w_q.shape)}, W_V {list(w_v.shape)} and W_O {list(w_o.shape)} "
                     f"({w_q.dtype})")
        got = number(call_answer(where, composition_fn, w_q, w_k, w_v, w_o, described=described), NOT_A_NUMBER)
        if _close(got, expected):
            continue
        for message, wrong in mistakes:
            if _close(got, wrong):
                raise CheckFailed(message.format(got=got))
        raise CheckFailed(COMPOSITION_WRONG.format(case=case, got=got, expected=expected, reader=list(w_q.shape),
                                                   v=list(w_v.shape), o=list(w_o.shape)))
    return True


# --- the copying score, fixed -------------------------------------------------------------------------------------

CLASSMATE = ("This is the classmate's score, unchanged: {got:.3f} for a head whose share is {expected:.3f}. It "
             "counts every one of the V = {V} eigenvalues of the V × V circuit. How many of them can be nonzero, "
             "when the circuit passes through a head of d = {d} dimensions?")
OVER_V = ("Your share counts all V = {V} eigenvalues of the V × V circuit ({got:.3f}, a multiple of 1/{V}): the "
          "circuit's rank is at most d = {d}, so V − d of them are round-off zeros, with signs that mean nothing. "
          "Leave them out.")
ABS = ("Your share is 1 for a head with negative eigenvalues: |λ| > 0 holds for every nonzero eigenvalue. Copying "
       "is about the sign of the real part, Re λ > 0.")
COUNT = ("Your answer is a count, {got:g} eigenvalues; the score is their share: the count divided by the number "
         "of nonzero eigenvalues.")
RATIO = ("Your score is Σλ / Σ|λ|, the chapter's other summary of the spectrum (the positivity ratio); this "
         "exercise asks for the share of the nonzero eigenvalues whose real part is positive.")
NEGATIVE = "Your share counts the eigenvalues with a negative real part; a copying head's are positive, Re λ > 0."
RANK_SHARE = ("Your number is the share of the V = {V} eigenvalues that are nonzero, {n}/{V}: how many are "
              "nonzero, not how many of those are positive.")
EIGVALSH = ("You used torch.linalg.eigvalsh, which assumes a symmetric matrix and reads only its lower triangle; "
            "the circuit is not symmetric. torch.linalg.eigvals gives its eigenvalues (complex in general: read "
            "their real parts).")
SYMMETRIC_PART = ("Your share reads the eigenvalues of the symmetric part, (M + Mᵀ) / 2, not those of the circuit "
                  "M itself (torch.linalg.eigvals, real parts).")
TOO_TOLERANT = ("Your tolerance drops real eigenvalues: this head's {dropped} smallest (down to {smallest:.3g}, "
                "{ratio:.1e} of the largest) are far above round-off, which is about 1e-7 of the largest in float32 "
                "and 1e-16 in float64. Leave out only what round-off makes.")
ROUND_OFF = ("Your share counts round-off zeros too ({got:.3f}, a share over {kept} more eigenvalues than this head's "
             "{n} nonzero ones): your tolerance lets them through. Round-off comes out at about 1e-7 of the largest "
             "eigenvalue in float32, more in a V × V product.")
COPYING_WRONG = ("Your score for {case} is {got:.4f}; expected {expected:.4f}: {positive} of its {n} nonzero "
                 "eigenvalues have a positive real part.")


def _share_positive(eigenvalues: torch.Tensor) -> float:
    return (eigenvalues.real > 0).double().mean().item()


def _copying(w_e: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor, w_u: torch.Tensor) -> tuple[float, list, dict]:
    """(the share of the full OV circuit's nonzero eigenvalues with a positive real part, ``(mistake, message, what
    it gives)`` triples, the facts the messages name). In float64 from the d × d product ``W_O W_U W_E W_V``,
    whose eigenvalues are the V × V circuit's nonzero ones (a cyclic permutation)."""
    classmate = _classmate(w_e, w_v, w_o, w_u)                                        # in the inputs' dtype
    w_e, w_v, w_o, w_u = (w.double() for w in (w_e, w_v, w_o, w_u))
    vocab, d = w_e.shape[0], w_v.shape[1]
    eigenvalues = torch.linalg.eigvals(w_o @ w_u @ w_e @ w_v)                          # [d] complex
    eigenvalues = eigenvalues[eigenvalues.abs() > 1e-9 * eigenvalues.abs().max()]       # round-off out
    n, positive = len(eigenvalues), int((eigenvalues.real > 0).sum())
    circuits = (w_e @ w_v @ w_o @ w_u, w_v @ w_o @ w_u @ w_e, w_o @ w_u @ w_e @ w_v)   # V × V, E × E, d × d
    mistakes = [("classmate", CLASSMATE, classmate), ("abs", ABS, 1.0), ("count", COUNT, float(positive)),
                ("ratio", RATIO, (eigenvalues.sum().real / eigenvalues.abs().sum()).item()),
                ("negative", NEGATIVE, (eigenvalues.real < 0).double().mean().item()),
                ("rank", RANK_SHARE, n / vocab),
                *(("eigvalsh", EIGVALSH, _share_positive(torch.linalg.eigvalsh(m))) for m in circuits),
                *(("symmetric", SYMMETRIC_PART, _share_positive(torch.linalg.eigvalsh((m + m.T) / 2)))
                  for m in circuits)]
    by_size = eigenvalues[eigenvalues.abs().argsort()]                                 # smallest first
    for dropped in range(1, n - 1):                                                    # at least two kept
        smallest = by_size[dropped - 1].abs().item()
        message = TOO_TOLERANT.format(dropped=dropped, smallest=smallest, ratio=smallest / by_size[-1].abs().item())
        mistakes.append(("tolerance", message, _share_positive(by_size[dropped:])))
    return positive / n, mistakes, {"V": vocab, "d": d, "n": n, "positive": positive}


def _copying_mistakes(got: float, mistakes: list, facts: dict) -> list[tuple[str, str]]:
    """``(mistake, message)`` of each known mistake that gives ``got`` on this head, in order: those listed, then a
    share over all V eigenvalues, then one over some of the round-off zeros too."""
    found = [(key, message) for key, message, wrong in mistakes if _close(got, wrong)]
    vocab, n, positive = facts["V"], facts["n"], facts["positive"]
    if _close(got * n, round(got * n)):                         # a share over the nonzero ones: none of these
        return found
    if _close(got * vocab, round(got * vocab)):
        found.append(("over V", OVER_V))
    for kept in range(1, vocab - n):                                                   # some round-off zeros counted
        count = got * (n + kept)
        if _close(count, round(count)) and positive <= round(count) <= positive + kept:
            found.append(("round-off", ROUND_OFF.replace("{kept}", str(kept))))
            break
    return found


def _classmate(w_e: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor, w_u: torch.Tensor) -> float:
    """The classmate's score, as the notebook shows it (in the inputs' dtype)."""
    circuit = w_e @ w_v @ w_o @ w_u                                                    # [V, V]
    return (torch.linalg.eigvals(circuit).real > 0).float().mean().item()


def _built_head(eigenvalues: tuple[float, ...], vocab: int, width: int, generator: torch.Generator) -> tuple:
    """``(W_E, W_V, W_O, W_U)`` float64 of a head whose nonzero circuit eigenvalues are ``eigenvalues``: random
    ``W_E``, ``W_V``, ``W_U``, and ``W_O`` solved so that ``W_O (W_U W_E W_V) = P diag(λ) P⁻¹``."""
    d = len(eigenvalues)
    w_e = torch.randn(vocab, width, generator=generator, dtype=torch.float64)
    w_v = torch.randn(width, d, generator=generator, dtype=torch.float64) / math.sqrt(width)
    w_u = torch.randn(width, vocab, generator=generator, dtype=torch.float64) / math.sqrt(width)
    basis = torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(d, d, generator=generator, dtype=torch.float64)
    target = basis @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ torch.linalg.inv(basis)
    w_o = target @ torch.linalg.pinv(w_u @ w_e @ w_v)                                  # [d, E]
    return w_e, w_v, w_o, w_u


def _random_head(vocab: int, width: int, d: int, generator: torch.Generator) -> tuple:
    """A random head ``(W_E, W_V, W_O, W_U)`` float64 whose circuit has eigenvalues of both signs, none near 0."""
    while True:
        w_e = torch.randn(vocab, width, generator=generator, dtype=torch.float64)
        w_v, w_u = (torch.randn(*shape, generator=generator, dtype=torch.float64) / math.sqrt(width)
                    for shape in ((width, d), (width, vocab)))
        w_o = torch.randn(d, width, generator=generator, dtype=torch.float64) / math.sqrt(d)
        eigenvalues = torch.linalg.eigvals(w_o @ w_u @ w_e @ w_v)
        if 0 < _share_positive(eigenvalues) < 1 and eigenvalues.abs().min() > 1e-3 * eigenvalues.abs().max():
            return w_e, w_v, w_o, w_u


#: Built heads: (eigenvalues, V, E). A rank-3 copier, which scores 1, then large eigenvalues of both signs and two
#: small real ones (where each mistake gives a share of its own).
BUILT_HEADS = (((3.0, 2.0, 0.5), 20, 10), ((5.0, -4.0, 1.0, 0.01, -0.02), 13, 7))
#: Random heads: (V, E, d, dtype).
RANDOM_HEADS = ((11, 7, 4, torch.float64), (9, 6, 6, torch.float64), (30, 12, 5, torch.float32))


def _copying_cases(generator: torch.Generator):
    """(what the head is, W_E, W_V, W_O, W_U): built heads, random heads, then every head of the cached seed-0
    model (float32) whose eigenvalues are all clear of round-off."""
    for eigenvalues, vocab, width in BUILT_HEADS:
        yield f"a head built with eigenvalues {list(eigenvalues)}", *_built_head(eigenvalues, vocab, width, generator)
    for vocab, width, d, dtype in RANDOM_HEADS:
        head = _random_head(vocab, width, d, generator)
        yield f"a random head (V = {vocab}, E = {width}, d = {d})", *(w.to(dtype) for w in head)
    model = cached_model()
    for layer in range(model.config.n_layers):
        for head in range(model.config.n_heads):
            w_e, w_v, w_o, w_u = (model.W_E.clone(), model.W_V(layer)[head].clone(), model.W_O(layer)[head].clone(),
                                  model.W_U.clone())
            eigenvalues = torch.linalg.eigvals((w_o @ w_u @ w_e @ w_v).double()).abs()     # [d]
            if eigenvalues.min() > 1e-4 * eigenvalues.max():
                yield f"seed 0's cached model, layer {layer}, head {head}", w_e, w_v, w_o, w_u


def check_fixed_copying_score(copying_fn: Callable, *, seed: int = 0) -> bool:
    """Check ``fn(W_E [V, E], W_V [E, d], W_O [d, E], W_U [E, V]) -> float``: the share of the nonzero eigenvalues
    of the head's full OV circuit ``W_E @ W_V @ W_O @ W_U`` whose real part is positive (the classmate's score
    counted all ``V``, round-off zeros included). Tried on built heads (eigenvalues of both signs, small ones among
    them; a rank-3 copier, which scores 1), random heads in float64 and float32, and the cached seed-0 model's.

    Raises:
        TypeError: ``copying_fn`` not callable.
        CheckFailed: naming the classmate's code unchanged (or any count over all V), ``|λ|`` for ``Re λ``, a
            count, ``Σλ / Σ|λ|``, the negative share, the rank's share, ``eigvalsh``, the symmetric part, a
            tolerance that drops real eigenvalues, an answer that is not one number, a forbidden call, or the
            first head that differs.

    Example (a wrong answer, and what it is told):
        >>> check_fixed_copying_score(lambda W_E, W_V, W_O, W_U: 1.0)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your share is 1 for a head with negative eigenvalues: ...
    """
    where = "check_fixed_copying_score"
    copying_fn = watched(where, copying_fn, COPYING_RULES)
    generator = torch.Generator().manual_seed(seed)
    suspects, first = None, {}             # the mistakes that gave every answer since the first wrong one
    for case, w_e, w_v, w_o, w_u in _copying_cases(generator):
        expected, mistakes, facts = _copying(w_e, w_v, w_o, w_u)
        described = (f"W_E {list(w_e.shape)}, W_V {list(w_v.shape)}, W_O {list(w_o.shape)}, W_U {list(w_u.shape)} "
                     f"({w_e.dtype})")
        got = number(call_answer(where, copying_fn, w_e, w_v, w_o, w_u, described=described), NOT_A_NUMBER)
        if suspects is None and _close(got, expected):
            continue
        found = _copying_mistakes(got, mistakes, facts)
        if suspects is None:               # the first wrong answer: which mistakes give it?
            if not found:
                raise CheckFailed(COPYING_WRONG.format(case=case, got=got, expected=expected, **facts))
            suspects, first = found, dict(facts, got=got, expected=expected)
        else:                              # shares over V are multiples of 1/V: the next heads tell them apart
            keys = {key for key, _ in found}
            suspects = [suspect for suspect in suspects if suspect[0] in keys] or suspects[:1]
        if len(suspects) == 1:
            break
    if suspects is not None:
        raise CheckFailed(suspects[0][1].format(**first))
    return True
