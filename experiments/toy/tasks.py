r"""Verifiable tasks for the small trainer, with a supervised warm-up that makes the right strategy rare.

A task works in *task ids*: indices into ``task.symbols``, whose first three entries are ``<pad>``,
``<bos>``, ``<eos>``.  Every prompt has the same length (``prompt_len``) and every completion at most
``max_new_tokens`` tokens, so a batch is a plain rectangular tensor and nothing is tokenised in the loop.
Rewards are computed for a whole batch at once from the token ids (no decoding, no Python loop over samples).

:class:`AdditionTask` (``"add"``): ``<bos> a + b =`` with ``a``, ``b`` of ``n_digits`` digits in ``base``
(most significant digit first); the answer is the sum written **least significant digit first** with
``n_digits + 1`` digits, then ``<eos>``.  With :math:`c_i` the carry into digit :math:`i`,

.. math::  s_i = (a_i + b_i + c_i) \bmod \beta, \qquad c_{i+1} = \lfloor (a_i + b_i + c_i)/\beta \rfloor .

The warm-up demonstrations mix three strategies per example: the correct sum (fraction ``demo_correct``),
the *carry-forgetting* sum :math:`\tilde s_i = (a_i + b_i) \bmod \beta`,
:math:`\tilde s_n = \lfloor (a_{n-1} + b_{n-1})/\beta \rfloor` (the dominant habit), and with fraction
``demo_noise`` the carry-forgetting sum with one digit replaced at random (rare mistakes).  After the warm-up
the correct answer to a problem with a carry is a low-probability *sequence*: its first carried digit is a
fork where the model picks :math:`s_i` with probability about ``demo_correct``.  RL prompts are drawn from
problems with at least one carry (``carry_only``), where that fork exists.

Rewards: ``"exact"`` gives 1 for the exact answer followed by ``<eos>`` and 0 otherwise (only the rare
strategy is rewarded); ``"digits"`` gives the fraction of the ``n_digits + 2`` answer positions (digits and
``<eos>``) that are right, so the habitual carry-forgetting answer earns partial credit (a dominant mediocre
strategy).  Tokens after the first ``<eos>`` are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

__all__ = ["BOS", "EOS", "PAD", "REWARDS", "TASKS", "AdditionTask", "ReverseTask", "Task", "describe", "get_task"]

PAD, BOS, EOS = 0, 1, 2
REWARDS = ("exact", "digits")


class Task(Protocol):
    """What the trainer needs from a task (all tensors hold task ids; see the module docstring)."""

    name: str
    reward_mode: str
    size_name: ClassVar[str]
    size_range: ClassVar[tuple[int, int]]

    @property
    def symbols(self) -> tuple[str, ...]: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def demonstrations(self, n: int, generator: torch.Generator, correct: float | None = None) -> torch.Tensor: ...
    def answers(self, prompts: torch.Tensor) -> torch.Tensor: ...
    def reward(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor: ...
    def is_correct(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class AdditionTask:
    """Add two ``n_digits``-digit numbers in ``base``; see the module docstring for the warm-up and rewards."""

    n_digits: int = 2
    base: int = 10
    reward_mode: str = "exact"
    demo_correct: float = 0.1
    demo_noise: float = 0.05
    carry_only: bool = True
    name: str = "add"
    #: The keyword that sets the problem size, and its accepted range.
    size_name: ClassVar[str] = "n_digits"
    size_range: ClassVar[tuple[int, int]] = (1, 8)

    def __post_init__(self) -> None:
        _check_size(self, self.n_digits)
        _check_common(self)

    # ---- vocabulary and shapes -------------------------------------------------------------------------
    @property
    def symbols(self) -> tuple[str, ...]:
        return ("<pad>", "<bos>", "<eos>", *(str(d) for d in range(self.base)), "+", "=")

    @property
    def prompt_len(self) -> int:
        return 2 * self.n_digits + 3

    @property
    def max_new_tokens(self) -> int:
        return self.n_digits + 2

    def _digit(self, d: torch.Tensor) -> torch.Tensor:
        return d + 3  # task id of digit d

    # ---- problems --------------------------------------------------------------------------------------
    def _operands(self, n: int, generator: torch.Generator, carry_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Digits (least significant first) of ``n`` operand pairs, shape (n, n_digits) each."""
        a = torch.randint(0, self.base, (n, self.n_digits), generator=generator)
        b = torch.randint(0, self.base, (n, self.n_digits), generator=generator)
        if not carry_only:
            return a, b
        need = ~_has_carry(a, b, self.base)
        while bool(need.any()):  # rejection sampling, a few rounds over the whole batch
            k = int(need.sum())
            a[need] = torch.randint(0, self.base, (k, self.n_digits), generator=generator)
            b[need] = torch.randint(0, self.base, (k, self.n_digits), generator=generator)
            need = ~_has_carry(a, b, self.base)
        return a, b

    def _prompt_ids(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.shape[0]
        bos = torch.full((n, 1), BOS, dtype=torch.long)
        plus = torch.full((n, 1), len(self.symbols) - 2, dtype=torch.long)
        equals = torch.full((n, 1), len(self.symbols) - 1, dtype=torch.long)
        return torch.cat([bos, self._digit(a.flip(1)), plus, self._digit(b.flip(1)), equals], dim=1)

    def _operands_of(self, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.n_digits
        a = (prompts[:, 1 : 1 + k] - 3).flip(1)
        b = (prompts[:, 2 + k : 2 + 2 * k] - 3).flip(1)
        return a, b

    def answers(self, prompts: torch.Tensor) -> torch.Tensor:
        """The correct completions (n, max_new_tokens): sum digits least significant first, then <eos>."""
        a, b = self._operands_of(prompts.cpu())
        weights = self.base ** torch.arange(self.n_digits)
        total = (a * weights).sum(1) + (b * weights).sum(1)
        digits = (total[:, None] // self.base ** torch.arange(self.n_digits + 1)) % self.base
        eos = torch.full((prompts.shape[0], 1), EOS, dtype=torch.long)
        return torch.cat([self._digit(digits), eos], dim=1).to(prompts.device)

    def _carry_forgetting(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        column = a + b
        top = column[:, -1:] // self.base
        eos = torch.full((a.shape[0], 1), EOS, dtype=torch.long)
        return torch.cat([self._digit(column % self.base), self._digit(top), eos], dim=1)

    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` RL prompts (n, prompt_len), drawn with ``generator`` (problems with a carry if carry_only)."""
        return self._prompt_ids(*self._operands(n, generator, self.carry_only))

    def demonstrations(self, n: int, generator: torch.Generator, correct: float | None = None) -> torch.Tensor:
        """``n`` warm-up sequences (n, prompt_len + max_new_tokens): prompt + a completion from the mixture.

        ``correct`` overrides ``demo_correct`` (the fraction of correct demonstrations).
        """
        a, b = self._operands(n, generator, carry_only=False)
        prompts = self._prompt_ids(a, b)
        habit = self._carry_forgetting(a, b)
        return torch.cat([prompts, _mixture(self, self.answers(prompts), habit, generator, correct)], dim=1)

    # ---- verification ----------------------------------------------------------------------------------
    def is_correct(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Bool (n,): the completion is exactly the answer followed by <eos>."""
        return _scored_positions(self.answers(prompts), completions).all(dim=1)

    def reward(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Float (n,) rewards in [0, 1] for completions (n, max_new_tokens) in task ids (-1 = unknown token)."""
        return _reward(self.reward_mode, _scored_positions(self.answers(prompts), completions))

# --------------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------------


def _check_size(task, value: int) -> None:
    low, high = task.size_range
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{task.size_name}: must be an integer in [{low}, {high}], got {value!r}")


def _check_common(task) -> None:
    if not (isinstance(task.base, int) and 2 <= task.base <= 10):
        raise ValueError(f"base: must be an integer in [2, 10], got {task.base!r}")
    if task.reward_mode not in REWARDS:
        raise ValueError(f"reward: must be one of {REWARDS}, got {task.reward_mode!r}")
    for name in ("demo_correct", "demo_noise"):
        value = getattr(task, name)
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name}: must be in [0, 1], got {value!r}")
    if task.demo_correct + task.demo_noise > 1.0:
        raise ValueError(f"demo_correct + demo_noise: must be <= 1, got {task.demo_correct!r} + {task.demo_noise!r}")


def _mixture(task, right: torch.Tensor, habit: torch.Tensor, generator: torch.Generator,
             correct: float | None) -> torch.Tensor:
    """Per row: ``right`` (probability ``correct``, default demo_correct), ``habit`` with one digit randomised
    (demo_noise), or ``habit``.  The last column of both is <eos>; the randomised digit is one of the others.
    """
    correct = task.demo_correct if correct is None else correct
    n, width = habit.shape
    noisy = habit.clone()
    position = torch.randint(0, width - 1, (n,), generator=generator)
    noisy[torch.arange(n), position] = torch.randint(0, task.base, (n,), generator=generator) + 3
    u = torch.rand(n, generator=generator)[:, None]
    return torch.where(u < correct, right, torch.where(u < correct + task.demo_noise, noisy, habit))


def _scored_positions(answers: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """Bool (n, T): completion token equals the answer's, with tokens after the first <eos> ignored."""
    is_eos = (completions == EOS).long()
    after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0
    return completions.masked_fill(after_eos, PAD) == answers


def _reward(mode: str, right: torch.Tensor) -> torch.Tensor:
    if mode == "exact":
        return right.all(dim=1).float()
    return right.float().mean(dim=1)


def describe(task: Task, prompt: torch.Tensor, completion: torch.Tensor | None = None) -> str:
    """Readable text of one prompt (and completion) in task ids, e.g. ``'47+38= 580<eos>'``."""
    symbols = task.symbols
    text = "".join(symbols[i] for i in prompt.tolist() if i != BOS)
    if completion is not None:
        text += " " + "".join(symbols[i] if 0 <= i < len(symbols) else "?" for i in completion.tolist())
    return text


def _has_carry(a: torch.Tensor, b: torch.Tensor, base: int) -> torch.Tensor:
    """Bool (n,): adding the digit rows produces at least one carry (into a digit or out of the top)."""
    # every carry chain starts at a column with a_i + b_i >= base (a column summing to base-1 only passes one on)
    return ((a + b) >= base).any(dim=1)


@dataclass(frozen=True)
class ReverseTask:
    r"""Write a string of ``length`` digits backwards; the warm-up habit is to copy it forwards.

    Prompt ``<bos> x_1 .. x_n =``, answer :math:`x_n \dots x_1` ``<eos>``.  Demonstrations: the reversal
    (fraction ``demo_correct``), a copy :math:`x_1 \dots x_n` (the habit), or with fraction ``demo_noise`` a
    copy with one digit replaced at random.  The first answer token is the fork (:math:`x_n` against the
    habitual :math:`x_1`); after it the rest follows.  Rewards as for :class:`AdditionTask` (``"digits"``: the
    copy of a string earns credit for the middle digit(s) that a reversal leaves in place, and ``<eos>``).
    """

    length: int = 4
    base: int = 10
    reward_mode: str = "exact"
    demo_correct: float = 0.1
    demo_noise: float = 0.05
    name: str = "reverse"
    #: The keyword that sets the problem size, and its accepted range.
    size_name: ClassVar[str] = "length"
    size_range: ClassVar[tuple[int, int]] = (2, 16)

    def __post_init__(self) -> None:
        _check_size(self, self.length)
        _check_common(self)

    @property
    def symbols(self) -> tuple[str, ...]:
        return ("<pad>", "<bos>", "<eos>", *(str(d) for d in range(self.base)), "=")

    @property
    def prompt_len(self) -> int:
        return self.length + 2

    @property
    def max_new_tokens(self) -> int:
        return self.length + 1

    def _strings(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Digit strings (n, length) whose reversal differs from the copy (so the fork exists)."""
        x = torch.randint(0, self.base, (n, self.length), generator=generator)
        need = (x == x.flip(1)).all(dim=1)
        while bool(need.any()):  # rejection sampling of palindromes, a few rounds over the whole batch
            x[need] = torch.randint(0, self.base, (int(need.sum()), self.length), generator=generator)
            need = (x == x.flip(1)).all(dim=1)
        return x

    def _prompt_ids(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        bos = torch.full((n, 1), BOS, dtype=torch.long)
        equals = torch.full((n, 1), len(self.symbols) - 1, dtype=torch.long)
        return torch.cat([bos, x + 3, equals], dim=1)

    def answers(self, prompts: torch.Tensor) -> torch.Tensor:
        eos = torch.full((prompts.shape[0], 1), EOS, dtype=torch.long, device=prompts.device)
        return torch.cat([prompts[:, 1 : 1 + self.length].flip(1), eos], dim=1)

    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return self._prompt_ids(self._strings(n, generator))

    def demonstrations(self, n: int, generator: torch.Generator, correct: float | None = None) -> torch.Tensor:
        """Warm-up sequences (n, prompt_len + max_new_tokens); ``correct`` overrides ``demo_correct``."""
        x = self._strings(n, generator)
        prompts = self._prompt_ids(x)
        eos = torch.full((n, 1), EOS, dtype=torch.long)
        habit = torch.cat([x + 3, eos], dim=1)
        return torch.cat([prompts, _mixture(self, self.answers(prompts), habit, generator, correct)], dim=1)

    def is_correct(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        return _scored_positions(self.answers(prompts), completions).all(dim=1)

    def reward(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        return _reward(self.reward_mode, _scored_positions(self.answers(prompts), completions))


#: Task name -> class; every class accepts ``reward_mode`` plus its own keyword arguments.
TASKS: dict[str, type[Task]] = {"add": AdditionTask, "reverse": ReverseTask}


def get_task(name: str, **kwargs) -> Task:
    """A built-in task by name (``"add"``) with keyword options (e.g. ``reward_mode="digits"``)."""
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)
