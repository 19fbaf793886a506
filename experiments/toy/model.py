r"""The policy for the small trainer: a tiny causal LM built from a config, or a local Hugging Face model.

Nothing is downloaded, and ``transformers`` is imported only when a model is built or loaded.
:func:`build_tiny_policy` makes a word-level tokenizer over a task's symbols (one symbol = one token,
``<pad>``/``<bos>``/``<eos>`` first) and a small ``LlamaConfig`` model from it; :func:`load_policy` opens a local
directory holding a model and its tokenizer (for example one written by :meth:`Policy.save`).  Either way the
trainer talks to the model in *task ids* (indices into ``task.symbols``); :class:`Policy` keeps the two lookup
tables that translate task ids to model ids and back, so a pretrained model with a large vocabulary can be
trained on a task without re-tokenising anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers is imported by the functions that build or load a model
    from transformers import PreTrainedTokenizerFast

__all__ = ["MODEL_SIZES", "Policy", "build_tiny_policy", "load_policy"]

#: Named sizes of the locally built Llama (hidden size, layers, heads, MLP width).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    "small": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 384},
    "medium": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "intermediate_size": 1408},
}


@dataclass
class Policy:
    """A causal LM plus the maps between a task's symbol ids and the model's token ids.

    Attributes
    ----------
    model : the ``transformers`` causal LM.
    tokenizer : its tokenizer (used to save it and to map symbols; the trainer never re-tokenises text).
    to_model : LongTensor (n_symbols,), task id -> model id.
    from_model : LongTensor (vocab_size,), model id -> task id, or -1 for a token the task does not know.
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerFast
    to_model: torch.Tensor
    from_model: torch.Tensor

    def to(self, device: torch.device | str) -> Policy:
        self.model.to(device)
        self.to_model = self.to_model.to(device)
        self.from_model = self.from_model.to(device)
        return self

    def save(self, path: str | Path) -> None:
        """Write model and tokenizer as a local Hugging Face directory (loadable by :func:`load_policy`)."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


def _symbol_maps(tokenizer, symbols: tuple[str, ...], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    special = {"<pad>": tokenizer.pad_token_id, "<bos>": tokenizer.bos_token_id, "<eos>": tokenizer.eos_token_id}
    ids = []
    for symbol in symbols:
        if symbol in special and special[symbol] is not None:
            ids.append(int(special[symbol]))
            continue
        encoded = tokenizer.encode(symbol, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(
                f"tokenizer: the task symbol {symbol!r} is not a single token of this tokenizer (got {encoded})"
            )
        ids.append(int(encoded[0]))
    if len(set(ids)) != len(ids):
        pairs = dict(zip(symbols, ids, strict=True))
        raise ValueError(f"tokenizer: two task symbols map to the same token id ({pairs})")
    to_model = torch.tensor(ids, dtype=torch.long)
    from_model = torch.full((vocab_size,), -1, dtype=torch.long)
    from_model[to_model] = torch.arange(len(symbols))
    return to_model, from_model


def word_tokenizer(symbols: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer whose vocabulary is exactly ``symbols`` (id = position)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<pad>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<pad>"
    )


def build_tiny_policy(symbols: tuple[str, ...], *, size: str = "tiny", seed: int = 0, max_len: int = 64) -> Policy:
    """A freshly initialised Llama of a named size (:data:`MODEL_SIZES`) over the task's symbols.

    The weights are drawn from a private generator seeded with ``seed``; the global RNG is left untouched.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    if size not in MODEL_SIZES:
        raise ValueError(f"size: unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}")
    tokenizer = word_tokenizer(symbols)
    dims = MODEL_SIZES[size]
    config = LlamaConfig(
        vocab_size=len(symbols),
        num_key_value_heads=dims["num_attention_heads"],
        max_position_embeddings=max_len,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        **dims,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.float()
    to_model, from_model = _symbol_maps(tokenizer, symbols, len(symbols))
    return Policy(model, tokenizer, to_model, from_model)


def load_policy(path: str | Path, symbols: tuple[str, ...]) -> Policy:
    """Open a local Hugging Face directory (model + tokenizer); no download is attempted.

    Every task symbol must be one token of the model's tokenizer.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"model: {str(path)!r} is not a local directory with a model and tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    vocab_size = model.get_input_embeddings().weight.shape[0]
    to_model, from_model = _symbol_maps(tokenizer, symbols, vocab_size)
    return Policy(model, tokenizer, to_model, from_model)
