"""Weights: seeded random initialisation, and loading a safetensors checkpoint by tensor name.

The model's parameter names are the checkpoint's tensor names (see ``model``), so loading is a
name-for-name copy. ``load_safetensors`` first reads every file's header and checks the whole
name/shape set against the model: missing, unexpected and mis-shaped names are reported together
in one ``ValueError`` (one line) before a single parameter changes; so are unreadable files (a
truncated or corrupt safetensors file, a broken index) and a checkpoint without the MTP layers the
config declares. Accepted besides plain tensors:

* per-expert tensors ``mlp.experts.E.{gate,up,down}_proj.weight`` (how DeepSeek and transformers
  save them);
* FP8 block-quantised weights (DeepSeek's release): ``W`` in ``float8_e4m3fn`` with
  ``W.weight_scale_inv`` ``[ceil(out/128), ceil(in/128)]`` fp32, dequantised to
  ``W * scale_inv`` per 128x128 block (block size from ``config.json``'s
  ``quantization_config.weight_block_size`` when present).

Nothing is permuted: transformers' DeepSeek-V3.2 keeps DeepSeek's own layouts (MLA RoPE dims
interleaved in ``q_b_proj`` / ``kv_a_proj_with_mqa``, indexer heads ``[rope | nope]``), which is
what ``model`` computes with.

``init_random`` draws every parameter from one seeded generator, in name order, scaled so that
activations stay O(1) through the residual stream: projections N(0, 1/fan_in), embeddings N(0, 1),
norms 1, the router bias small; the MTP modules' embedding and head start as copies of the main
ones (DeepSeek's checkpoints store them duplicated).
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Dict, List, Tuple

import torch
from torch import nn

SCALE_SUFFIX = ".weight_scale_inv"


@torch.no_grad()
def init_random(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    norm_types = (nn.LayerNorm,)
    for module_name, module in sorted(model.named_modules()):
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            values = _random_value(module, name, param, gen, norm_types, full)
            param.copy_(values.to(param.device, param.dtype))
    cfg = getattr(model, "config", None)
    if cfg is not None:
        for k in range(cfg.num_nextn_predict_layers):
            mtp = model.mtp_layer(k)
            mtp.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
            mtp.shared_head.head.weight.copy_(model.lm_head.weight)


def _random_value(module, name, param, gen, norm_types, full) -> torch.Tensor:
    shape = tuple(param.shape)
    if name == "e_score_correction_bias":
        return torch.randn(shape, generator=gen) * 0.05
    if isinstance(module, norm_types) or full.endswith("norm.weight"):
        return torch.ones(shape) if name == "weight" else torch.zeros(shape)
    if isinstance(module, nn.Embedding):
        return torch.randn(shape, generator=gen)
    if param.dim() == 2:                        # projections, router, heads: [out, in]
        return torch.randn(shape, generator=gen) / math.sqrt(shape[1])
    raise ValueError(f"init_random: no rule for parameter {full} {shape}")


def checkpoint_files(directory: str) -> List[str]:
    if not os.path.isdir(directory):
        raise ValueError(f"checkpoint: not a directory: {directory}")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f).get("weight_map", {})
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"checkpoint: {index} is not a readable index "
                             f"({type(e).__name__}: {e})") from None
        files = sorted({os.path.join(directory, v) for v in weight_map.values()})
        absent = [f for f in files if not os.path.exists(f)]
        if absent:
            raise ValueError(f"checkpoint: {index} names missing file {absent[0]}")
        return files
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        raise ValueError(f"checkpoint: no *.safetensors in {directory}")
    return files


def _block_size(directory: str) -> Tuple[int, int]:
    try:
        with open(os.path.join(directory, "config.json")) as f:
            quant = json.load(f).get("quantization_config") or {}
        b = quant.get("weight_block_size") or (128, 128)
        return int(b[0]), int(b[1])
    except (OSError, ValueError):
        return 128, 128


def _list(names, limit: int = 8) -> str:
    names = sorted(names)
    more = f" ... (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


@torch.no_grad()
def load_safetensors(model: nn.Module, directory: str) -> None:
    """Copy the checkpoint in ``directory`` into ``model``; all-or-nothing (see module doc)."""
    expected: Dict[str, nn.Parameter] = dict(model.named_parameters())
    # name -> (file, shape, dtype string)
    present: Dict[str, Tuple[str, Tuple[int, ...], str]] = {}
    for path in checkpoint_files(directory):
        # safe_open checks the header against the file size, so a truncated file fails here
        with _open(path) as f:
            for name in f.keys():
                sl = f.get_slice(name)
                present[name] = (path, tuple(sl.get_shape()), sl.get_dtype())

    scales = {n[:-len(SCALE_SUFFIX)] + ".weight": n for n in present if n.endswith(SCALE_SUFFIX)}
    block = _block_size(directory)
    missing = set(expected) - set(present)
    unexpected = {n for n in present if n not in expected and n not in scales.values()}
    unexpected |= {s for w, s in scales.items() if w not in expected}
    mismatched = []
    for name in set(expected) & set(present):
        want = tuple(expected[name].shape)
        _, shape, dtype = present[name]
        if shape != want:
            mismatched.append(f"{name} {list(shape)} (model {list(want)})")
        elif dtype.upper().startswith("F8") and name not in scales:
            mismatched.append(f"{name} is FP8 but has no {SCALE_SUFFIX}")
        elif name in scales:
            s_shape = present[scales[name]][1]
            s_want = (math.ceil(want[0] / block[0]), math.ceil(want[1] / block[1]))
            if s_shape != s_want:
                mismatched.append(f"{scales[name]} {list(s_shape)} (expected {list(s_want)})")
    cfg = getattr(model, "config", None)
    if cfg is not None and missing:
        mtp = [f"model.layers.{cfg.num_hidden_layers + k}."
               for k in range(cfg.num_nextn_predict_layers)]
        absent = [p for p in mtp if not any(n.startswith(p) for n in present)]
        if absent:
            raise ValueError(f"checkpoint {directory} has no weights for MTP layer "
                             f"{', '.join(p + '*' for p in absent)} (the config declares "
                             f"num_nextn_predict_layers = {cfg.num_nextn_predict_layers})")
    if missing or unexpected or mismatched:
        parts = [f"checkpoint {directory} does not match the model config:"]
        if missing:
            parts.append(f"missing ({len(missing)}): {_list(missing)};")
        if unexpected:
            parts.append(f"unexpected ({len(unexpected)}): {_list(unexpected)};")
        if mismatched:
            parts.append(f"wrong shape ({len(mismatched)}): {_list(mismatched)};")
        raise ValueError(" ".join(parts).rstrip(";"))

    by_file: Dict[str, List[str]] = {}
    for name in expected:
        by_file.setdefault(present[name][0], []).append(name)
    for path, names in by_file.items():
        with _open(path) as f:
            for name in names:
                value = f.get_tensor(name)
                if name in scales:
                    value = _dequantize(value, f.get_tensor(scales[name]) if scales[name] in
                                        f.keys() else _read(present[scales[name]][0], scales[name]),
                                        block)
                param = expected[name]
                param.copy_(value.to(device=param.device, dtype=param.dtype))


def _read(path: str, name: str) -> torch.Tensor:
    with _open(path) as f:
        return f.get_tensor(name)


def _open(path: str):
    from safetensors import SafetensorError, safe_open
    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError) as e:
        raise ValueError(f"checkpoint: {path} is not a readable safetensors file "
                         f"({' '.join(str(e).split())})") from None


def _dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: Tuple[int, int]) -> torch.Tensor:
    out, inp = weight.shape
    scale = scale_inv.float().repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)
    return weight.float() * scale[:, :inp]
