"""The new capture families on a GPU: tiny random GPT-NeoX, OLMo-2 and Ministral-3 on CUDA in bfloat16.

For each family, one window of ``--short`` tokens is captured through the capture hook (delegating to sdpa,
which dispatches to CUDA's fused kernels) and ``q . k * scaling`` is compared with the model's own eager
attention on the same GPU (log-probability differences at every pair of sampled positions, as the CPU tests do;
bfloat16 tolerance). Then Ministral-3 with its published query scale (``llama_4_scaling_beta`` 0.1 over 16384
original positions, YaRN factor 8) is captured over ``--long`` tokens: the recorded ``query_scale`` must equal
``1 + 0.1 log(1 + floor(t / 16384))`` rounded to bfloat16, every vector must be finite, and the capture's time
is printed beside a bare forward's.

    PYTHONPATH=. python benchmarks/check_families_gpu.py [--short 1024] [--long 131072] [--device cuda]

``--device cpu`` (with a short ``--long``) tries the script where there is no GPU.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import transformers as T

from qkplast.capture.recorder import Capturer
from qkplast.capture.sampling import sample_positions


DEVICE = "cuda"


def sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def tiny(family: str, long_window: int):
    common = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)
    if family == "gpt_neox":
        config = T.GPTNeoXConfig(**common, rotary_pct=0.25, max_position_embeddings=2048)
    elif family == "olmo2":
        config = T.Olmo2Config(**common, num_key_value_heads=2, max_position_embeddings=4096)
    else:
        rope = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16384, "rope_theta": 1e6,
                "llama_4_scaling_beta": 0.1}
        config = T.Ministral3Config(**common, num_key_value_heads=2, head_dim=64,
                                    max_position_embeddings=max(long_window, 131072), rope_parameters=rope)
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(config).to(DEVICE, torch.bfloat16).eval()


def eager_logp(model, ids):
    """layer -> log softmax probabilities [n_q, seq, seq] under the model's own eager attention (float64)."""
    decoder = model.get_decoder()
    probs, handles = {}, []
    for m in decoder.modules():
        if type(m).__name__.endswith("Attention") and getattr(m, "layer_idx", None) is not None:
            handles.append(m.register_forward_hook(lambda mod, a, out: probs.__setitem__(mod.layer_idx, out[1][0])))
    decoder.set_attn_implementation("eager")
    with torch.inference_mode():
        decoder(input_ids=ids, use_cache=False)
    decoder.set_attn_implementation("sdpa")
    for h in handles:
        h.remove()
    return {layer: torch.log(p.double()).cpu().numpy() for layer, p in probs.items()}


def check_short(family: str, seq: int) -> None:
    model = tiny(family, seq)
    capturer = Capturer(model, heads=None, attn="sdpa")
    ids = torch.randint(0, 1000, (1, seq), device=DEVICE)
    positions = sample_positions(seq, seq // 16, doc_id="gpu", seed=0, samples_per_bucket=4)
    with capturer:
        q, k = capturer.capture_window(ids[0].cpu().numpy(), positions)
    logp = eager_logp(model, ids)
    plan, worst, pairs = capturer.plan, 0.0, 0
    scaling = capturer.layout.head_dim ** -0.5
    visible = positions[None, :] <= positions[:, None]
    diag = np.arange(len(positions))
    for h in range(len(plan)):
        logits = q[h].astype(np.float64) @ k[h].astype(np.float64).T * scaling
        ref = logp[int(plan.layer[h])][int(plan.q_head[h])][np.ix_(positions, positions)]
        diff = (logits - logits[diag, diag][:, None]) - (ref - ref[diag, diag][:, None])
        worst = max(worst, float(np.abs(diff[visible]).max()))
        pairs += int(visible.sum()) - len(positions)
    layout = capturer.layout
    print(f"{family:10s} {seq} tokens, {len(plan)} heads, {pairs} pairs: max |captured - eager| logit difference "
          f"{worst:.3g}; rotary dims {int(layout.rotary_mask.sum())}/{layout.head_dim}; "
          f"query scale {'recorded' if layout.query_scale else 'none'}; finite {bool(np.isfinite(q).all())}")
    assert worst < 0.1, f"{family}: captured logits differ from eager by {worst}"


def check_long(seq: int) -> None:
    model = tiny("ministral3", seq)
    capturer = Capturer(model, heads=None, attn="sdpa")
    ids = torch.randint(0, 1000, (1, seq), device=DEVICE)
    positions = sample_positions(seq, seq // 16, doc_id="gpu-long", seed=0, samples_per_bucket=8)
    window = ids[0].cpu().numpy()
    capturer.bare_forward(window)  # warm-up
    sync()
    t0 = time.perf_counter()
    capturer.bare_forward(window)  # the forward the capture replaces: stopped at the same (last planned) layer
    sync()
    bare = time.perf_counter() - t0
    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    with capturer:
        t0 = time.perf_counter()
        q, k = capturer.capture_window(ids[0].cpu().numpy(), positions)
        sync()
        took = time.perf_counter() - t0
    scale = capturer.layout.query_scale(positions)
    formula = np.array([1 + 0.1 * math.log(1 + p // 16384) for p in positions])
    rounded = torch.as_tensor(formula).to(torch.bfloat16).double().numpy()
    print(f"ministral3 {seq} tokens: capture {took:.2f} s vs bare forward {bare:.2f} s "
          f"(peak {torch.cuda.max_memory_allocated() / 2**30 if DEVICE.startswith('cuda') else float('nan'):.2f} GiB); query_scale from {scale.min():.4f} to "
          f"{scale.max():.4f} (formula rounded to bf16 equal: {bool(np.array_equal(scale, rounded))}; "
          f"unrounded max {formula.max():.4f}); finite {bool(np.isfinite(q).all() and np.isfinite(k).all())}")
    assert np.array_equal(scale, rounded) and np.isfinite(q).all() and np.isfinite(k).all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=1024)
    parser.add_argument("--long", type=int, default=131072)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    name = torch.cuda.get_device_name(0) if DEVICE.startswith("cuda") else "CPU"
    print(f"{name}, torch {torch.__version__}, transformers {T.__version__}", flush=True)
    for family in ("gpt_neox", "olmo2", "ministral3"):
        check_short(family, args.short)
    check_long(args.long)


if __name__ == "__main__":
    main()
