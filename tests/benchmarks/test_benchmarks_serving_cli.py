"""python -m benchmarks serving --quick: the engine and Hugging Face's static batch on the same requests.

The quick run is small (4 requests, a 2-layer random Llama) but whole: each method's useful tokens and time,
how many requests got the engine's greedy tokens (all of them: Hugging Face's batch is an independent
reference), and the cache's memory against contiguous caches.
"""

from __future__ import annotations

import pytest
from made_up_rows import read_csv

from attn_course.measure.serving import measure_serving, serving_requests
from benchmarks.__main__ import main


def test_main_serving_quick_writes_the_speed_and_memory_rows(tmp_path, capsys):
    assert main(["serving", "--quick", "--out", str(tmp_path)]) == 0
    columns, rows = read_csv(tmp_path / "serving.csv")
    assert columns == ["method", "requests", "useful_tokens", "seconds", "tokens_per_second", "same_as_engine"]
    assert [row["method"] for row in rows] == ["engine", "hf static batch"]
    assert all(row["same_as_engine"] == row["requests"] == "4" for row in rows)
    _, (memory,) = read_csv(tmp_path / "serving-memory.csv")
    peak, per_request, static = (int(memory[name]) for name in ("peak_tokens", "contiguous_per_request_tokens",
                                                                 "static_batch_tokens"))
    assert peak < per_request < static
    assert 0 < float(memory["prefix_hit_rate"]) < 1
    assert "hf static batch" in capsys.readouterr().out


def test_requests_share_the_system_prompt_and_stay_in_bounds():
    prompts, counts = serving_requests(20, 50, system_prompt=5, seed=3)
    assert len({tuple(prompt[:5]) for prompt in prompts}) == 1
    assert all(8 <= len(prompt) <= 69 and 0 < min(prompt) and max(prompt) < 50 for prompt in prompts)
    assert all(4 <= count <= 64 for count in counts)


@pytest.mark.parametrize("options, error, message", [
    (dict(hidden_size=30), ValueError, "hidden_size must be a multiple of 4"),
    (dict(generate_batch=1), TypeError, "generate_batch must be a bool"),
    (dict(requests=0), ValueError, "requests must be >= 1, got 0"),
])
def test_measure_serving_refuses_bad_sizes(options, error, message):
    with pytest.raises(error, match=message):
        measure_serving(**options)
