"""The one-command GPU check (issue 23): the README's thesis-scale ``qkplast run`` at 131072 tokens on one GPU.

It builds a random-weight model of a published architecture from its config, embedded below as a dict
(``qwen3-8b`` by default; ``llama-3.1-8b`` and ``ministral-3-14b``, the text decoder of Ministral-3-14B, are
selectable; nothing is downloaded), saves it in a local Hugging Face hub-cache layout at a fixed fake commit,
and runs the README's thesis-scale commands, read from the README itself (the dry run, then the run), with only
the model (that commit), the corpus (generated documents of 131072+ tokens, then the shorter ones chapter 12
reads), ``--docs`` and ``--out`` substituted, through every stage including chapters 12 and 13 (their grids
reduced with ``-p`` on the GPU). It prints

* capture time per window against a bare forward of the same window stopped where the capture stops (the
  ratio: what the hook and the copies cost),
* peak GPU memory of the capture against the plan (``qkplast plan``'s expected peak),
* seconds per window, and the analysis and bootstrap times on the GPU,
* every notebook's status and seconds, with the traceback of each that failed,
* the time of each stage and of the whole check against its budget (one device call, 10 minutes).

Budget: one call of the device tool (10 minutes). Measured on one H100 on 2026-11-27 (README, "The GPU check"):
building and saving the 16 GB of random weights 41 s; bare forward 32 s (a warm-up and the timed one);
``qkplast run`` 458 s: the model load and 2 windows plus the code capture 89 s, analyses and 1000 bootstrap
replicates 10 s, 13 notebooks 341 s (13-24 s each for the kernel start and imports on that machine; chapters 12
and 13, which load the model again and run their reduced grids, 66 s and 43 s); 540 s in all. The script prints
the budget it used and exits 1 when it ran over or any notebook failed. ``qkplast run`` stops at the first
failing notebook; the check then executes the notebooks it did not reach, each alone, and prints every
notebook's status and each failure's traceback, so that one call shows every failure.

Prepare here (a machine with PyPI), once, the wheels the GPU machine lacks (cp312 manylinux x86_64, with the
device README's exact ``pip download`` flags) and a wheel of qkplast itself (it ships chapter 10's training corpus,
the pinned snapshot ``data/corpora/python-docs.tar.xz``, so no Debian package is carried)::

    echo /.whl/ >> .git/info/exclude
    .venv/bin/python benchmarks/bench_gpu.py --prepare-wheels .whl

Then run it on the device (the ``run`` tool of this workplace; ``carry`` the wheels)::

    run(carry=[".whl"], timeout_s=600, command=
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
        ".whl/*.whl && export PYTHONPATH=/tmp/site || exit; "
        "PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python3 benchmarks/bench_gpu.py "
        "2>&1 | tee $OUT/bench_gpu.log")

``--estimate`` prints the expected wall time of a 500-document thesis capture per config from the measured
seconds per window (no GPU). ``--selftest-cpu`` rehearses the same path here on the CPU with a tiny config of the
same architecture: the README's commands exactly as written (131072 tokens, the notebooks' own parameters), so the
acceptance tier's one execution of them (``tests/acceptance/test_rehearsal.py``, from a non-editable install) is
this check's own rehearsal too (about seven minutes on two cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the README reader and the stand-in tokenizer and corpus of the tests

#: Published configs (dimensions transcribed from each model's config.json on the hub).
CONFIGS = {
    "qwen3-8b": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                     "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}},
    "ministral-3-14b": {"model_type": "ministral3", "hidden_size": 5120, "intermediate_size": 16384,
                        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                        "vocab_size": 131072, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
                        "tie_word_embeddings": False,
                        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000000.0, "factor": 16.0,
                                            "original_max_position_embeddings": 16384, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                            "llama_4_scaling_beta": 0.1}},
    # the CPU rehearsal: Qwen3's architecture at the tests' tiny size (hub_fixtures), same YaRN extension
    "tiny": {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 300,
             "max_position_embeddings": 32768, "tie_word_embeddings": False},
}
#: Notebook grids reduced for the check (each a notebook parameter; the capture is the README's, unchanged).
REDUCED = {"n_boot": 1000, "n_null": 8, "n_perm": 200, "window": 8192, "positions": [4608, 7936],
           "distances": [256, 4096], "copy_windows": 3, "n_reseeds": 19,
           "rope_factors": [2.0], "window_factors": [1], "cond_docs": 2, "training": "smoke"}
#: What the GPU machine's image already holds (the device KINDS.md package list), by normalised name.
ON_THE_GPU = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
#: qkplast's requirements the check does not use (the book's toolchain, the embedded GGUF model, HF datasets).
NOT_FOR_THE_CHECK = {"jupyter-book", "sphinx-proof", "sphinxcontrib-bibtex", "sphinx-mathjax-offline", "gguf",
                     "datasets"}
PIP_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                 "manylinux1_x86_64")
BUDGET_S = 600  # one device call (the device tool's limit per command)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# --------------------------------------------------------------------------- wheels (here, with PyPI)


def missing_packages() -> dict[str, str]:
    """``{name: version}`` of every distribution ``qkplast run`` needs that the GPU image lacks.

    The closure of qkplast's requirements (those the check uses) through the installed distributions'
    metadata, markers evaluated for CPython 3.12 on Linux, minus :data:`ON_THE_GPU`; versions are the ones
    installed here, which the tests ran with.
    """
    from importlib import metadata

    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    todo, seen, out = ["qkplast"], set(), {}
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        if name != "qkplast" and name not in ON_THE_GPU:
            out[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if _norm(req.name) in NOT_FOR_THE_CHECK or _norm(req.name) in ON_THE_GPU:
                continue
            todo.append(req.name)
    return dict(sorted(out.items()))


def prepare_wheels(target: Path) -> None:
    """Download the missing wheels for cp312 manylinux x86_64 (the device README's flags) and build qkplast's."""
    target.mkdir(parents=True, exist_ok=True)
    packages = missing_packages()
    print(f"{len(packages)} distributions the GPU image lacks: " + ", ".join(f"{k}=={v}" for k, v in packages.items()))
    platforms = [x for p in PIP_PLATFORMS for x in ("--platform", p)]
    for name, version in packages.items():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(target),
                        f"{name}=={version}"], check=True)
    # a python3*-doc .deb: chapter 10's corpus as carried before it was pinned (data/corpora, inside the wheel)
    for old in [*target.glob("qkplast-*.whl"), *target.glob("python3*-doc_*.deb")]:
        old.unlink()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(target), str(ROOT)], check=True)
    size = sum(p.stat().st_size for p in target.glob("*.*")) / 2**20
    print(f"{len(list(target.glob('*.whl')))} wheels, {size:.1f} MiB in {target} (the device carries at most 64 MiB)")


# --------------------------------------------------------------------------- the model and corpus stand-ins


def build_model(name: str, cache: Path, device: str) -> tuple[str, str]:
    """A random-weight model of ``CONFIGS[name]`` in hub-cache layout under ``cache``; ``(repo id, commit)``."""
    import torch
    import transformers as T

    from helpers import tiny_tokenizer

    spec = dict(CONFIGS[name])
    config = T.AutoConfig.for_model(spec.pop("model_type"), **spec)
    commit = hashlib.sha1(json.dumps(CONFIGS[name], sort_keys=True).encode()).hexdigest()
    repo = f"qkplast-bench/random-{name}"
    snapshot = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit
    if not (snapshot / "config.json").exists():
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        with torch.device("meta"):
            model = T.AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.to_empty(device=device)
        gen = torch.Generator(device=device).manual_seed(0)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        snapshot.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(snapshot)
        tiny_tokenizer().save_pretrained(snapshot)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    (snapshot.parent.parent / "refs").mkdir(exist_ok=True)
    (snapshot.parent.parent / "refs" / "main").write_text(commit)
    return repo, commit


def make_corpus(path: Path, seq_len: int, docs: int, shorter: tuple[int, int] = (0, 0)) -> Path:
    """``docs`` documents of prose long enough for one ``seq_len``-token window each with the stand-in tokenizer, then
    ``shorter[0]`` documents of ``shorter[1]`` tokens or more, as a real corpus has beside its long ones: chapter 12
    reads windows of its own from documents after the run's (:func:`shorter_documents`)."""
    from hub_fixtures import long_corpus

    long_corpus(path, n_chars=int(seq_len * 2.2) + 10000, docs=docs)
    count, tokens = shorter
    if count:
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
        chars = int(tokens * 4.5) + 2000  # the stand-in tokenizer: about 3.7 characters per token
        step = (len(text) - chars) // max(count, 1)
        with path.open("a") as f:
            for i in range(count):
                f.write(json.dumps({"id": f"short{i}", "text": text[i * step: i * step + chars]}) + "\n")
    return path


def shorter_documents(full: list[str], notebook_params: dict) -> tuple[int, int]:
    """How many documents chapter 12 reads after the run's (its geometry capture's windows, raised to what the
    run's sampling needs, then its behaviour windows) and their tokens (its window), with ``notebook_params``
    over the notebook's defaults."""
    from qkplast.experiments.head_interventions import geometry_plan
    from qkplast.pipeline.params import notebook_parameters

    grid = {**notebook_parameters(), **notebook_params}
    samples = float(full[full.index("--samples-per-bucket") + 1]) if "--samples-per-bucket" in full else 1.0
    return geometry_plan(samples, int(grid["geometry_docs"]))[0] + int(grid["copy_windows"]), int(grid["window"])


def dry_run(argv: list[str]) -> tuple[int, str]:
    """The README's ``--dry-run`` command in this process: its exit status and what it printed."""
    import contextlib
    import io

    from qkplast.pipeline.cli import main as qkplast

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = qkplast(argv)
    return code, printed.getvalue()


# --------------------------------------------------------------------------- wall time of a thesis capture

#: Issue 23's measurement: Qwen3-8B's shape, one 131072-token window, one H200 (capture 1.01x a whole bare forward,
#: measured before the capture stopped at its last planned layer).
MEASURED = {"config": "qwen3-8b", "seconds_per_window": 13.5, "card": "H200"}


def window_flops(name: str, seq_len: int = 131072) -> float:
    """FLOPs of one capture forward (no LM head): ``2 x matmul parameters x tokens`` plus causal attention,
    ``2 x layers x tokens^2 x query heads x head_dim`` (QK^T and PV over the lower triangle)."""
    import torch
    import transformers as T

    spec = dict(CONFIGS[name])
    config = T.AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(config)
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
                 and "lm_head" not in n)
    n_q, d, layers = config.num_attention_heads, config.head_dim, config.num_hidden_layers
    return 2 * matmul * seq_len + 2 * layers * seq_len**2 * n_q * d


def estimate_wall_time(docs: int = 500) -> list[str]:
    """Expected hours of a ``docs``-document thesis capture per embedded config on one GPU: the measured
    seconds per window (:data:`MEASURED`) scaled by :func:`window_flops`."""
    rate = window_flops(MEASURED["config"]) / MEASURED["seconds_per_window"]
    lines = [f"measured: {MEASURED['config']} {MEASURED['seconds_per_window']} s/window on an {MEASURED['card']} "
             f"-> {rate / 1e12:.0f} TFLOP/s effective"]
    for name in (n for n in CONFIGS if n != "tiny"):
        flops = window_flops(name)
        seconds = flops / rate
        lines.append(f"{name}: {flops / 1e15:.2f} PFLOP/window, {seconds:.1f} s/window, {docs} windows "
                     f"{docs * seconds / 3600:.2f} h")
    return lines


# --------------------------------------------------------------------------- measuring


def bare_forward_s(repo: str, commit: str, options, corpus: Path) -> float:
    """Seconds of the forward a capture of the first window replaces, without the capture's hook and copies (after
    one warm-up): the model's own attention, stopped where the capture stops (the last planned layer,
    :meth:`qkplast.capture.recorder.Capturer.bare_forward`), so the ratio is what capturing costs."""
    import numpy as np

    from qkplast.capture.corpus import iter_windows, open_corpus
    from qkplast.capture.models import load_for, release_model
    from qkplast.capture.recorder import Capturer

    loaded = load_for(options)
    window = next(iter_windows(open_corpus(str(corpus)), loaded.tokenizer, options.seq_len,
                               short_docs=options.short_docs))
    capturer = Capturer(loaded.model, heads=options.heads, seed=options.seed, attn=options.attn,
                        allow_unverified=options.allow_unverified)  # the capture's heads, so it stops where it stops
    times = []
    for _ in range(2):
        _sync()
        t0 = time.perf_counter()
        capturer.bare_forward(np.asarray(window.input_ids))
        _sync()
        times.append(time.perf_counter() - t0)
    release_model(loaded)
    return times[-1]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_windows() -> list[float]:
    """Wrap the capture's forward so each window's seconds are recorded (synchronised)."""
    from qkplast.capture import recorder

    seconds: list[float] = []
    original = recorder.Capturer.capture_window

    def timed(self, *args, **kwargs):
        _sync()
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            _sync()
            seconds.append(time.perf_counter() - t0)

    recorder.Capturer.capture_window = timed
    return seconds


def notebooks_left(out: Path, notebook_params: dict) -> list[dict]:
    """Execute, each on its own, the notebooks a failed ``qkplast run`` did not execute; their manifest entries.

    ``qkplast run`` stops at the first failing notebook (its contract); a GPU check is one call on a lent machine,
    so it goes on here and reports every notebook, so that one call shows every failure.
    """
    from qkplast.errors import QkplastError
    from qkplast.pipeline.params import notebook_paths
    from qkplast.pipeline.stages import notebook_stage
    from qkplast.rundir.products import write_manifest

    manifest = json.loads((out / "manifest.json").read_text())
    done = {e["name"] for e in manifest.get("notebooks", [])}
    entries = list(manifest.get("notebooks", []))
    for path in (Path(p).resolve() for p in notebook_paths()):
        if path.name in done:
            continue
        manifest["notebooks"] = []
        try:
            notebook_stage(out, manifest, notebook_params, [path], progress=False)
        except QkplastError:
            pass  # recorded in the manifest entry, printed by the caller
        entries += manifest["notebooks"]
    manifest["notebooks"] = entries  # each call above recorded its one notebook: the run's manifest lists them all
    write_manifest(out, manifest)
    return entries


def failure_trace(executed: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of the error traceback in an executed notebook (ANSI colours removed)."""
    import re

    if not executed.exists():
        return "(no executed copy)"
    for cell in json.loads(executed.read_text())["cells"]:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(output.get("traceback", [])))
                return "\n".join(text.splitlines()[-lines:])
    return "(no error output)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="qwen3-8b")
    parser.add_argument("--selftest-cpu", action="store_true", help="the same path on the CPU with the tiny config")
    parser.add_argument("--prepare-wheels", type=Path, default=None, metavar="DIR",
                        help="download (here) the wheels the GPU machine lacks, and a wheel of qkplast, into DIR")
    parser.add_argument("--docs", type=int, default=2, help="windows of the main capture (default: %(default)s)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/qkplast-bench-gpu"), help="hub cache, corpus, run")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--estimate", action="store_true",
                        help="print the expected wall time of a 500-document thesis capture per config (no GPU) and exit")
    args = parser.parse_args(argv)
    if args.prepare_wheels is not None:
        prepare_wheels(args.prepare_wheels)
        return 0
    if args.estimate:
        print("\n".join(estimate_wall_time()))
        return 0

    t_start = time.perf_counter()
    name = "tiny" if args.selftest_cpu else args.config
    device = "cpu" if args.selftest_cpu else "cuda"
    args.work.mkdir(parents=True, exist_ok=True)
    cache = args.work / "hub"
    os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    from huggingface_hub import constants

    constants.HF_HUB_CACHE = str(cache)
    import torch

    from readme_commands import readme_commands, substitute
    from qkplast.pipeline.cli import main as qkplast

    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here; use --selftest-cpu for the CPU rehearsal", file=sys.stderr)
        return 2
    card = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"bench_gpu: {name} on {card}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}", flush=True)
    stamps = {}
    t0 = time.perf_counter()
    repo, commit = build_model(name, cache, device)
    stamps["build and save the random model"] = time.perf_counter() - t0

    dry, full = readme_commands()
    seq_len = int(full[full.index("--seq-len") + 1])
    values = {"model": f"{repo}@{commit}", "docs": args.docs}
    # the notebooks' own defaults on the CPU (the README's command as written); on the GPU their grids reduced
    notebook_params = {} if args.selftest_cpu else REDUCED
    corpus = make_corpus(args.work / f"corpus-{seq_len}-{args.docs}-{'cpu' if args.selftest_cpu else 'gpu'}.jsonl",
                         seq_len, args.docs, shorter=shorter_documents(full, notebook_params))
    values["corpus"] = corpus
    out = args.work / f"run-{name}"
    argv = (substitute(full, **values, out=out)
            + [x for k, v in notebook_params.items() for x in ("-p", k, json.dumps(v))])

    t0 = time.perf_counter()
    checked = dry_run(substitute(dry, **values))
    stamps["the README's dry run"] = time.perf_counter() - t0
    from qkplast.capture.plan import plan_capture
    from qkplast.pipeline.cli import build_parser
    from qkplast.pipeline.cli_capture import capture_options
    from qkplast.pipeline.params import split_parameters

    parsed = build_parser().parse_args(argv)
    options = capture_options(parsed, **split_parameters(parsed.parameter)[0])
    options = options.__class__(**{**options.to_dict(), "device": device})
    plan = plan_capture(options, count=False)

    t0 = time.perf_counter()
    bare = bare_forward_s(repo, commit, options, corpus)
    stamps["bare forward (one window, after a warm-up)"] = time.perf_counter() - t0

    windows = timed_windows()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    code = qkplast(argv + ["--no-progress"])
    stamps["qkplast run (every stage)"] = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 2**30 if device == "cuda" else float("nan")
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
    timings = manifest.get("timings_s", {})
    entries = manifest.get("notebooks", [])
    if code != 0 and entries:  # the run reached the notebooks and stopped at one: the others too, each alone
        t0 = time.perf_counter()
        entries = notebooks_left(out, split_parameters(parsed.parameter)[2])
        stamps["notebooks the run did not reach, each alone"] = time.perf_counter() - t0
    total = time.perf_counter() - t_start

    print(f"\ndry run (README, model/corpus/docs substituted): exit status {checked[0]}\n{checked[1].rstrip()}")
    grids = "the notebooks' own parameters" if args.selftest_cpu else "reduced notebook grids"
    print(f"\ncommand (README, model/corpus/docs/out substituted, {grids}): qkplast {' '.join(map(str, argv))}")
    print(f"exit status {code}; run directory {out}")
    main_windows = windows[:args.docs]
    per_window = sum(main_windows) / max(1, len(main_windows))
    print(f"seconds per window (main capture, {len(main_windows)} windows of {seq_len} tokens): {per_window:.2f}")
    print(f"bare forward of the same window (to the capture's last layer): {bare:.2f} s; "
          f"capture / bare = {per_window / bare:.3f}")
    print(f"peak GPU memory of the process (capture, analyses): {peak:.1f} GiB allocated, {reserved:.1f} GiB reserved; "
          f"plan's expected peak {plan.peak_gb:.1f} GiB (weights {plan.weights_gb:.1f} + activations "
          f"{plan.activations_gb:.1f} + CUDA overhead); measured / plan = {peak / plan.peak_gb:.3f}")
    print(f"{manifest.get('code', {}).get('note', 'code capture: -')}; its windows took "
          f"{sum(windows[args.docs:]):.1f} s")
    for key in ("analyze:run", "bootstrap:run", "analyze:code", "bootstrap:code"):
        if key in timings:
            print(f"{key.replace(':', ' of the ')} on the {'GPU' if device == 'cuda' else 'CPU'}: {timings[key]:.1f} s")
    failed = [e for e in entries if e.get("status") != "ok"]
    print(f"notebooks: {len(entries) - len(failed)} of {len(entries)} passed, in "
          f"{sum(e.get('seconds') or 0 for e in entries):.0f} s")
    for e in entries:
        print(f"  {e['name']}: " + (f"ok, {e['seconds']:.0f} s" if e.get("status") == "ok" else
                                    f"FAILED in cell {e.get('cell')}: {e.get('error')}"))
    for e in failed:
        print(f"--- traceback of {e['name']} ---\n{failure_trace(out / 'notebooks' / e['name'])}")
    for stage, seconds in stamps.items():
        print(f"  {stage}: {seconds:.0f} s")
    print(f"budget: {total:.0f} s used of {args.budget_s:.0f} s")
    return 0 if code == 0 and checked[0] == 0 and not failed and total <= args.budget_s else 1


if __name__ == "__main__":
    sys.exit(main())
