"""Greedy generation by stepping a reference runner whose cache is explicit and whole-length
(edgebuild.verify.runner_generation): the calls it makes, what it feeds, and what it refuses."""

import numpy as np
import pytest

from edgebuild.bundle.decoding import chunk_lengths
from edgebuild.errors import BuildError
from edgebuild.recipe.generate import GenerateSection, cache_pairs
from edgebuild.verify.runner_generation import RunnerGenerator

VOCAB, CONTEXT = 11, 16


class CountingStep:
    """A decoder step in numpy: writes each fed token at its position of a [1, 1, CONTEXT, 1]
    cache and predicts (sum of the cache up to the token) mod VOCAB; records every call."""

    def __init__(self, position_shape=(), extra=(), cache_rows=CONTEXT, dtype="int32"):
        self.input_specs = {"input_ids": {"shape": [1, 1], "dtype": dtype},
                            "position": {"shape": list(position_shape), "dtype": dtype},
                            "past_key_values.0.key": {"shape": [1, 1, cache_rows, 1], "dtype": "float32"}}
        for name in extra:
            self.input_specs[name] = {"shape": [1, 1], "dtype": dtype}
        self.calls = []

    def __call__(self, feeds):
        self.calls.append({name: np.array(value) for name, value in feeds.items()})
        ids, position = feeds["input_ids"][0], int(np.asarray(feeds["position"]).reshape(()))
        cache = feeds["past_key_values.0.key"].copy()
        logits = np.zeros((1, len(ids), VOCAB), np.float32)
        for offset, token in enumerate(ids):
            cache[0, 0, position + offset, 0] = token
            logits[0, offset, int(cache[0, 0, :position + offset + 1, 0].sum()) % VOCAB] = 1.0
        return {"logits": logits, "present.0.key": cache}


def expected(prompt, new_tokens):
    context, tokens = list(prompt), []
    for _ in range(new_tokens):
        tokens.append(sum(context) % VOCAB)
        context.append(tokens[-1])
    return tokens


def generator(runner, lengths=(1,), cache="auto"):
    section = GenerateSection.model_validate({"max_context": CONTEXT, "query_lengths": list(lengths), "cache": cache})
    return RunnerGenerator(runner, pair=lambda i, o: cache_pairs(section, i, o),
                           chunks=lambda n: chunk_lengths(n, section.describe_lengths()),
                           max_context=CONTEXT, where="step.jaxexport")


@pytest.mark.parametrize("position_shape", [(), (1,)], ids=["0-d", "shape-1"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("prompt", [[3], [1, 2, 3, 4, 5]], ids=["one-token", "five-tokens"])
def test_tokens_positions_and_cache_are_carried_from_call_to_call(position_shape, dtype, prompt):
    runner = CountingStep(position_shape, dtype=dtype)
    tokens, logits = generator(runner).generate(prompt, 4)
    assert tokens == expected(prompt, 4)
    assert logits.shape == (4, VOCAB) and logits.dtype == np.float32
    assert [int(np.asarray(c["position"]).reshape(())) for c in runner.calls] == list(range(len(prompt) + 3))
    for call in runner.calls:
        assert call["position"].shape == position_shape and call["position"].dtype == np.dtype(dtype)
        assert call["input_ids"].shape == (1, 1) and call["input_ids"].dtype == np.dtype(dtype)
    first = runner.calls[0]["past_key_values.0.key"]
    assert first.shape == (1, 1, CONTEXT, 1) and not first.any()  # an empty cache of full length
    last = runner.calls[-1]["past_key_values.0.key"][0, 0, :, 0]
    assert list(last[:len(prompt) + 2]) == prompt + tokens[:2]  # the previous call's present came back


def test_a_fresh_prompt_starts_from_an_empty_cache():
    runner = CountingStep()
    one = generator(runner)
    first, second = one.generate([4, 4], 3)[0], one.generate([4, 4], 3)[0]
    assert first == second == expected([4, 4], 3)


def test_the_prompt_is_fed_in_the_chunks_the_artifact_takes():
    class Chunked(CountingStep):
        def __init__(self):
            super().__init__()
            self.input_specs["input_ids"]["shape"] = [1, 4]

    runner = Chunked()
    tokens, _ = generator(runner, lengths=(1, 4)).generate(list(range(1, 10)), 2)  # 9 tokens: 4, 4, 1
    assert [c["input_ids"].shape[1] for c in runner.calls] == [4, 4, 1, 1]
    assert tokens == expected(list(range(1, 10)), 2)


def test_a_mask_and_position_ids_are_derived_when_the_step_takes_them():
    runner = CountingStep(extra=("attention_mask", "position_ids"))
    generator(runner).generate([2, 5], 2)
    assert [c["attention_mask"].tolist() for c in runner.calls] == [[[1]], [[1, 1]], [[1, 1, 1]]]
    assert [c["position_ids"].tolist() for c in runner.calls] == [[[0]], [[1]], [[2]]]


def test_a_cache_of_another_length_than_max_context_is_refused():
    with pytest.raises(BuildError, match=r"input 'past_key_values.0.key' has shape \[1, 1, 8, 1\].*max_context \(16\)"):
        generator(CountingStep(cache_rows=8)).generate([1], 1)


def test_an_input_that_is_not_paired_is_named():
    runner = CountingStep()
    runner.input_specs["scratch"] = {"shape": [1, 1, CONTEXT, 1], "dtype": "float32"}
    with pytest.raises(BuildError, match="input.s. scratch are neither tokens, position"):
        generator(runner).generate([1], 1)


def test_a_step_without_logits_is_refused_naming_its_outputs():
    class Unnamed(CountingStep):
        def __call__(self, feeds):
            result = super().__call__(feeds)
            return {"output_0": result["logits"], "output_1": result["present.0.key"]}

    with pytest.raises(BuildError, match=r"returned no logits \(outputs: output_0, output_1\)"):
        generator(Unnamed()).generate([1], 1)


def test_a_runner_that_does_not_describe_its_inputs_is_refused():
    with pytest.raises(BuildError, match="does not say it takes input_ids"):
        generator(lambda feeds: {})
