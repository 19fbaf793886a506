"""The verifiable tasks of the small trainer: answers, rewards, warm-up mixtures, input checks."""

from __future__ import annotations

import pytest
import torch

from experiments.toy.tasks import EOS, PAD, AdditionTask, ReverseTask, describe, get_task


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _number(digits: list[int], base: int) -> int:
    return sum(d * base**i for i, d in enumerate(digits))


# ---- reverse ---------------------------------------------------------------------------------------------


def test_reverse_answers_are_the_reversed_string_then_eos():
    task = ReverseTask(length=4)
    prompts = task.prompts(50, _gen())
    answers = task.answers(prompts)
    assert prompts.shape == (50, task.prompt_len) and answers.shape == (50, task.max_new_tokens)
    for prompt, answer in zip(prompts.tolist(), answers.tolist(), strict=True):
        assert answer == [*prompt[1:5][::-1], EOS]
    assert task.reward(prompts, answers).tolist() == [1.0] * 50
    assert task.is_correct(prompts, answers).all()


def test_reverse_prompts_have_no_palindromes_so_the_fork_exists():
    task = ReverseTask(length=3, base=2)  # small alphabet: many palindromes to reject
    x = task.prompts(500, _gen())[:, 1:4]
    assert not (x == x.flip(1)).all(dim=1).any()


def test_reverse_rewards_of_the_habit():
    task = ReverseTask(length=4)
    prompts = torch.tensor([[1, 3 + 1, 3 + 2, 3 + 3, 3 + 4, 13]])  # "1234="
    copy = torch.tensor([[3 + 1, 3 + 2, 3 + 3, 3 + 4, EOS]])
    assert task.reward(prompts, copy).item() == 0.0
    digits = ReverseTask(length=4, reward_mode="digits")
    assert digits.reward(prompts, copy).item() == pytest.approx(1 / 5)  # only <eos> is right


def test_tokens_after_eos_are_ignored_and_early_eos_is_wrong():
    task = ReverseTask(length=2, reward_mode="digits")
    prompts = torch.tensor([[1, 3 + 1, 3 + 2, 13]])  # "12=", answer "21<eos>"
    early = torch.tensor([[EOS, 3 + 1, EOS]])  # stops at once; the trailing "1<eos>" must not score
    assert task.reward(prompts, early).item() == 0.0
    late = torch.tensor([[3 + 2, 3 + 1, EOS]])
    assert task.reward(prompts, late).item() == 1.0
    unknown = torch.tensor([[-1, 3 + 1, EOS]])  # a token the task does not know (from a large vocabulary)
    assert task.reward(prompts, unknown).item() == pytest.approx(2 / 3)


def test_reverse_demonstration_mixture_fractions():
    task = ReverseTask(length=4, demo_correct=0.1, demo_noise=0.05)
    demos = task.demonstrations(20000, _gen())
    prompts, completions = demos[:, : task.prompt_len], demos[:, task.prompt_len :]
    correct = task.is_correct(prompts, completions).float().mean().item()
    habit = (completions[:, :4] == prompts[:, 1:5]).all(dim=1).float().mean().item()
    assert correct == pytest.approx(0.1, abs=0.01)
    # a noisy copy equals the copy when the random digit repeats the old one (probability 1/base)
    assert habit == pytest.approx(0.85 + 0.05 / 10, abs=0.015)
    balanced = task.demonstrations(20000, _gen(), correct=0.5)
    assert task.is_correct(balanced[:, :6], balanced[:, 6:]).float().mean().item() == pytest.approx(0.5, abs=0.015)


def test_demonstrations_are_deterministic_in_the_generator():
    task = ReverseTask()
    assert torch.equal(task.demonstrations(64, _gen(3)), task.demonstrations(64, _gen(3)))
    assert not torch.equal(task.demonstrations(64, _gen(3)), task.demonstrations(64, _gen(4)))


# ---- addition --------------------------------------------------------------------------------------------


def test_addition_answers_match_integer_arithmetic():
    task = AdditionTask(n_digits=3, base=7, carry_only=False)
    prompts = task.prompts(200, _gen())
    answers = task.answers(prompts)
    for prompt, answer in zip(prompts.tolist(), answers.tolist(), strict=True):
        a = _number([d - 3 for d in prompt[1:4]][::-1], 7)
        b = _number([d - 3 for d in prompt[5:8]][::-1], 7)
        assert answer[-1] == EOS
        assert _number([d - 3 for d in answer[:-1]], 7) == a + b


def test_addition_rl_prompts_all_need_a_carry():
    task = AdditionTask(n_digits=2)
    prompts = task.prompts(300, _gen())
    a = (prompts[:, 1:3] - 3).flip(1)
    b = (prompts[:, 4:6] - 3).flip(1)
    assert ((a + b) >= 10).any(dim=1).all()


def test_addition_habit_forgets_the_carry_and_earns_partial_credit():
    task = AdditionTask(n_digits=2, demo_correct=0.0, demo_noise=0.0, reward_mode="digits")
    demos = task.demonstrations(1, _gen())
    prompts = torch.tensor([[1, 3 + 4, 3 + 7, 13, 3 + 3, 3 + 8, 14]])  # 47 + 38 = 85 -> "580<eos>"
    assert describe(task, prompts[0], task.answers(prompts)[0]) == "47+38= 580<eos>"
    habit = torch.tensor([[3 + 5, 3 + 7, 3 + 0, EOS]])  # 7+8 -> 5, 4+3 -> 7 (carry forgotten), top 0
    assert task.reward(prompts, habit).item() == pytest.approx(3 / 4)
    assert AdditionTask(n_digits=2).reward(prompts, habit).item() == 0.0
    assert demos.shape == (1, task.prompt_len + task.max_new_tokens)


# ---- input checks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward_mode": "partial"}, "reward: must be one of"),
        ({"base": 11}, "base: must be an integer in \\[2, 10\\], got 11"),
        ({"demo_correct": 1.5}, "demo_correct: must be in \\[0, 1\\], got 1.5"),
        ({"demo_correct": 0.7, "demo_noise": 0.5}, "demo_correct \\+ demo_noise"),
    ],
)
def test_bad_task_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReverseTask(**kwargs)


def test_bad_sizes_and_names():
    with pytest.raises(ValueError, match="length: must be an integer in \\[2, 16\\], got 1"):
        ReverseTask(length=1)
    with pytest.raises(ValueError, match="n_digits: must be an integer in \\[1, 8\\], got 0"):
        AdditionTask(n_digits=0)
    with pytest.raises(ValueError, match="task: unknown task 'sort'"):
        get_task("sort")


def test_padding_symbol_layout():
    for task in (ReverseTask(), AdditionTask()):
        assert task.symbols[PAD] == "<pad>" and task.symbols[EOS] == "<eos>"
