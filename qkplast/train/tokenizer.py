"""A byte-level BPE tokenizer trained on the training documents, saved as a transformers fast tokenizer.

Byte-level: every text encodes (no unknown token), as GPT-2's does. One special token, ``<|endoftext|>``,
separates packed documents and serves as both BOS and EOS; nothing is added in front of a text, so a capture's
window starts with the document's first token.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EOT", "train_tokenizer"]

EOT = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` (deterministic for the same texts).

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        ``save_pretrained`` writes it so that ``AutoTokenizer.from_pretrained`` loads it back.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOT, eos_token=EOT, model_max_length=1 << 30)
