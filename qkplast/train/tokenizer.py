"""A byte-level BPE tokenizer trained on the training documents, saved as a transformers fast tokenizer.

Byte-level: every text encodes (no unknown token), as GPT-2's does. One special token, ``<|endoftext|>``,
separates packed documents and serves as both BOS and EOS. The training's tokenizer adds nothing in front of a
text; a checkpoint of a training with ``bos`` carries one that puts ``<|endoftext|>`` in front
(:func:`checkpoint_tokenizer`), so a capture's windows start as the model's training windows did.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EOT", "checkpoint_tokenizer", "train_tokenizer"]

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


def checkpoint_tokenizer(path, bos: bool):
    """The training's tokenizer saved in ``path``, as a checkpoint carries it: with ``bos``, one whose encoding of
    a text starts with ``<|endoftext|>`` (a template post-processor, as hub models' tokenizers add their BOS)."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    # local_files_only explicit: the tokenizer config records it, and the commit must not depend on HF_HUB_OFFLINE
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if bos:
        eot = tokenizer.convert_tokens_to_ids(EOT)
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B", special_tokens=[(EOT, eot)])
    return tokenizer
