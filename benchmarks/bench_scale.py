"""Capture versus bare forward of one tiny model at 16K, 32K, 64K and 128K tokens: time ratio and memory slope.

Usage::

    PYTHONPATH=. python benchmarks/bench_scale.py                 # tiny Qwen3 (YaRN 4 x 32768), 16K..128K
    PYTHONPATH=. python benchmarks/bench_scale.py --lengths 4096 8192 16384
    PYTHONPATH=. python benchmarks/bench_scale.py --kappa         # measure qkplast.capture.plan.MEASURED_KAPPA

What is measured
----------------
Each (length, kind) runs in a fresh child process (as in
``benchmarks/bench_capture.py``, whose peak-RSS and timing helpers it uses):
the child builds the tiny random-weight model of ``tests/hub_fixtures.py``
(seeded), cuts the first window of a long prose document (pydoc topics,
repeated) with the fixture's tokenizer, warms up on 256 tokens, then measures
one operation ``--repeats`` times (best wall time kept; peak RSS of the first):

bare
    ``text_decoder(model)(input_ids, use_cache=False)`` under inference mode (sdpa).
hooked
    the same forward through the capture entry point
    (:meth:`qkplast.capture.recorder.Capturer.capture_window`): the attention hook
    copies the sampled rows of every head, checks them for NaN/Inf and returns
    them; bucket ``seq_len / 16``, 8 samples per bucket, every head. It stops
    once the last layer's rows are copied (that layer's attention kernel and MLP
    and the final norm never run), so on a model of few layers it costs less
    than the whole bare forward: the ratios below are then below 1.
capture
    :func:`qkplast.capture.driver.capture` of the same window end to end (window
    cut, probe, the hooked forward, capture file written).

Columns: wall and CPU seconds of each kind; ``+tok``, the seconds tokenizing
the document takes (``qkplast.capture.corpus.iter_windows``, best of the repeats); the
ratios hooked/bare (what the capture adds to a forward pass), capture/bare
(the same plus the per-run fixed costs: tokenizing the document, the probe
forward and the netCDF write, about 0.1 s here, which a thesis-scale forward of
minutes amortises) and ``c/b+t``, capture() against the same document run
without qkplast (tokenized, then the bare forward): the 1.05 targets are
hooked/bare and ``c/b+t``;
peak RSS above the start of the operation (VmHWM reset through
``/proc/self/clear_refs``); the per-token memory slope between consecutive
lengths, ``(peak[n2] - peak[n1]) / (n2 - n1)``. Memory grows linearly when the
slopes agree within 10 %; the capture costs at most 5 % more time when the
ratio is at most 1.05.

``--kappa`` measures, for each architecture of ``tests/hub_fixtures.py``, the
bare forward's peak-RSS slope between 8K and 32K tokens and divides it by the
bytes :func:`qkplast.capture.plan.live_elements_per_token` counts: the ratio
``qkplast.capture.plan`` uses to predict activation memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_capture import _reset_peak, _status_kb  # noqa: E402


def _child(args) -> dict:
    import torch

    from hub_fixtures import long_corpus, tiny_model, tiny_tokenizer
    from qkplast.capture.driver import capture, text_decoder
    from qkplast.capture.corpus import Document, iter_windows
    from qkplast.options import CaptureOptions
    from qkplast.capture.recorder import Capturer
    from qkplast.capture.sampling import sample_positions

    torch.set_num_threads(args.threads)
    model, tokenizer = tiny_model(args.arch).to(getattr(torch, args.dtype)), tiny_tokenizer()
    if args.arch == "qwen3":
        from qkplast.capture.models import apply_rope_scaling, parse_rope_scaling

        # The YaRN override as load_model applies it, then the rotary embedding rebuilt from the config.
        apply_rope_scaling(model.config, parse_rope_scaling("yarn:4:32768"))
        model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    with tempfile.TemporaryDirectory() as tmp:
        first = long_corpus(Path(tmp) / "long.jsonl", n_chars=int(args.seq_len * 5.5), docs=1).read_text()
        text = json.loads(first.splitlines()[0])["text"]
    docs = [Document("long prose", text)]
    decoder = text_decoder(model)
    ids = torch.as_tensor(next(iter_windows(docs, tokenizer, args.seq_len, short_docs="skip")).input_ids)[None]

    def bare(n: int) -> None:
        with torch.inference_mode():
            decoder(input_ids=ids[:, :n], use_cache=False)  # [batch, seq, hidden]

    def options(n: int) -> CaptureOptions:
        return CaptureOptions(seq_len=n, bucket_size=n // 16, samples_per_bucket=8, heads=None, docs=1,
                              short_docs="skip", device="cpu")

    def captured(n: int, out):
        return capture(model, tokenizer, docs, out, options(n), progress=False)

    capturer = Capturer(model, heads=None, seed=0)

    def hooked(n: int) -> int:
        opt = options(n)
        positions = sample_positions(n, opt.bucket_size, doc_id=docs[0].id, seed=opt.seed,
                                     samples_per_bucket=opt.samples_per_bucket, min_per_bucket=opt.min_per_bucket)
        with capturer:
            q, _ = capturer.capture_window(ids[0, :n].numpy(), positions)  # [head, sample, dim]
        return q.shape[1]

    with tempfile.TemporaryDirectory() as workdir:
        {"bare": bare, "hooked": hooked}.get(args.mode, lambda n: captured(n, Path(workdir) / "warm-up.nc"))(256)
    def once(workdir: Path, i: int) -> None:
        if args.mode == "bare":
            bare(args.seq_len)
        elif args.mode == "hooked":
            result["samples"] = hooked(args.seq_len)
        else:
            result["samples"] = captured(args.seq_len, workdir / f"capture-{i}.nc").sizes["sample"]

    result, times = {}, []
    with tempfile.TemporaryDirectory() as workdir:
        exact = _reset_peak()
        rss_start = _status_kb("VmRSS")
        for i in range(args.repeats):  # the peak is that of the first run; the time the best of all
            start, cpu_start = time.perf_counter(), time.process_time()
            once(Path(workdir), i)
            times.append((time.perf_counter() - start, time.process_time() - cpu_start))
            if i == 0:
                result["above_start_mb"] = ((_status_kb("VmHWM") if exact else _status_kb("VmPeak")) - rss_start) / 1024
    result["seconds"], result["cpu_seconds"] = min(times)
    if args.mode == "bare":  # what running the model on this document takes besides the forward: its tokens
        tokenize = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            next(iter_windows(docs, tokenizer, args.seq_len, short_docs="skip"))
            tokenize.append(time.perf_counter() - start)
        result["tokenize_seconds"] = min(tokenize)
    return result


def _run_child(forwarded: list[str], tmp: str) -> dict:
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_WAIT_POLICY": "PASSIVE", **os.environ, "TQDM_DISABLE": "1"}
    out = Path(tmp) / "result.json"
    subprocess.run([sys.executable, __file__, *forwarded, "--result", str(out)], check=True, env=env)
    return json.loads(out.read_text())


def _slopes(lengths, peaks_mb) -> list[float]:
    """Bytes per token between consecutive lengths."""
    return [(peaks_mb[i + 1] - peaks_mb[i]) * 2**20 / (lengths[i + 1] - lengths[i]) for i in range(len(lengths) - 1)]


def _agree(slopes: list[float], tolerance: float = 0.10) -> bool:
    return max(slopes) <= (1 + tolerance) * min(slopes) and min(slopes) > 0


MODES = ("bare", "hooked", "capture")


def scale(args) -> int:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lengths:
            for mode in MODES:
                r = _run_child(["--arch", args.arch, "--seq-len", str(n), "--mode", mode,
                                "--threads", str(args.threads), "--repeats", str(args.repeats)], tmp)
                rows[(n, mode)] = r
                print(f"  {n:7d} {mode:7s}: wall {r['seconds']:8.2f} s, CPU {r['cpu_seconds']:8.2f} s, "
                      f"peak RSS above start {r['above_start_mb']:8.1f} MB", flush=True)
    lengths = list(args.lengths)
    slope = {mode: _slopes(lengths, [rows[(n, mode)]["above_start_mb"] for n in lengths]) for mode in MODES}
    print(f"\ntiny {args.arch} (hub_fixtures: hidden 64, 2 layers, 2 query / 1 key heads of dim 8), sdpa, float32, "
          f"CPU, {args.threads} thread(s); one fresh process per cell, best of {args.repeats} runs.\nhooked = the "
          "forward through the capture hook; capture = capture() end to end (tokenizing, probe, hooked forward, "
          "file write)")
    head = (f"{'tokens':>7} | {'wall bare':>9} {'+tok':>6} {'hooked':>7} {'capture':>7} {'h/b':>6} {'c/b':>6} "
            f"{'c/b+t':>6} | "
            f"{'CPU bare':>8} {'hooked':>7} {'h/b':>6} | {'RSS+ bare':>9} {'hooked':>7} {'capture':>7} [MB] | "
            f"{'slope bare':>10} {'hooked':>7} {'capture':>7} [B/token]")
    print(head)
    print("-" * len(head))
    ratios, end_to_end, same_work = [], [], []
    for i, n in enumerate(lengths):
        b, h, c = (rows[(n, m)] for m in MODES)
        ratios.append(h["seconds"] / b["seconds"])
        end_to_end.append(c["seconds"] / b["seconds"])
        same_work.append(c["seconds"] / (b["seconds"] + b["tokenize_seconds"]))
        slopes = " ".join(f"{slope[m][i - 1]:{w}.0f}" if i else " " * w for m, w in zip(MODES, (10, 7, 7)))
        print(f"{n:7d} | {b['seconds']:9.2f} {b['tokenize_seconds']:6.2f} {h['seconds']:7.2f} {c['seconds']:7.2f} "
              f"{ratios[-1]:6.3f} {end_to_end[-1]:6.3f} {same_work[-1]:6.3f} | {b['cpu_seconds']:8.2f} {h['cpu_seconds']:7.2f} "
              f"{h['cpu_seconds'] / b['cpu_seconds']:6.3f} | {b['above_start_mb']:9.1f} {h['above_start_mb']:7.1f} "
              f"{c['above_start_mb']:7.1f}      | {slopes}")
    fixed = [rows[(n, "capture")]["seconds"] - rows[(n, "hooked")]["seconds"] for n in lengths]
    linear = {mode: _agree(s) for mode, s in slope.items()}
    print("memory linear in seq_len (slopes agree within 10%): "
          + ", ".join(f"{m} {linear[m]}" for m in MODES))
    print(f"hooked/bare wall time at most 1.05 at every length: {all(r <= 1.05 for r in ratios)} "
          f"(ratios {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"capture() end to end / (tokenizing the document + bare forward), the same document without qkplast: "
          f"{', '.join(f'{r:.3f}' for r in same_work)}; at most 1.05 at every length: {all(r <= 1.05 for r in same_work)}")
    tokenizing = ", ".join(f"{rows[(n, 'bare')]['tokenize_seconds']:.2f}" for n in lengths)
    print(f"capture() end to end / bare forward alone: {', '.join(f'{r:.3f}' for r in end_to_end)}; its fixed cost over "
          f"the hooked forward (tokenizing {tokenizing} s of it, probe, file write): "
          f"{', '.join(f'{f:.2f}' for f in fixed)} s")
    ok = all(linear.values()) and all(r <= 1.05 for r in ratios) and all(r <= 1.05 for r in same_work)
    return 0 if ok else 1


def measure_slope(arch: str, lengths=(8192, 32768), dtype: str = "float32", threads: int = 1) -> float:
    """Bytes per token of a bare forward's peak RSS between two lengths, each in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        peaks = [_run_child(["--arch", arch, "--seq-len", str(n), "--mode", "bare", "--threads", str(threads),
                             "--repeats", "1", "--dtype", dtype], tmp)["above_start_mb"] for n in lengths]
    return _slopes(list(lengths), peaks)[0]


def kappa(args) -> int:
    from hub_fixtures import ARCHITECTURES, tiny_config
    from qkplast.capture.plan import live_elements_per_token

    lengths = [8192, 16384, 32768]
    print(f"bare forward peak-RSS slope over {lengths} tokens (float32, CPU), measured / counted bytes per token")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHITECTURES:
            peaks = [_run_child(["--arch", arch, "--seq-len", str(n), "--mode", "bare",
                                 "--threads", str(args.threads)], tmp)["above_start_mb"] for n in lengths]
            slopes = _slopes(lengths, peaks)
            counted = 4 * live_elements_per_token(tiny_config(arch))
            print(f"  {arch:8s}: peaks {', '.join(f'{p:.1f}' for p in peaks)} MB; slopes "
                  f"{', '.join(f'{s:.0f}' for s in slopes)} B/token; counted {counted} B/token; "
                  f"kappa {slopes[-1] / counted:.2f}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="qwen3", help="architecture of tests/hub_fixtures.py")
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per cell (the best is kept; one machine's "
                   "noise is a few percent, the size of the 1.05 target)")
    p.add_argument("--kappa", action="store_true", help="measure the planner's activation coefficient")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the model's dtype")
    p.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode:
        Path(args.result).write_text(json.dumps(_child(args)))
        return 0
    return kappa(args) if args.kappa else scale(args)


if __name__ == "__main__":
    sys.exit(main())
