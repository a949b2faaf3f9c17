"""The cached runs: they load, they are what tools/train_induction_heads.py makes (to round-off, on a prefix), and
the trained model has the circuit the chapter describes."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from attn_course.circuits import (
    InductionSetup,
    ablate_head,
    phase_change_step,
    span_loss,
    train_induction_model,
)
from attn_course.circuits.rhymes import RhymesSetup, rhymes_tokenizer
from attn_course.circuits.trained import (
    HISTORIES,
    load_model,
    load_rhymes_model,
    load_trained,
    trained_folder,
    trained_histories,
    trained_seeds,
)
from attn_course.circuits.training import state_digest


def test_the_cache_is_small_and_has_at_least_five_seeds():
    sizes = {path.name: path.stat().st_size for path in trained_folder().iterdir() if path.is_file()}
    assert HISTORIES in sizes and sum(sizes.values()) < 2 * 2**20, sizes
    assert len(trained_histories()) >= 5 and 0 in trained_seeds()


def test_the_cache_was_made_with_todays_setups():
    made = json.loads((trained_folder() / HISTORIES).read_text())
    assert made["setup"]["induction"] == dataclasses.asdict(InductionSetup())
    assert made["setup"]["rhymes"] == dataclasses.asdict(RhymesSetup())
    assert all(h["setup"] == dataclasses.asdict(InductionSetup()) for h in trained_histories().values())


def test_cached_weights_are_the_last_step_of_their_history():
    for seed in trained_seeds():
        assert state_digest(load_trained(seed)) == trained_histories()[seed]["digests"][-1]
    for seed in trained_seeds("rhymes"):
        assert state_digest(load_rhymes_model(seed)) == trained_histories("rhymes")[seed]["digests"][-1]
    assert load_rhymes_model().config.vocab_size == rhymes_tokenizer().vocab_size


def test_retraining_the_first_hundred_steps_of_seed_0_gives_the_cached_history():
    # Bit for bit on the kind of CPU that made the cache; another CPU's vectorised kernels (ATen's, MKL's) round
    # differently (on an AMD EPYC, ATen's AVX-512 kernels gave 4.0905962 nats at step 25 against the cached
    # 4.0905952), so the recorded numbers are compared to round-off, and the weights' digests where no kernel
    # has run yet: the seeded start. That holds on ATen's AVX2 and AVX-512 paths; its scalar default path
    # (ATEN_CPU_CAPABILITY=default, as make test-other-cpu-path sets on an AVX2 CPU) draws the normal
    # initialisation with other math functions, equal only to round-off, which the step-0 losses check.
    cached = trained_histories()[0]
    every = cached["steps"][1]
    _, fresh = train_induction_model(0, steps=4 * every, record_every=every)
    fresh = json.loads(json.dumps(fresh.as_dict()))                     # as the cache stores it
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        assert fresh["digests"][0] == cached["digests"][0]
    def numbers(values):                                                # None (not measured) as NaN
        return torch.tensor(json.loads(json.dumps(values).replace("null", "NaN")), dtype=torch.float64)

    for name, values in fresh.items():
        if isinstance(values, list) and name != "digests":
            torch.testing.assert_close(numbers(values), numbers(cached[name][:len(values)]), rtol=1e-5, atol=1e-5,
                                       equal_nan=True, msg=name)


def test_an_induction_head_formed_in_every_cached_seed():
    for seed, history in trained_histories().items():
        assert phase_change_step(history) is not None, seed
        assert max(history["induction_scores"][-1][1]) > 0.5, seed
        assert max(history["control_induction_scores"][-1][1]) < 0.15, seed      # on the control: no stripe


def test_ablating_the_previous_token_head_destroys_induction_and_a_bystander_does_not():
    model = load_trained(0)
    setup = InductionSetup()
    batch = setup.evaluation_repeats()
    tokens, repeated = batch.tokens, batch.predictable
    baseline, unrepeated = span_loss(model, tokens, repeated), span_loss(model, batch.control, repeated)
    previous = trained_histories()[0]["previous_token_scores"][-1][0]
    previous_head = max(range(setup.n_heads), key=previous.__getitem__)
    bystander = min(range(setup.n_heads), key=previous.__getitem__)
    for kind in ("zero", "mean"):
        with ablate_head(model, 0, previous_head, kind, mean_over=tokens if kind == "mean" else None):
            broken = span_loss(model, tokens, repeated)
        with ablate_head(model, 0, bystander, kind, mean_over=tokens if kind == "mean" else None):
            untouched = span_loss(model, tokens, repeated)
        assert broken > baseline + 0.6 * (unrepeated - baseline), kind      # most of the way to the unrepeated level
        assert untouched < baseline + 0.1 * (unrepeated - baseline), kind


def test_loading_refuses_what_is_not_there(tmp_path):
    with pytest.raises(ValueError, match="cached seeds"):
        load_trained(999)
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.safetensors")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "bare.safetensors"))
    with pytest.raises(ValueError, match="config"):
        load_model(tmp_path / "bare.safetensors")
    with pytest.raises(ValueError, match="kind"):
        trained_histories("poems")


def test_the_tools_check_tells_the_same_bits_from_round_off_from_a_real_difference(tmp_path):
    from attn_course.models.attention_only import AttentionOnlyTransformer
    from tools import train_induction_heads as tool

    torch.manual_seed(0)
    model = AttentionOnlyTransformer(6, n_layers=1, n_heads=2, d_model=8, max_len=4)
    history = {"seed": 0, "setup": {"d_model": 8}, "steps": [0, 25], "repeated_loss": [4.2, 4.09],
               "train_loss": [None, 4.1], "induction_scores": [[[0.1, 0.2]], [[0.3, 0.4]]], "digests": ["a", "b"]}
    tool.write(tmp_path, {"induction": {"0": history}, "rhymes": {}}, {"induction_seed0": model})

    def checked(change=None, weight=0.0):
        fresh = json.loads(json.dumps(history))
        if change:
            change(fresh)
        other = AttentionOnlyTransformer(6, n_layers=1, n_heads=2, d_model=8, max_len=4)
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            other.unembed.weight[0, 0] += weight
        return tool.check(tmp_path, {"induction": {"0": fresh}, "rhymes": {}}, {"induction_seed0": other})

    assert checked() == ([], 0.0)                                                        # the same bits
    problems, largest = checked(lambda h: h["repeated_loss"].__setitem__(1, 4.09 + 2e-5), weight=1e-5)
    assert problems == [] and 1e-5 <= largest < 3e-5                                     # round-off: within
    problems, _ = checked(lambda h: h["induction_scores"][1][0].__setitem__(0, 0.35))
    assert problems == ["induction seed 0: induction_scores differs from the cache by 0.05"]
    problems, _ = checked(weight=0.01)
    assert len(problems) == 1 and problems[0].startswith("induction_seed0: weights differ")
    problems, _ = checked(lambda h: h["train_loss"].__setitem__(0, 4.2))                # a number where None was
    assert problems and "train_loss" in problems[0]
