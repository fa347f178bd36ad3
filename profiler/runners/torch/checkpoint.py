"""Load and save Llama-style checkpoints: an HF `config.json` and `*.safetensors` weights with HF names."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from itertrace.errors import UserError
from itertrace.profiler.runners.torch.model import DTYPES, ModelConfig, Transformer, empty_model

# ModelConfig field <- config.json key; keys absent from REQUIRED take HF LlamaConfig's defaults.
HF_CONFIG_KEYS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "max_position": "max_position_embeddings",
    "tie_word_embeddings": "tie_word_embeddings",
}
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "rms_norm_eps", "max_position_embeddings")


def hf_name(name: str) -> str:
    """HF Llama name of one of our parameters (ours lack the `model.` prefix)."""
    return name if name.startswith("lm_head.") else f"model.{name}"


def read_config(directory: Path, dtype: str | None = None) -> ModelConfig:
    """The ModelConfig described by `directory/config.json`; dtype from its `torch_dtype`/`dtype` unless given."""
    path = directory / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (a checkpoint directory needs config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a JSON object")
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise UserError(f"{path}: missing key {', '.join(missing)}")
    problem = _unsupported(raw)
    if problem:
        raise UserError(f"{path}: {problem} is not supported by itertrace's Llama model")
    # transformers 5 moved rope_theta into rope_parameters
    raw.setdefault("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
    fields = {field: raw[key] for field, key in HF_CONFIG_KEYS.items() if raw.get(key) is not None}
    fields.setdefault("num_kv_heads", raw["num_attention_heads"])
    for field, value in fields.items():
        expected = type(getattr(ModelConfig, field))  # the default's type: int, float or bool
        if not _is_valid(value, expected):
            raise UserError(f"{path}: {HF_CONFIG_KEYS[field]}={value!r} is not a valid {expected.__name__}")
    saved_dtype = raw.get("torch_dtype") or raw.get("dtype")
    fields["dtype"] = dtype or (saved_dtype if saved_dtype in DTYPES else "float32")
    try:
        config = ModelConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: {exc}") from None
    if raw.get("head_dim", config.head_dim) != config.head_dim:
        raise UserError(f"{path}: head_dim {raw['head_dim']} is not hidden_size / num_attention_heads")
    return config


def _unsupported(raw: dict) -> str | None:
    """The first Llama variant in the config that this model does not implement (it would give wrong logits)."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = raw.get(key) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if rope_type != "default":
            return f"{key}={rope!r}"
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            return f"{key}={raw[key]!r}"
    if raw.get("hidden_act", "silu") != "silu":
        return f"hidden_act={raw['hidden_act']!r}"
    return None


def _is_valid(value: object, expected: type) -> bool:
    """True for a bool where a bool is expected, else for a positive number of the expected kind."""
    if expected is bool or isinstance(value, bool):
        return isinstance(value, bool) and expected is bool
    kinds = (int, float) if expected is float else (int,)
    return isinstance(value, kinds) and value > 0


def load_checkpoint(path: str | Path, *, device: torch.device | str = "cpu", dtype: str | None = None) -> Transformer:
    """A Transformer with the weights of the checkpoint directory `path`."""
    directory = Path(path)
    if not directory.is_dir():
        raise UserError(f"{directory}: not a checkpoint directory")
    model = empty_model(read_config(directory, dtype), device)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"{directory}: no *.safetensors weight files")
    unfilled = {hf_name(name): param for name, param in model.named_parameters()}
    for file in files:
        _copy_weights(file, unfilled)
    if unfilled:
        where = str(files[0]) if len(files) == 1 else f"{directory}/{{{','.join(f.name for f in files)}}}"
        raise UserError(f"{where}: no tensor {next(iter(unfilled))}")
    return model


def _copy_weights(file: Path, unfilled: dict[str, torch.nn.Parameter]) -> None:
    """Copy each tensor of `file` that names a parameter in `unfilled` into it, and drop it from `unfilled`."""
    try:
        with safe_open(str(file), framework="pt") as weights, torch.no_grad():
            for key in weights.keys():
                param = unfilled.pop(key, None)
                if param is None:  # a tensor we do not use (a tied lm_head, rotary tables)
                    continue
                shape = list(weights.get_slice(key).get_shape())
                if shape != list(param.shape):
                    raise UserError(f"{file}: tensor {key} has shape {shape}, expected {list(param.shape)}")
                param.copy_(weights.get_tensor(key))
    except UserError:
        raise
    except Exception as exc:  # safetensors raises its own error types for a corrupt file
        raise UserError(f"{file}: cannot read safetensors: {exc}") from None


def save_checkpoint(model: Transformer, path: str | Path) -> None:
    """Write `model` as an HF-style checkpoint directory (config.json and model.safetensors)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    raw = {HF_CONFIG_KEYS[field]: getattr(config, field) for field in HF_CONFIG_KEYS}
    raw.update(architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype=config.dtype, hidden_act="silu")
    (directory / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    tensors = {hf_name(name): param.detach().to("cpu").contiguous() for name, param in model.named_parameters()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
