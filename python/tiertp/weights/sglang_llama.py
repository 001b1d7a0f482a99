"""The one place tiertp changes SGLang's model code: Llama's fused-output split.

Why a patch: the store's interleaved order gives rank r of TP k the rows of
SGLang's shard in the order [q_b k_b v_b | q_b' k_b' v_b' ...] (resp.
[gate_b up_b | ...]) instead of [q | k | v] (resp. [gate | up]), so the
output of qkv_proj / gate_up_proj must be split per block
(tiertp.weights.interleave.split_blocks). SGLang's hook registry
(sglang.srt.plugins.hook_registry) would patch the class for the whole
process, through package entry points, before the engine starts; here the
change must apply only to a model bound to a store, at its own TP level. So
`bind_sglang_model` replaces two methods on each *instance*
(LlamaAttention.forward_prepare_native, LlamaMLP.forward) with block-aware
copies of SGLang 0.5.23's code, explicitly, in the process that calls it;
importing this module changes nothing. Unknown architectures, subclasses
(which may override the patched code) and paths the copies do not cover
(quantization, the AMX CPU backend, NPU) are refused with a clear error.

Usage, in an execution process (TP context passed explicitly). Preferred,
through SGLang's model-loader extension point (a `BaseModelLoader` class as
`load_format`, as SGLang's own zero-copy IpcModelLoader is): the model is
bound inside `ModelRunner.load_model`, so no weight is read or initialised,
and KV-pool sizing and CUDA-graph capture (which record parameter
addresses) see the final parameters:
    store = attach(handle)
    with loading_from_store(store, tp, rank) as loader:
        runner = ModelRunner(...)          # + alloc pools, init_cuda_graphs, as usual
    loader.stats                           # BindStats
Or after the fact, on a model built with load_format="dummy" (then bind
before CUDA graphs are captured):
    stats = bind_sglang_model(runner.model, store, tp, rank)
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch import nn

from tiertp.weights.bind import BindStats, bind
from tiertp.weights.errors import UnsupportedModel
from tiertp.weights.interleave import deinterleave, split_blocks
from tiertp.weights.llama_plan import SUPPORTED_ARCHITECTURES
from tiertp.weights.store import AttachedStore

_PATCHED = "_tiertp_store_blocks"  # set on every patched module: its blocks per rank


def bind_sglang_model(model: nn.Module, store: AttachedStore, tp: int, rank: int) -> BindStats:
    """Bind SGLang model `model` (built at TP `tp`, rank `rank`) to `store`'s views
    and make its fused splits block-aware. Raises UnsupportedModel for a model
    this module does not know, BindError / UnsupportedLevel for a store mismatch."""
    from sglang.srt.models import llama

    layers = _check_model(model, llama)
    store.layout.check_level(tp, rank)
    if store.layout.architecture != type(model).__name__:
        raise UnsupportedModel(f"the store holds a {store.layout.architecture}, the model is a {type(model).__name__}")
    blocks = store.layout.blocks // tp
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.num_heads * tp != attn.total_num_heads:
            raise UnsupportedModel(
                f"the model was built for TP {attn.total_num_heads // attn.num_heads}, not TP {tp} "
                f"({attn.num_heads} of {attn.total_num_heads} heads per rank)"
            )
        if getattr(attn, _PATCHED, blocks) != blocks or getattr(mlp, _PATCHED, blocks) != blocks:
            raise UnsupportedModel("the model is already bound to a store at another TP level")
    stats = bind(model, store, tp, rank)
    for i, layer in enumerate(layers):
        prefix = f"model.layers.{i}"
        qkv = store.layout.entry(f"{prefix}.self_attn.qkv_proj.weight").block_parts
        gate_up = store.layout.entry(f"{prefix}.mlp.gate_up_proj.weight").block_parts
        _patch_attention(layer.self_attn, qkv, blocks)
        _patch_mlp(layer.mlp, gate_up, blocks)
    return stats


@contextmanager
def loading_from_store(store: AttachedStore, tp: int, rank: int):
    """While active, SGLang model runners built in this process load by binding
    rank `rank` of TP `tp`'s views of `store` (yields the loader class; its
    `stats` is the BindStats once a model was loaded)."""
    from sglang.srt.runtime_context import get_model

    loader = store_loader(store, tp, rank)
    with get_model().override(load_format=loader):
        yield loader


def store_loader(store: AttachedStore, tp: int, rank: int) -> type:
    """A SGLang `BaseModelLoader` class that builds the model and binds it to `store`."""
    from sglang.srt.model_loader.loader import BaseModelLoader, _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    store.layout.check_level(tp, rank)

    class StoreModelLoader(BaseModelLoader):
        stats: BindStats | None = None

        def download_model(self, model_config) -> None:
            pass  # the store was read from disk once, by its creator

        def load_model(self, *, model_config, device_config) -> nn.Module:
            quant_config = _get_quantization_config(model_config, self.load_config)
            # Parameters are allocated uninitialised (torch.empty), then dropped by the bind.
            with set_default_torch_dtype(model_config.dtype), torch.device(device_config.device):
                model = _initialize_model(model_config, self.load_config, quant_config)
            type(self).stats = bind_sglang_model(model, store, tp, rank)
            if store.device.type == "cuda":
                torch.cuda.empty_cache()  # return the dropped placeholders' memory
            return model.eval()

    return StoreModelLoader


def _check_model(model: nn.Module, llama) -> list[nn.Module]:
    name = type(model).__name__
    if type(model) is not llama.LlamaForCausalLM:
        raise UnsupportedModel(
            f"{type(model).__module__}.{name} is not supported by the shared weight store's SGLang "
            f"integration; supported: {', '.join(SUPPORTED_ARCHITECTURES)} (sglang.srt.models.llama, "
            "not subclasses)"
        )
    if getattr(llama, "_is_npu", False):
        raise UnsupportedModel("SGLang's NPU attention path is not covered by the block-aware split")
    if model.quant_config is not None:
        raise UnsupportedModel(f"quantized models ({type(model.quant_config).__name__}) are not supported")
    layers = [model.model.layers[i] for i in range(model.model.start_layer, model.model.end_layer)]
    if model.model.start_layer != 0 or model.model.end_layer != len(model.model.layers):
        raise UnsupportedModel("pipeline parallelism is not supported by the shared weight store")
    for layer in layers:
        if type(layer.self_attn) is not llama.LlamaAttention or type(layer.mlp) is not llama.LlamaMLP:
            raise UnsupportedModel(
                f"decoder layer parts {type(layer.self_attn).__name__}/{type(layer.mlp).__name__} are not "
                "SGLang's LlamaAttention/LlamaMLP"
            )
    for mod_name, mod in model.named_modules():
        if getattr(mod, "use_intel_amx_backend", False):
            raise UnsupportedModel(f"{mod_name} uses SGLang's AMX CPU backend (repacked weights), not plain views")
    return layers


def _patch_attention(attn: nn.Module, part_sizes: tuple[int, ...], blocks: int) -> None:
    """LlamaAttention.forward_prepare_native (SGLang 0.5.23) with a per-block split."""

    def forward_prepare_native(self, positions, hidden_states):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = split_blocks(qkv, part_sizes, blocks)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v

    attn.forward_prepare_native = types.MethodType(forward_prepare_native, attn)
    setattr(attn, _PATCHED, blocks)


def _patch_mlp(mlp: nn.Module, part_sizes: tuple[int, ...], blocks: int) -> None:
    """LlamaMLP.forward (SGLang 0.5.23), unquantized path, with the gate/up
    output put back in SGLang's [gate | up] order. The dual-GEMM and fused
    activation-quant paths are skipped: they read the weight's own layout and
    apply only to quantized or CUDA-kernel cases this store does not serve."""

    def forward(self, x, forward_batch=None):
        gate_up, _ = self.gate_up_proj(x)
        x = self.act_fn(deinterleave(gate_up, part_sizes, blocks))
        x, _ = self.down_proj(x)
        return x

    mlp.forward = types.MethodType(forward, mlp)
    setattr(mlp, _PATCHED, blocks)
