"""What attention heads learn (chapter 11): induction heads in an attention-only transformer, found and broken.

- :mod:`~attn_course.circuits.scores`: :func:`previous_token_score`, :func:`induction_score`,
  :func:`duplicate_token_score`;
- :mod:`~attn_course.circuits.recording`: :func:`record_patterns`, :func:`record_head_outputs` through the
  model's hook points;
- :mod:`~attn_course.circuits.losses`: per-token losses, and the mean over a span or a mask of tokens;
- :mod:`~attn_course.circuits.composition`: Elhage et al.'s Q-, K-, V-composition scores and their random baseline;
- :mod:`~attn_course.circuits.ov_circuit`: the full OV circuit ``W_E W_V W_O W_U`` and how much it copies;
- :mod:`~attn_course.circuits.ablation`: :func:`ablate_head` (zero, mean) and :func:`patch_head`;
- :mod:`~attn_course.circuits.training`: :func:`train_induction_model`, its history, the phase-change step, and
  the loop it shares with :mod:`~attn_course.circuits.rhymes`' training on the rhymes;
- :mod:`~attn_course.circuits.trained`: the cached runs, :func:`load_trained`, :func:`trained_histories`.
"""

from attn_course.circuits.ablation import PatchResult, ablate_head, patch_head
from attn_course.circuits.composition import (
    composition_score,
    composition_scores,
    ov_matrix,
    qk_matrix,
    random_composition_baseline,
)
from attn_course.circuits.losses import loss_from_logits, span_loss, token_losses
from attn_course.circuits.ov_circuit import CopyingScores, copying_scores, full_ov_circuit
from attn_course.circuits.recording import record, record_head_outputs, record_patterns
from attn_course.circuits.scores import duplicate_token_score, induction_score, previous_token_score
from attn_course.circuits.training import (
    InductionHistory,
    InductionSetup,
    phase_change_step,
    train_induction_model,
)

__all__ = [
    "previous_token_score", "induction_score", "duplicate_token_score",
    "record", "record_patterns", "record_head_outputs",
    "token_losses", "span_loss", "loss_from_logits",
    "ov_matrix", "qk_matrix", "composition_score", "composition_scores", "random_composition_baseline",
    "full_ov_circuit", "copying_scores", "CopyingScores",
    "ablate_head", "patch_head", "PatchResult",
    "InductionSetup", "InductionHistory", "train_induction_model", "phase_change_step",
]
