"""Synthetic prompts of an exact token count, sent as token ids.

The gateway's /v1/completions takes a list of token ids as `prompt` and
passes it to the workers as is, so a prompt of n ids is exactly n prompt
tokens (text would be re-tokenized, and its length would drift).

Two things make the prompts behave like the trace's requests:
- Each prompt starts with a few random token ids (seeded by the request's
  index): SGLang's radix cache would otherwise match a prefix shared by all
  prompts and prefill far fewer tokens than the trace asks for.
- The rest is ordinary English text tiled to length. A model reading text
  that repeats keeps copying it, so generation runs to max_tokens instead of
  stopping at an end-of-sequence token (the gateway gives the workers the
  model's EOS as a stop token, and there is no `ignore_eos`). Requests that
  still stop early are counted in the report.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

FILLER = (
    "The river runs past the old mill and under the stone bridge, where children count the boats "
    "that drift toward the harbor. In the evening the market closes, the lamps are lit along the "
    "quay, and the baker carries the last loaves home through the quiet streets of the town. "
)
# Random ids that open each prompt (unique prefix per request).
UNIQUE_PREFIX_TOKENS = 4


class PromptMaker:
    """Token-id prompts for one tokenizer: `ids(index, n)` is deterministic."""

    def __init__(self, filler_ids: list[int], id_low: int, id_high: int, seed: int = 0):
        if not filler_ids:
            raise ValueError("the filler text tokenized to nothing")
        if not 0 <= id_low < id_high:
            raise ValueError(f"bad token id range [{id_low}, {id_high})")
        self.filler = np.asarray(filler_ids, dtype=np.int64)
        self.id_low, self.id_high = id_low, id_high
        self.seed = seed

    @classmethod
    def from_tokenizer_dir(cls, model_dir: os.PathLike, seed: int = 0) -> PromptMaker:
        """From a model directory's `tokenizer.json` (the file the gateway loads)."""
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json (give --tokenizer MODEL_DIR_OR_EMBEDDED_NAME)")
        tok = Tokenizer.from_file(str(path))
        filler = tok.encode(FILLER, add_special_tokens=False).ids
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        # Random ids come from above the special tokens (they sit at the start
        # of the vocabulary in the Llama-family tokenizers used here).
        low = max(special) + 1 if special else 0
        return cls(filler, low, tok.get_vocab_size(with_added_tokens=False), seed)

    def ids(self, index: int, n: int) -> list[int]:
        """The prompt of request `index`: exactly `n` token ids."""
        if n < 1:
            raise ValueError(f"a prompt needs at least one token, got {n}")
        rng = np.random.default_rng([self.seed, index])
        head = rng.integers(self.id_low, self.id_high, min(n, UNIQUE_PREFIX_TOKENS))
        rest = n - head.size
        start = int(rng.integers(0, self.filler.size))
        reps = -(-(start + rest) // self.filler.size)
        body = np.tile(self.filler, max(reps, 1))[start:start + rest]
        return np.concatenate([head, body]).astype(int).tolist()


def resolve_tokenizer_dir(spec: str) -> Path:
    """A directory holding tokenizer.json, else an embedded model name (built
    on first use) or a model directory."""
    path = Path(spec).expanduser()
    if (path / "tokenizer.json").is_file():
        return path
    from tiertp.engine.models import resolve_model

    return resolve_model(spec)
