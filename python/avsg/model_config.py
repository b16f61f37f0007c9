"""Model configuration of the DeepSeek-V3.2 architecture: ``ModelConfig``, presets, ``config.json``.

``ModelConfig`` holds exactly the hyper-parameters the runtime's model reads; field names are the
ones of DeepSeek-V3.2's ``config.json``. Three ways to get one:

    preset("tiny")          a few-kilobyte model for tests (one dense + one MoE layer, 1 MTP layer)
    preset("demo")          the default of ``avsg run``: DeepSeek-V3.2's attention geometry (512-d
                            latent, 64-d RoPE, 2048 top-k, 128-d index heads, YaRN x40) around a
                            small body (hidden 512, 4 layers, 16 experts)
    from_hf_config(path)    a DeepSeek-V3.2 ``config.json``, official (``rope_scaling`` +
                            ``rope_theta``) or as Hugging Face writes it (``rope_parameters``)

Reading a ``config.json`` is strict: every key is either a field, a key whose value we check
because the model only implements one choice (``hidden_act`` must be ``silu``, ...), or a
bookkeeping key listed in ``IGNORED_KEYS``. Anything else is an error naming the key, so a model
that differs in a way we do not implement is refused instead of silently mis-computed.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Optional

#: ``config.json`` keys that do not change what the model computes at inference.
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "auto_map", "_name_or_path",
    "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id",
    "quantization_config",                  # FP8 weights are dequantized when loaded
    "initializer_range", "use_cache", "output_router_logits", "router_aux_loss_coef",
    "aux_loss_alpha", "seq_aux", "ep_size", "attention_dropout",
})

#: Keys whose value is checked: the model implements exactly this choice.
#: ``None`` means the check is a function of the other fields (see ``_check_fixed``).
FIXED_KEYS: Dict[str, Any] = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "moe_layer_freq": 1,
    "indexer_rope_interleave": False,       # the indexer's RoPE is half-split (neox)
    "num_key_value_heads": None,            # == num_attention_heads (MLA)
    "head_dim": None,                       # HF: == qk_rope_head_dim
    "qk_head_dim": None,                    # HF: == qk_nope_head_dim + qk_rope_head_dim
    "mlp_layer_types": None,                # HF: first_k_dense_replace x "dense", then "sparse"
    "layer_types": None,                    # HF: every layer "indexed_attention"
}

#: Keys of a YaRN ``rope_scaling`` / ``rope_parameters`` dict.
ROPE_KEYS = frozenset({
    "type", "rope_type", "rope_theta", "factor", "original_max_position_embeddings",
    "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int              # dense FFN (the first ``first_k_dense_replace`` layers)
    moe_intermediate_size: int          # one routed or shared expert
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int                   # MLA latent width (the KV cache's 512)
    qk_nope_head_dim: int
    qk_rope_head_dim: int               # the KV cache's 64
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    first_k_dense_replace: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None   # YaRN parameters, None = plain RoPE
    max_position_embeddings: int = 163840
    num_nextn_predict_layers: int = 1
    tie_word_embeddings: bool = False

    def __post_init__(self):
        self.validate()

    # --- derived ----------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def num_kv_layers(self) -> int:
        """Attention layers that keep KV: the decoder layers, then the MTP layers."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    def is_moe_layer(self, layer: int) -> bool:
        """MTP layers (``layer >= num_hidden_layers``) are MoE, as in DeepSeek-V3.2."""
        return layer >= self.first_k_dense_replace

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    # --- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in (int, "int") and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"config: {f.name} must be an int, got {value!r}")
        positive = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                    "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                    "num_experts_per_tok", "n_group", "topk_group", "index_n_heads",
                    "index_head_dim", "index_topk", "max_position_embeddings")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"config: {name} must be positive, got {getattr(self, name)}")
        for name in ("n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"config: {name} must be >= 0, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"config: qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.index_head_dim < self.qk_rope_head_dim:
            raise ValueError(f"config: index_head_dim ({self.index_head_dim}) must be >= "
                             f"qk_rope_head_dim ({self.qk_rope_head_dim}): the indexer ropes its "
                             f"first qk_rope_head_dim dims")
        if self.n_routed_experts % self.n_group:
            raise ValueError(f"config: n_routed_experts ({self.n_routed_experts}) must be a "
                             f"multiple of n_group ({self.n_group})")
        if self.topk_group > self.n_group:
            raise ValueError(f"config: topk_group ({self.topk_group}) > n_group ({self.n_group})")
        if self.n_routed_experts // self.n_group < 2:
            raise ValueError("config: each expert group needs >= 2 experts (groups are ranked by "
                             "their top-2 scores)")
        if self.num_experts_per_tok > self.topk_group * (self.n_routed_experts // self.n_group):
            raise ValueError(f"config: num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                             f"the experts of topk_group ({self.topk_group}) groups")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)


def _check_rope_scaling(scaling: Dict[str, Any]) -> None:
    unknown = sorted(set(scaling) - ROPE_KEYS)
    if unknown:
        raise ValueError(f"config: unknown rope_scaling key {unknown[0]!r} "
                         f"(known: {', '.join(sorted(ROPE_KEYS))})")
    kind = scaling.get("type")
    if kind != "yarn":
        raise ValueError(f"config: rope_scaling type must be 'yarn', got {kind!r}")
    for key in ("factor", "original_max_position_embeddings"):
        if not isinstance(scaling.get(key), (int, float)) or scaling[key] <= 0:
            raise ValueError(f"config: rope_scaling.{key} must be a positive number, "
                             f"got {scaling.get(key)!r}")


# --- presets ----------------------------------------------------------------------------------

_REAL_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}

PRESETS: Dict[str, ModelConfig] = {
    # Small enough that a prompt plus a few dozen tokens run in well under a second; kv_lora_rank
    # 128 keeps the fp8 KV format (128-wide scale tiles) usable.
    "tiny": ModelConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=128,
        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        index_n_heads=8, index_head_dim=32, index_topk=8,
        rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 1024,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        max_position_embeddings=4096, num_nextn_predict_layers=1),
    # DeepSeek-V3.2's attention and KV geometry (what the offload ops see) at a body size that
    # decodes a 32K context on two CPU cores.
    "demo": ModelConfig(
        vocab_size=8192, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=4, num_attention_heads=16, q_lora_rank=384, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        index_n_heads=16, index_head_dim=128, index_topk=2048,
        rope_scaling=dict(_REAL_YARN), max_position_embeddings=163840,
        num_nextn_predict_layers=1),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"config: unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]


# --- config.json ------------------------------------------------------------------------------

_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
# Fields a config.json may omit (DeepSeek's own defaults); every other field is required.
_OPTIONAL = {"rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings",
             "num_nextn_predict_layers", "tie_word_embeddings", "n_group", "topk_group",
             "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor"}
_DEFAULTS = {"n_group": 1, "topk_group": 1, "first_k_dense_replace": 0, "norm_topk_prob": True,
             "routed_scaling_factor": 1.0}


def from_hf_config(path: str) -> ModelConfig:
    """Read a DeepSeek-V3.2 ``config.json`` (a file, or a directory holding one).

    A Hugging Face ``save_pretrained`` config has no ``num_nextn_predict_layers`` (transformers does
    not implement MTP), so it reads as a model without MTP layers.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"config: no such file {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"config: {path} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"config: {path} must hold a JSON object")
    return config_from_dict(raw)


def config_from_dict(raw: Dict[str, Any]) -> ModelConfig:
    model_type = raw.get("model_type", "deepseek_v32")
    if model_type != "deepseek_v32":
        raise ValueError(f"config: model_type must be 'deepseek_v32', got {model_type!r}")
    fields: Dict[str, Any] = {}
    for key, value in raw.items():
        if key in IGNORED_KEYS or key in FIXED_KEYS or key in ("rope_parameters", "num_experts"):
            continue
        if key not in _FIELDS:
            raise ValueError(f"config: unknown key {key!r} (not a DeepSeek-V3.2 setting this "
                             f"runtime implements)")
        fields[key] = value
    if "num_experts" in raw:                # an older HF spelling
        fields.setdefault("n_routed_experts", raw["num_experts"])
    fields.setdefault("num_nextn_predict_layers", 0)
    for key, value in _DEFAULTS.items():
        fields.setdefault(key, value)
    missing = sorted(_FIELDS - _OPTIONAL - set(fields))
    if missing:
        raise ValueError(f"config: missing key {missing[0]!r}"
                         + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""))
    fields.update(_rope_fields(raw))
    for key in ("routed_scaling_factor", "rms_norm_eps", "rope_theta"):
        if key in fields:
            fields[key] = float(fields[key])
    config = ModelConfig(**fields)
    _check_fixed(raw, config)
    return config


def _rope_fields(raw: Dict[str, Any]) -> Dict[str, Any]:
    """``rope_parameters`` (HF: theta inside the dict) or ``rope_scaling`` + ``rope_theta``."""
    if "rope_parameters" in raw and raw.get("rope_scaling") is not None:
        raise ValueError("config: give either rope_parameters or rope_scaling, not both")
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        theta = raw.get("rope_theta", 10000.0)
    else:
        if not isinstance(params, dict):
            raise ValueError(f"config: rope_parameters must be an object, got {params!r}")
        params = dict(params)
        theta = params.pop("rope_theta", raw.get("rope_theta", 10000.0))
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind == "default" and not params:
        return {"rope_theta": theta, "rope_scaling": None}
    if kind != "yarn":
        raise ValueError(f"config: rope type must be 'yarn' or 'default', got {kind!r}")
    params["type"] = "yarn"
    # HF's default when the dict omits it: no extension beyond max_position_embeddings
    params.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    if params.get("factor") is None:
        params["factor"] = raw["max_position_embeddings"] / params["original_max_position_embeddings"]
    return {"rope_theta": theta, "rope_scaling": params}


def _check_fixed(raw: Dict[str, Any], config: ModelConfig) -> None:
    expected = dict(FIXED_KEYS)
    expected["num_key_value_heads"] = config.num_attention_heads
    expected["head_dim"] = config.qk_rope_head_dim
    expected["qk_head_dim"] = config.qk_head_dim
    n_dense = min(config.first_k_dense_replace, config.num_hidden_layers)
    expected["mlp_layer_types"] = ["dense"] * n_dense + ["sparse"] * (config.num_hidden_layers
                                                                      - n_dense)
    expected["layer_types"] = ["indexed_attention"] * config.num_hidden_layers
    for key, want in expected.items():
        if key in raw and raw[key] != want:
            raise ValueError(f"config: {key} = {raw[key]!r} is not supported (this runtime "
                             f"implements {want!r})")
