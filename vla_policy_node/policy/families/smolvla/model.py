"""SmolVLA (lerobot's VLAFlowMatching), inference only, with a state-last prefix cache.

lerobot (``modeling_smolvla.py``, ``smolvlm_with_expert.py`` at huggingface/lerobot 7427f318) runs one prefix

    [64 image tokens per camera ; language tokens ; one state token]   att 0 ... 0 | 1

so image and language tokens attend to each other only, the state token attends to everything, and nothing
in the prefix attends to the state token. The image + language K/V of every VLM layer therefore do not depend
on the state; this module splits lerobot's one prefix pass in two:

    fill_prefix   vision + connector + VLM layers over [images ; language]  -> PrefixContext
                  'kv' [L, 2, B, K, P, D] (post-RoPE K) and 'cross_kv' (the cross-attention layers' projected
                  K/V [C, 2, B, K', P, D']) -- constant over every denoise step and every chunk of the entry
    chunk_setup   per chunk: the state token alone through the VLM layers, attending to the cached K/V and
                  itself (its K/V per layer), projected for the cross layers; workspaces; time terms; RTC guide
    euler_loop    per step: the action tokens through the expert; self layers attend to [prefix ; state ;
                  actions (causal)] at positions P_valid + 1 + i, cross layers to [prefix ; state] through the
                  projected K/V with queries at positions 0 .. H-1 (lerobot re-projects those every step)

Positions are cumsum(pad) - 1, so masked cameras and padded text take no position; the state token sits at
the number of valid prefix tokens. RoPE is lerobot's own (split half, wavelength 10000, fp32); image tokens and
language embeddings are scaled by sqrt(hidden); the RMSNorms are Llama's (x * w).

Precision (``set_compute_dtype``): everything runs fp32 on the CPU. Under bf16 the text decoder (embedding and
layers) and the expert's linear layers compute in bf16, as lerobot effectively runs them under the hub config
(text_config.torch_dtype bfloat16 with transformers 5); the vision tower, the connector, lerobot's own
projections (state_proj, action_*) and every RMSNorm weight stay fp32, and the residual streams stay fp32
(norms compute in fp32; each projection's input is rounded to bf16 once, its output added back in fp32).
The cross layers' k/v_proj stay fp32 as in lerobot (it makes them anew as fp32 nn.Linear after building the
expert in bf16), so their projected K/V (cached in fp32) and the cross attention are fp32. RoPE runs in fp32;
the VLM K/V (and their cache) are stored in the compute dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ....cache.context import KV, PAD_MASK, PrefixContext, kv_prefix_context
from ...family import PolicyModel, WorkspaceSpec
from ...preprocess import check_prefix_inputs
from ...layers import (TimeEmbeddingTable, additive_mask, fold_mask, grouped_query_attention, keep_fp32,
                       loop_packer, split_half_rope_tables)
from ...rtc import RTCGuide, RTCSettings
from .config import SmolVLAConfig
from .smolvlm import LlamaExpert, SmolVLM

# The name of the cross layers' projected prefix K/V in the context (laid out like its K/V).
CROSS_KV = 'cross_kv'
# Parameters kept fp32 when the model computes in bf16 (module docstring).
FP32_MODULE_MARKERS = ('vision_model', 'connector', 'state_proj', 'action_in_proj', 'action_out_proj',
                       'action_time_mlp', 'layernorm', '.norm.')


class VLMWithExpert(nn.Module):
    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        text = config.text
        self.vlm = SmolVLM(config.backbone, config.num_vlm_layers)
        self.lm_expert = LlamaExpert(config.expert, config.expert_cross_layers, text.num_kv_heads * text.head_dim)


@dataclass
class SmolChunk:
    """One chunk's fixed inputs to the Euler loop.

    self_kv [L, 2, B, K, P + 1 + H, D]: prefix and state K/V filled (the self layers' action part is written
    per step); cross_kv [C, 2, B, K', P + 1, D'] fp32: projected prefix and state K/V; self_rope, cross_rope:
    (cos, sin) [B, H, 1, D]; self_mask [B, 1, G*H, P + 1 + H], cross_mask [B, 1, G*H, P + 1] (folded);
    time_terms [N + 1, W]; noise [B, H, A] fp32.
    """

    self_kv: torch.Tensor
    cross_kv: torch.Tensor
    self_rope: Tuple[torch.Tensor, torch.Tensor]
    cross_rope: Tuple[torch.Tensor, torch.Tensor]
    self_mask: torch.Tensor
    cross_mask: torch.Tensor
    time_terms: torch.Tensor
    guide: Optional[RTCGuide]
    noise: torch.Tensor
    num_steps: int


class SmolVLAModel(PolicyModel):
    """Module names mirror lerobot's VLAFlowMatching so ``model.safetensors`` keys (minus ``model.``) load."""

    fp32_markers = FP32_MODULE_MARKERS

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        self.config = config
        # lerobot makes the cross layers' k/v_proj anew as fp32 nn.Linear after building the expert in bf16
        # (smolvlm_with_expert.py __init__): they stay fp32, and so does what they project.
        self._fp32_names = frozenset(f'vlm_with_expert.lm_expert.layers.{e}.self_attn.{n}_proj.weight'
                                     for e, cross in enumerate(config.expert_cross_layers) if cross for n in 'kv')
        width = config.expert.width
        self.vlm_with_expert = VLMWithExpert(config)
        self.state_proj = nn.Linear(config.max_state_dim, config.text.width)
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.compute_dtype = torch.float32
        self._time_table = TimeEmbeddingTable(width, config.min_period, config.max_period)
        # (VLM layer, expert layer, index among the cross layers or None) for every VLM layer with an expert.
        plan, cross = [], 0
        for i, (expert_index, self_attn) in enumerate(config.layer_plan):
            if expert_index is not None:
                plan.append((i, expert_index, None if self_attn else cross))
                cross += 0 if self_attn else 1
        self._plan = tuple(plan)

    def param_dtype(self, name: str, compute_dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if name in self._fp32_names else keep_fp32(name, compute_dtype, self.fp32_markers)

    @property
    def _vlm(self):
        return self.vlm_with_expert.vlm.model

    @property
    def _text_layers(self) -> nn.ModuleList:
        return self.vlm_with_expert.vlm.model.text_model.layers

    @property
    def _expert(self) -> LlamaExpert:
        return self.vlm_with_expert.lm_expert

    @property
    def action_expert(self) -> nn.Module:
        """The action expert's stack (policy/quant.py keeps it in the compute dtype under int8_weights)."""
        return self._expert

    def _mask(self, allowed: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """bool [B, 1, S, T] -> additive (compute dtype unless given), folded for the G query heads per kv head."""
        text = self.config.text
        return fold_mask(additive_mask(allowed, dtype or self.compute_dtype), text.num_heads // text.num_kv_heads)

    def _rope(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return split_half_rope_tables(positions, self.config.text.head_dim)

    # ---- prefix (cache miss) ---------------------------------------------------------------------
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, N, 3, H, W] in [-1, 1] -> [B, N*T, W_text] fp32, scaled by sqrt(W_text)."""
        batch, cameras = images.shape[:2]
        vlm = self._vlm
        patches = vlm.vision_model(images.flatten(0, 1).float(), torch.float32)     # [B*N, patches, W_vis]
        tokens = vlm.connector(patches)                                             # [B*N, T, W_text] fp32
        tokens = tokens * torch.full((), tokens.shape[-1] ** 0.5, dtype=tokens.dtype, device=tokens.device)
        return tokens.reshape(batch, cameras * tokens.shape[1], -1)

    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, L] -> [B, L, W_text] fp32 * sqrt(W_text) (a Python float, as lerobot's embed_prefix)."""
        embedded = self._vlm.text_model.embed_tokens(tokens).float()
        return embedded * math.sqrt(embedded.shape[-1])

    @torch.no_grad()
    def fill_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                    token_masks: torch.Tensor) -> PrefixContext:
        """Vision + connector + VLM layers over [images ; language] -> read-only context (no state in it).

        images [B, N, 3, H, W] in [-1, 1]; image_masks [B, N] bool; tokens, token_masks [B, L].
        """
        cfg = self.config
        check_prefix_inputs(cfg, images, image_masks, tokens, token_masks)
        x = torch.cat([self.embed_images(images), self.embed_language(tokens)], dim=1)   # [B, P, W]
        batch, prefix_len, _ = x.shape
        image_pad = image_masks[:, :, None].expand(-1, -1, cfg.tokens_per_image).reshape(batch, -1)
        pad = torch.cat([image_pad, token_masks.bool()], dim=1)                        # [B, P]
        cos, sin = self._rope(pad.long().cumsum(dim=1) - 1)
        mask = self._mask((pad[:, None, :] & pad[:, :, None])[:, None])                # [B, 1, G*P, P]
        text = cfg.text
        kv = x.new_empty(cfg.num_vlm_layers, 2, batch, text.num_kv_heads, prefix_len, text.head_dim,
                         dtype=self.compute_dtype)
        layers = self._text_layers
        for i, layer in enumerate(layers):
            q, k, v = layer.project_qkv(x, cos, sin)
            kv[i, 0], kv[i, 1] = k, v
            if i == len(layers) - 1:
                break                     # nothing reads the last layer's outputs over the prefix
            x = layer.finish(x, grouped_query_attention(q, k, v, mask))
        return kv_prefix_context(kv, pad, **{CROSS_KV: self._cross_prefix_kv(kv)})

    def _cross_prefix_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """The cross layers' k_proj / v_proj of the cached VLM K/V -> [C, 2, B, K', P, D'] fp32 (fp32 weights)."""
        cfg = self.config
        expert = cfg.expert
        batch, prefix_len = kv.shape[2], kv.shape[4]
        out = kv.new_empty(cfg.cross_layer_count, 2, batch, expert.num_kv_heads, prefix_len, expert.head_dim,
                           dtype=torch.float32)
        for vlm_index, expert_index, cross in self._plan:
            if cross is not None:
                layer = self._expert.layers[expert_index]
                out[cross, 0], out[cross, 1] = layer.cross_kv(kv[vlm_index, 0], kv[vlm_index, 1])
        return out

    # ---- per chunk -----------------------------------------------------------------------------------
    def state_pass(self, context: PrefixContext, state: torch.Tensor, workspace: torch.Tensor) -> None:
        """The state token through every VLM layer, attending to the cached K/V and itself: its K/V land at
        position P of ``workspace`` [L, 2, B, K, >= P + 1, D] (whose [:P] holds the prefix K/V).

        state [B, max_state_dim] normalised, zero-padded. Nothing in the prefix attends to it (lerobot's
        att mask 1), so the cached K/V are exactly what lerobot computes with the state in the prefix."""
        pad = context[PAD_MASK]
        batch, prefix_len = pad.shape
        x = self.state_proj(state.float())[:, None]                                     # [B, 1, W] fp32
        cos, sin = self._rope(pad.long().sum(dim=1, keepdim=True))                      # position = valid count
        mask = self._mask(torch.cat([pad, pad.new_ones(batch, 1)], dim=1)[:, None, None])   # [B, 1, G, P + 1]
        end = prefix_len + 1
        layers = self._text_layers
        for i, layer in enumerate(layers):
            q, k, v = layer.project_qkv(x, cos, sin)                                  # [B, *, 1, D]
            workspace[i, 0, :, :, prefix_len], workspace[i, 1, :, :, prefix_len] = k[:, :, 0], v[:, :, 0]
            if i == len(layers) - 1:
                break
            attn = grouped_query_attention(q, workspace[i, 0, :, :, :end], workspace[i, 1, :, :, :end], mask)
            x = layer.finish(x, attn)

    def time_embeddings(self, num_steps: int) -> torch.Tensor:
        """[num_steps + 1, W] fp32: every step's time embedding, then t = 0's (layers.TimeEmbeddingTable)."""
        return self._time_table(num_steps, self.device)

    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The workspaces the loop reads (fast_path.py): self K/V [.., P + 1 + H, D] (prefix ; state ; actions)
        and the cross layers' K/V [.., P + 1, D'] (prefix ; state)."""
        prefix_len = context.prefix_len
        return ((context[KV], prefix_len + 1 + self.config.chunk_size), (context[CROSS_KV], prefix_len + 1))

    @torch.no_grad()
    def chunk_setup(self, context: PrefixContext, state: torch.Tensor, noise: torch.Tensor,
                    num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                    inference_delay: int = 0, execution_horizon: Optional[int] = None,
                    rtc: Optional[RTCSettings] = None, embodiment: Optional[torch.Tensor] = None,
                    workspace: Optional[Sequence[torch.Tensor]] = None) -> SmolChunk:
        """Everything fixed for one chunk; the stored ``context`` is only read (copied into workspaces).

        ``workspace``: caller-owned (self K/V, cross K/V) buffers as ``workspace_spec`` describes them, whose
        prefix parts already hold the entry (vla_policy_node/fast_path.py): nothing is allocated or copied."""
        cfg = self.config
        if state is None or tuple(state.shape) != (context.batch_size, cfg.max_state_dim):
            raise ValueError(f'SmolVLA needs the normalised state [B, {cfg.max_state_dim}]')
        start = self.start_chunk(context, noise, num_steps, workspace, prev_chunk_left_over=prev_chunk_left_over,
                                 inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc,
                                 embodiment=embodiment)
        pad, horizon = context[PAD_MASK], cfg.chunk_size
        batch, prefix_len = pad.shape
        self_kv, cross_kv = start.workspace
        self.state_pass(context, state, self_kv)
        for vlm_index, expert_index, cross in self._plan:
            if cross is not None:                      # the state token's K/V through this cross layer's k/v_proj
                state_k = self_kv[vlm_index, 0, :, :, prefix_len:prefix_len + 1]
                state_v = self_kv[vlm_index, 1, :, :, prefix_len:prefix_len + 1]
                k, v = self._expert.layers[expert_index].cross_kv(state_k, state_v)
                cross_kv[cross, 0, :, :, prefix_len:], cross_kv[cross, 1, :, :, prefix_len:] = k, v
        valid = pad.long().sum(dim=1, keepdim=True)                                    # [B, 1]
        steps = torch.arange(horizon, device=pad.device)
        keys = torch.cat([pad, pad.new_ones(batch, 1)], dim=1)                         # prefix + state
        causal = torch.ones(horizon, horizon, dtype=torch.bool, device=pad.device).tril()
        self_allowed = torch.cat([keys[:, None, :].expand(batch, horizon, prefix_len + 1),
                                  causal[None].expand(batch, -1, -1)], dim=2)[:, None]   # [B, 1, H, P + 1 + H]
        return SmolChunk(self_kv=self_kv, cross_kv=cross_kv,
                         self_rope=self._rope(valid + 1 + steps), cross_rope=self._rope(steps[None].expand(batch, -1)),
                         self_mask=self._mask(self_allowed),
                         cross_mask=self._mask(keys[:, None, None, :].expand(batch, 1, horizon, prefix_len + 1),
                                               torch.float32),
                         time_terms=self._time_terms(start.num_steps), guide=start.guide, noise=start.noise,
                         num_steps=start.num_steps)

    def _time_terms(self, num_steps: int) -> torch.Tensor:
        """The time half of action_time_mlp_in (with its bias) for every step: W [a ; t] + b = W_a a + (W_t t + b)."""
        layer, width = self.action_time_mlp_in, self.config.expert.width
        return F.linear(self.time_embeddings(num_steps), layer.weight[:, width:], layer.bias)

    # ---- per step ------------------------------------------------------------------------------------
    def _embed_suffix(self, x_t: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        """x_t [B, H, A] -> action tokens [B, H, W]: mlp_out(silu(W_a action_in(x_t) + time term))."""
        width = self.config.expert.width
        hidden = F.linear(self.action_in_proj(x_t), self.action_time_mlp_in.weight[:, :width]) + term
        return self.action_time_mlp_out(F.silu(hidden))                                 # fp32 residual stream

    def velocity(self, chunk: SmolChunk, x_t: torch.Tensor, step: int) -> torch.Tensor:
        """v(x_t, t_step) [B, H, A] fp32: the action tokens through the expert against the chunk's K/V."""
        x = self._embed_suffix(x_t, chunk.time_terms[step])
        start = chunk.self_kv.shape[4] - x.shape[1]                   # P + 1: the action tokens' K/V
        for vlm_index, expert_index, cross in self._plan:
            layer = self._expert.layers[expert_index]
            if cross is None:
                q, k, v = layer.project_qkv(x, *chunk.self_rope)
                keys, values = chunk.self_kv[vlm_index, 0], chunk.self_kv[vlm_index, 1]
                keys[:, :, start:], values[:, :, start:] = k, v
                attn = grouped_query_attention(q, keys, values, chunk.self_mask)
            else:
                q = layer.project_q(x, *chunk.cross_rope).float()       # lerobot: fp32 K/V, so fp32 attention
                attn = grouped_query_attention(q, chunk.cross_kv[cross, 0], chunk.cross_kv[cross, 1],
                                               chunk.cross_mask)
            x = layer.finish(x, attn)
        return self.action_out_proj(self._expert.norm(x).float())

    @torch.no_grad()
    def euler_loop(self, chunk: SmolChunk) -> torch.Tensor:
        """x <- x + dt * v(x, t) for every step from the chunk's noise -> [B, H, A] fp32."""
        guide = chunk.guide
        dt = -1.0 / chunk.num_steps
        x_t = chunk.noise
        # The expert's weights prepacked for the loop's B*H-row GEMMs (about 10% of a real-shape denoise on this
        # project's CPU, same values, one more copy of the expert's weights).
        with loop_packer(self, x_t.shape[0] * x_t.shape[1], x_t.device, self.compute_dtype):
            for step in range(chunk.num_steps):
                velocity = self.velocity(chunk, x_t, step)
                if guide is not None:
                    velocity = guide.guide(step, x_t, velocity)
                x_t = x_t + dt * velocity
        return x_t
