"""Time and peak memory of a capture versus a bare forward pass on the same model, tokens, dtype and kernel.

Usage::

    python benchmarks/bench_capture.py                      # SmolLM2-135M, one 8192-token document
    python benchmarks/bench_capture.py --seq-len 1024 --repeats 1

What is measured
----------------
Every measurement runs in a fresh child process, alternating bare / capture,
so that neither inherits the other's allocator state. A child loads the model,
cuts the corpus's first ``seq-len``-token window, runs a 256-token warm-up of
its own kind, then measures one operation:

bare
    ``text_decoder(model)(input_ids, use_cache=False)`` under
    ``torch.inference_mode`` with the chosen attention kernel (sdpa by
    default): the forward pass the capture is built on, without lm_head logits.
capture
    :func:`qkplast.capture.driver.capture` of the same window, end to end: cutting the
    window from the corpus, the probe forward, head and position sampling, the
    forward pass through the capture hook (delegating to the same kernel; it stops
    once the last sampled layer's rows are copied, which skips that layer's
    attention and MLP), the part file and the final capture file written to a
    temporary directory.

Time is wall-clock (``time.perf_counter``) and process CPU time
(``time.process_time``, all threads). Wall-clock time on a shared machine only
grows with outside load, so its minimum over repeats is shown next to the
median. Peak memory is the peak resident set size of the child during the
operation: the kernel's high-water mark (``VmHWM``) is reset by writing ``5``
to ``/proc/self/clear_refs`` just before the operation and read just after; it
is shown in absolute terms and above the resident size at the start of the
operation (model, tokenizer and input already loaded). On CUDA the peak of
``torch.cuda.max_memory_allocated`` is shown as well. Unless already set, the
children run with ``MALLOC_MMAP_THRESHOLD_=65536`` and
``OMP_WAIT_POLICY=PASSIVE`` (see ``main`` for why). Ratios are capture / bare
of each column.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _child(args) -> dict:
    import torch

    from qkplast.capture.driver import capture, text_decoder
    from qkplast.capture.corpus import iter_windows, open_corpus
    from qkplast.capture.models import load_model
    from qkplast.options import CaptureOptions

    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    model.set_attn_implementation(args.attn)
    corpus = open_corpus(args.corpus)
    decoder = text_decoder(model)
    device = decoder.device
    options = dict(samples_per_bucket=args.samples_per_bucket, heads=args.heads, seed=args.seed, attn=args.attn,
                   docs=1, short_docs="concat")
    # Both kinds process the corpus's first window: capture() cuts it itself, the bare pass gets its tokens.
    ids = torch.as_tensor(next(iter_windows(corpus, tokenizer, args.seq_len)).input_ids, device=device)[None]

    def bare(n_tokens: int) -> None:
        with torch.inference_mode():
            decoder(input_ids=ids[:, :n_tokens], use_cache=False)  # [batch, seq, hidden]

    def captured(seq_len: int, bucket_size: int, out):
        chosen = CaptureOptions(seq_len=seq_len, bucket_size=bucket_size, **options)
        return capture(model, tokenizer, corpus, out, chosen, progress=False, model_info=loaded.info)

    # Warm-up on a short input: thread pools, kernel choice and lazy imports (for capture, also of the
    # netCDF writer) happen once per process, before measuring, as they would before a corpus's first document.
    with tempfile.TemporaryDirectory() as workdir:
        if args.mode == "bare":
            bare(256)
        else:
            captured(256, 16, Path(workdir) / "warm-up.nc")
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    result = {}
    with tempfile.TemporaryDirectory() as workdir:
        exact_peak = _reset_peak()
        rss_start = _status_kb("VmRSS")
        start, cpu_start = time.perf_counter(), time.process_time()
        if args.mode == "bare":
            bare(args.seq_len)
        else:
            ds = captured(args.seq_len, args.bucket_size, Path(workdir) / "capture.nc")
            result["heads"], result["samples"] = ds.sizes["head"], ds.sizes["sample"]
        if device.type == "cuda":
            torch.cuda.synchronize()
            result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["seconds"] = time.perf_counter() - start
        result["cpu_seconds"] = time.process_time() - cpu_start
        result["peak_rss_mb"] = (_status_kb("VmHWM") if exact_peak else _status_kb("VmPeak")) / 1024
    result.update(
        rss_start_mb=rss_start / 1024,
        exact_peak=exact_peak,
        model_class=type(model).__name__,
        dtype=str(model.dtype).removeprefix("torch."),
        device=str(device),
    )
    return result


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--corpus", default="pydoc-topics", help="the first window of this corpus is the input")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--bucket-size", type=int, default=None, help="default: seq-len / 16")
    p.add_argument("--samples-per-bucket", type=float, default=1.0)
    p.add_argument("--heads", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--repeats", type=int, default=3, help="measurements of each kind, interleaved")
    p.add_argument("--mode", choices=["bare", "capture"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bucket_size is None:
        args.bucket_size = max(1, args.seq_len // 16)
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    if args.mode:
        Path(args.result).write_text(json.dumps(_child(args)))
        return 0
    from qkplast.capture.models import DEFAULT_MODEL, prepare_default_model

    if args.model == DEFAULT_MODEL:
        prepare_default_model()  # the one-off conversion must not be timed
    forwarded = list(argv if argv is not None else sys.argv[1:])
    # Both kinds run with the same environment. A fixed mmap threshold stops glibc from raising it (and
    # then keeping freed blocks) as large tensors come and go, so peak RSS tracks live memory rather than
    # allocator history, which otherwise moves it by hundreds of MB between identical runs. Passive OpenMP
    # waiting keeps a forward pass from slowing down several-fold when another process holds a core.
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_WAIT_POLICY": "PASSIVE", **os.environ, "TQDM_DISABLE": "1"}
    runs = {"bare": [], "capture": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in ("bare", "capture"):
                result = Path(tmp) / f"{mode}-{i}.json"
                cmd = [sys.executable, __file__, *forwarded, "--mode", mode, "--result", str(result)]
                subprocess.run(cmd, check=True, env=env)
                runs[mode].append(json.loads(result.read_text()))
                r = runs[mode][-1]
                print(
                    f"  run {i + 1} {mode:7s}: wall {r['seconds']:7.2f} s, CPU {r['cpu_seconds']:7.2f} s, "
                    f"peak RSS {r['peak_rss_mb']:7.1f} MB ({r['peak_rss_mb'] - r['rss_start_mb']:6.1f} MB above start)",
                    flush=True,
                )
    for rs in runs.values():
        for r in rs:
            r["above_start_mb"] = r["peak_rss_mb"] - r["rss_start_mb"]
    columns = [
        ("wall min [s]", "seconds", min),
        ("wall median [s]", "seconds", statistics.median),
        ("CPU median [s]", "cpu_seconds", statistics.median),
        ("peak RSS [MB]", "peak_rss_mb", statistics.median),
        ("above start [MB]", "above_start_mb", statistics.median),
    ]
    if "cuda_peak_mb" in runs["bare"][0]:
        columns.append(("CUDA peak [MB]", "cuda_peak_mb", statistics.median))
    table = {mode: [agg(r[key] for r in rs) for _, key, agg in columns] for mode, rs in runs.items()}
    first = runs["capture"][0]
    peak_kind = "VmHWM reset per run" if first["exact_peak"] else "VmPeak (process lifetime; clear_refs unavailable)"
    print(
        f"model {args.model} ({first['model_class']}), {args.seq_len} tokens, {first['dtype']} on {first['device']}, "
        f"attention {args.attn}; capture of {first['heads']} heads x {first['samples']} samples; "
        f"{args.repeats} runs of each kind; peak memory: {peak_kind}, medians"
    )
    print(f"{'':14s}" + "".join(f"{name:>18s}" for name, _, _ in columns))
    for mode, label in (("bare", "bare forward"), ("capture", "capture")):
        print(f"{label:14s}" + "".join(f"{value:18.2f}" for value in table[mode]))
    ratios = ", ".join(
        f"{name.split(' [')[0]} {c / b:.3f}"
        for (name, _, _), b, c in zip(columns, table["bare"], table["capture"], strict=True)
    )
    print(f"ratio capture/bare: {ratios} (target: at most 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
