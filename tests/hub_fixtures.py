"""Tiny random-weight models of the real architectures, saved in a local Hugging Face hub-cache layout.

``make_hub(cache)`` writes, under ``cache`` (use it as ``HF_HUB_CACHE``), one
repository per architecture in the layout ``huggingface_hub`` reads offline::

    models--<owner>--<name>/
        blobs/<sha256 of the file>
        refs/<branch>                       # the commit the branch points to
        snapshots/<commit>/<file> -> ../../blobs/<sha256>

so that ``owner/name@branch`` resolves through ``refs/<branch>`` to a commit,
exactly as a model downloaded from the hub at a revision. The commit is a
40-hex digest of the files, so it is fixed for fixed contents.

Architectures (hidden 64, two query heads sharing one key head, head_dim 8,
so that a 131072-token forward stays affordable on a CPU):

* ``qwen3``: Qwen3 with q/k norm; ``max_position_embeddings`` 32768, the
  original window that ``--rope-scaling yarn:4:32768`` extends to 131072;
* ``llama3``: Llama 3.x, ``llama3`` rope type (factor 8 over 8192, 131072 positions);
* ``smollm3``: SmolLM3 with a NoPE layer (``no_rope_layers``), 131072 positions;
* ``mllama``: the text model of Llama 3.2 Vision, two self-attention layers
  and one cross-attention layer, 131072 positions.

Beyond :data:`ARCHITECTURES` (not in the default hub; the public checkpoint
series' rehearsals, ``tests/acceptance/test_public_series.py``, put them under
the real repository ids and branch names):

* ``gpt_neox``: Pythia's GPT-NeoX, 4 heads of 16 dims of which the first 4
  rotate (``rotary_pct = 0.25``), 2048 positions;
* ``olmo2``: OLMo-2, query/key RMS norm over the whole projection before RoPE,
  4096 positions;
* ``lucie``: Lucie-7B's Llama shape (4 query / 1 key heads), RoPE base 20M and
  32000 positions as after its context extension.

A repository may be saved without a tokenizer (``tokenizer=None``), as
checkpoint branches are that ship none.

The tokenizer is a byte-level BPE trained in memory on pydoc topics (no
download), saved as ``tokenizer.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

OWNER = "qkplast-rehearsal"
BRANCH = "rehearsal"
ARCHITECTURES = ("qwen3", "llama3", "smollm3", "mllama")
#: families of the public checkpoint series, built on demand (not part of :func:`make_hub`'s default)
EXTRA_ARCHITECTURES = ("gpt_neox", "olmo2", "lucie")

_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    vocab_size=300,
)


def repo_id(arch: str) -> str:
    """``owner/name`` of the tiny ``arch`` model."""
    return f"{OWNER}/tiny-{arch}"


def tiny_config(arch: str):
    """The config of the tiny ``arch`` model (see the module doc)."""
    import transformers as T

    if arch == "qwen3":
        return T.Qwen3Config(**_TINY, max_position_embeddings=32768)
    if arch == "llama3":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
        return T.LlamaConfig(**_TINY, max_position_embeddings=131072, rope_parameters=rope)
    if arch == "smollm3":
        return T.SmolLM3Config(**_TINY, max_position_embeddings=131072, no_rope_layers=[1, 0],
                               pad_token_id=None, bos_token_id=1, eos_token_id=0)
    if arch == "gpt_neox":
        return T.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=300, rotary_pct=0.25, max_position_embeddings=2048,
                               bos_token_id=1, eos_token_id=0)
    if arch == "olmo2":
        return T.Olmo2Config(**{**_TINY, "num_attention_heads": 4, "head_dim": 16}, max_position_embeddings=4096,
                             pad_token_id=None, bos_token_id=1, eos_token_id=0)
    if arch == "lucie":
        return T.LlamaConfig(**{**_TINY, "num_attention_heads": 4, "head_dim": 16}, max_position_embeddings=32000,
                             rope_parameters={"rope_type": "default", "rope_theta": 20000000.0})
    if arch == "mllama":
        text = {k: v for k, v in _TINY.items() if k != "head_dim"}
        # Mllama derives head_dim as hidden / heads: 2 heads of 32 (its own layout, kept).
        text.update(num_hidden_layers=3, cross_attention_layers=[1], max_position_embeddings=131072,
                    pad_token_id=None, bos_token_id=1, eos_token_id=0)
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_global_layers=1,
                      attention_heads=2, image_size=32, patch_size=16, vision_output_dim=32,
                      intermediate_layers_indices=[0])
        return T.MllamaConfig(text_config=text, vision_config=vision)
    raise ValueError(f"unknown architecture {arch!r}; one of {ARCHITECTURES + EXTRA_ARCHITECTURES}")


def tiny_model(arch: str, seed: int = 0, **config_overrides):
    """A random-initialised model of ``arch`` in eval mode (seeded); ``config_overrides`` set config attributes."""
    import torch
    import transformers as T

    torch.manual_seed(seed)
    config = tiny_config(arch)
    for name, value in config_overrides.items():
        setattr(config, name, value)
    cls = T.MllamaForConditionalGeneration if arch == "mllama" else T.AutoModelForCausalLM
    model = cls(config) if arch == "mllama" else cls.from_config(config)
    return model.eval()


def tiny_tokenizer():
    """The 300-token byte-level BPE of ``tests/helpers.py`` (trained in memory, offline)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for `python tests/hub_fixtures.py`
    from tests.helpers import tiny_tokenizer as make

    return make()


def _commit_of(files: dict[str, str]) -> str:
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]}\n".encode())
    return digest.hexdigest()


def save_to_hub_cache(model, tokenizer, repo: str, cache: Path, branch: str = BRANCH) -> str:
    """Save ``model`` and ``tokenizer`` as repository ``repo`` at ``branch`` in hub cache ``cache``; return the commit.

    Either may be None: a branch without a tokenizer (a checkpoint branch), or a tokenizer-only repository.
    """
    cache = Path(cache)
    root = cache / f"models--{repo.replace('/', '--')}"
    with tempfile.TemporaryDirectory() as tmp:
        if model is not None:
            model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        files = {}
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                files[path.relative_to(tmp).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
        commit = _commit_of(files)
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        snapshot = root / "snapshots" / commit
        for name, sha in files.items():
            blob = root / "blobs" / sha
            if not blob.exists():
                shutil.copyfile(Path(tmp) / name, blob)
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink(os.path.relpath(blob, link.parent), link)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / branch).write_text(commit)
    return commit


def make_hub(cache: Path, archs=ARCHITECTURES, branch: str = BRANCH) -> dict[str, str]:
    """Write every tiny model into hub cache ``cache``; return ``{arch: commit}``."""
    tokenizer = tiny_tokenizer()
    return {arch: save_to_hub_cache(tiny_model(arch), tokenizer, repo_id(arch), cache, branch) for arch in archs}


def long_corpus(path: Path, n_chars: int = 700_000, docs: int = 2, text_field: str = "text") -> Path:
    """A ``.jsonl`` corpus of ``docs`` documents of natural prose, ``n_chars`` characters each (under ``text_field``).

    Each document is the pydoc topics, repeated, starting at a different topic, so no two documents share
    their windows. The tiny BPE gives about 3.7 characters per token, so each holds one 131072-token
    window, and a run of ``--docs 2`` has the two documents its bootstraps and nulls need.
    """
    from pydoc_data.topics import topics

    names = sorted(topics)
    with path.open("w") as f:
        for d in range(docs):
            shift = d * len(names) // docs
            text = "\n\n".join(topics[k] for k in names[shift:] + names[:shift])
            f.write(json.dumps({"id": f"doc{d}", text_field: (text * (n_chars // len(text) + 1))[:n_chars]}) + "\n")
    return path


if __name__ == "__main__":  # python tests/hub_fixtures.py CACHE: build the hub for manual runs
    print(make_hub(Path(sys.argv[1])))
