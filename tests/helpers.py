"""Helpers shared by test modules of several folders: the repository root, tiny random models and tokenizer.

Test modules import them as ``from tests.helpers import ...`` (``tests`` is a package, so the test modules of
``tests/unit``, ``tests/integration`` and ``tests/acceptance`` may share a file name).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import transformers as T

ROOT = Path(__file__).resolve().parent.parent
#: The paired notebooks (py:percent sources) of the book.
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))

# Qwen3-8B's published dimensions: the thesis's model at its scale, config only (no weights needed to plan).
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                tie_word_embeddings=False)

#: The capture settings of the tiny papermill batch (with PRESETS['fast']).
TINY = {"docs": 2, "seq_len": 256, "bucket_size": 32, "samples_per_bucket": 4, "heads": 12}
#: Notebook parameters of the tiny batch: small grids for the two chapters beyond the thesis (nbval runs their
#: defaults, the rehearsal runs them on random-weight models), so the batch tests the plumbing in about a minute.
TINY_NOTEBOOKS = {"n_boot": 4, "n_perm": 20, "n_null": 2, "window": 128, "positions": [56, 112],
                  "distances": [16, 40], "copy_windows": 2, "geometry_docs": 2, "n_reseeds": 5,
                  "rope_factors": [2.0], "window_factors": [1], "cond_docs": 2, "training": "smoke"}

COMMON = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=300,
    max_position_embeddings=256,
)


def tiny_tokenizer():
    """A 300-token byte-level BPE trained in memory on a few pydoc topics (no download)."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([topics[k] for k in sorted(topics)[:10]], trainer)
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", bos_token="<bos>")


def tiny_model(family: str):
    """A random-initialised model of ``family`` with hidden size 32 and 3-4 layers, in eval mode."""
    if family == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(**COMMON))
    elif family == "qwen3":
        model = T.Qwen3ForCausalLM(T.Qwen3Config(**COMMON))
    elif family == "mistral":
        model = T.MistralForCausalLM(T.MistralConfig(**COMMON, sliding_window=None))
    elif family == "mistral-swa":
        model = T.MistralForCausalLM(T.MistralConfig(**COMMON, sliding_window=16))
    elif family == "ministral":
        layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
        model = T.MinistralForCausalLM(T.MinistralConfig(**COMMON, sliding_window=16, layer_types=layer_types))
    elif family in ("ministral3", "mistral3"):
        # A small original length makes the Llama-4 query scaling of Ministral-3 act inside 64 tokens.
        rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0}
        text = T.Ministral3Config(
            **{**COMMON, "max_position_embeddings": 64}, rope_parameters={**rope, "llama_4_scaling_beta": 0.5}
        )
        if family == "ministral3":
            model = T.Ministral3ForCausalLM(text)
        else:
            vision = T.PixtralVisionConfig(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=32,
                patch_size=8,
                head_dim=8,
            )
            model = T.Mistral3ForConditionalGeneration(
                T.Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict())
            )
    elif family == "smollm3":
        config = T.SmolLM3Config(**{**COMMON, "num_hidden_layers": 4}, no_rope_layer_interval=2, pad_token_id=None)
        model = T.SmolLM3ForCausalLM(config)
    elif family == "mllama":
        text = {k: v for k, v in COMMON.items() if k != "head_dim"}
        text.update(num_hidden_layers=4, cross_attention_layers=[1], pad_token_id=None)
        vision = dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_global_layers=1,
            attention_heads=2,
            image_size=32,
            patch_size=16,
            vision_output_dim=32,
            intermediate_layers_indices=[0],
        )
        model = T.MllamaForConditionalGeneration(T.MllamaConfig(text_config=text, vision_config=vision))
    elif family == "qwen2":
        model = T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON))
    else:
        raise AssertionError(family)
    return model.eval()


def save_tiny_checkpoint(path: Path) -> Path:
    """Save a tiny random Llama (``COMMON``) with the tiny tokenizer at ``path``, like a downloaded model."""
    T.LlamaForCausalLM(T.LlamaConfig(**COMMON)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


#: The capture settings of the run_capture tests on ``model_dir``: twelve 64-token windows of pydoc-topics.
TINY_CAPTURE = dict(seq_len=64, bucket_size=16, samples_per_bucket=2, heads=5, docs=12, corpus="pydoc-topics",
                    short_docs="concat")


def run_tiny_capture(model, out, corpus="pydoc-topics", *, overwrite=False, **overrides):
    """run_capture of ``model`` with ``TINY_CAPTURE`` (``overrides`` replace fields)."""
    from qkplast.capture.driver import run_capture
    from qkplast.options import CaptureOptions

    options = CaptureOptions(**{**TINY_CAPTURE, "model": str(model), "corpus": str(corpus), **overrides})
    return run_capture(options, out, overwrite=overwrite, progress=False)


def files_written(tmp_path):
    """The names a refused capture left in ``tmp_path``, besides the corpus and model the test put there."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("corpus", "gpt2"))


def topic_documents(*names):
    """The pydoc topics ``names`` as capture documents (id = topic name)."""
    from pydoc_data.topics import topics

    from qkplast.capture.corpus import Document

    return [Document(name, topics[name]) for name in names]


def rotation_metrics(cap):
    """The rotation metrics of capture ``cap`` with its head coordinates and attrs: what the clamps read."""
    from qkplast.analysis.rotation import rotation

    met = rotation(cap)
    met = met.assign_coords({c: ("head", cap[c].values) for c in ("layer", "q_head", "kv_head")})
    met.attrs["capture"] = dict(cap.attrs)
    return met


def cli(capsys, *argv) -> tuple[int, str, str]:
    """Run ``qkplast argv`` in this process; return its exit status, stdout and stderr."""
    from qkplast.pipeline.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, argv, *needles):
    """Run ``qkplast argv``; assert exit 2, exactly one line on stderr containing every needle, no traceback."""
    from qkplast.pipeline.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qkplast {argv[0]}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_yaml(path: Path, data: dict) -> Path:
    """Write ``data`` as YAML (a study file) at ``path``."""
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fake_stage(monkeypatch, tmp_path):
    """Replace the model load and the capture by a planted capture, recording the calls in order."""
    import qkplast.capture.driver as driver
    import qkplast.capture.models as models
    from qkplast.pipeline import stages
    from qkplast.theory.planted import planted_capture

    calls = []

    def fake_capture(options, out, *, overwrite=False, progress=True, loaded=None):
        assert loaded == "model", "every capture of a run uses the one loaded model"
        calls.append(("capture", options.corpus))
        cap, _ = planted_capture(n_heads=2, dim=8, seq_len=options.seq_len, bucket_size=options.bucket_size,
                                 n_docs=options.docs, samples_per_bucket=2)
        cap.attrs.update(corpus=options.corpus, commit="0123abc")
        from qkplast.capture_format import save_capture

        save_capture(cap, out)
        return cap

    import qkplast.capture.plan as plan

    # the code capture's sizing tokenizes its corpus (the model's tokenizer): planted as the run's own windows
    monkeypatch.setattr(plan, "size_code_capture", lambda main, corpus, tokenizer=None: plan.CodeCapture(
        replace(main, corpus=corpus), "as-run", "planted: the run's windows"))
    monkeypatch.setattr(stages, "check_windows", lambda options: calls.append(("windows", options.corpus)))
    monkeypatch.setattr(stages, "check_memory", lambda *a, **k: None)  # the plan reads the model's config
    monkeypatch.setattr(models, "load_for", lambda options, plan=None: calls.append(("load", options.model)) or "model")
    monkeypatch.setattr(models, "release_model", lambda loaded: calls.append(("release", loaded)))
    monkeypatch.setattr(driver, "run_capture", fake_capture)
    return calls


#: Qwen3-8B's published shape (config only: planning and sizing read it, nothing is built at this size)
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960)


def jsonl_corpus(path: Path, sizes: list[int]) -> Path:
    """Documents of natural prose of the given character counts (the tiny BPE: ~1.5 characters per token)."""
    import json

    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)) * 4
    with path.open("w") as f:
        for i, n in enumerate(sizes):
            f.write(json.dumps({"id": f"d{i}", "text": text[i * 997: i * 997 + n]}) + "\n")
    return path


def study_yaml(tmp_path: Path, models: list, **top) -> Path:
    """A study file named ``s`` writing into ``tmp_path/out``, with ``models`` and any other top-level keys."""
    import yaml

    data = {"name": "s", "out": str(tmp_path / "out"), "models": models, **top}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def smoke_refs(out: Path, seed: int) -> dict:
    """The hub branches of one seed of a training in ``out`` (name -> commit)."""
    from qkplast.train import hub_cache, repo_id
    from qkplast.train.hub import branches

    return branches(hub_cache(out), repo_id(seed))


def smoke_branch_names() -> tuple[str, str]:
    """The smoke preset's final stage-A branch and an intermediate one (its second checkpoint)."""
    from qkplast.train import PRESETS

    smoke = PRESETS["smoke"]
    return f"stageA-step{smoke.steps}", f"stageA-step{smoke.checkpoint_steps('stageA')[1]}"

