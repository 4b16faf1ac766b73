"""pi0 and pi0.5: a PaliGemma prefix, an action expert suffix, flow matching.

    prefix = [image tokens of every camera ; language tokens]   bidirectional
    pi0    suffix = [state token ; action tokens (time fused into each)]
    pi0.5  suffix = [action tokens], time enters through adaptive RMSNorm
    actions: Euler from t=1 (noise) to t=0 in num_steps, x <- x + dt * v(x, t)

Inference is split in two: ``fill_prefix`` runs the vision tower and the
language model once and returns a read-only ``PrefixContext`` (per-layer
K/V, ``kv_prefix_context``); ``denoise`` runs only the expert against it. A cached context can
therefore be reused for any number of chunks.

Module names mirror lerobot's ``PI0Pytorch``/``PI05Pytorch`` so that
``model.safetensors`` keys (minus the leading ``model.``) load one to one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ....cache.context import KV, PAD_MASK, PrefixContext, kv_prefix_context
from .config import PolicyConfig
from ...gemma import GemmaStack
from ...family import PolicyModel, WorkspaceSpec
from ...preprocess import check_prefix_inputs
from ...layers import TimeEmbeddingTable, additive_mask, fold_mask, rope_cos_sin
from ...rtc import RTCGuide, RTCSettings
from ...siglip import SiglipVisionTower

# Modules kept in fp32 when the transformer runs in bf16, as lerobot does: the
# vision path, every norm (AdaRMS dense layers live inside the norms) and the
# small projections outside the two Gemma stacks.
FP32_MODULE_MARKERS = ('vision_tower', 'multi_modal_projector', 'input_layernorm', 'post_attention_layernorm',
                       'model.norm', 'action_in_proj', 'action_out_proj', 'state_proj', 'time_mlp')


@dataclass(frozen=True)
class SuffixLayout:
    """The suffix's attention for one chunk: action tokens written from ``start``; cos, sin [B, H, 1, D];
    folded mask [B, 1, G*H, start + H]; ``state``: pi0's state token's (cos, sin, mask), or None."""

    start: int
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    state: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class ChunkSetup:
    """One chunk's fixed inputs to the Euler loop: layout, K/V workspace [L, 2, B, K, P + S, D] (prefix and
    state part filled), time terms [N + 1, W], RTC guide or None, noise [B, H, A] fp32, steps."""

    layout: SuffixLayout
    workspace: torch.Tensor
    time_terms: torch.Tensor
    guide: Optional[RTCGuide]
    noise: torch.Tensor
    num_steps: int


class MultiModalProjector(nn.Module):
    def __init__(self, vision_width: int, lm_width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision_width, lm_width)


class PaliGemmaModel(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.vision_tower = SiglipVisionTower(config.vision, config.tokens_per_image, config.layer_norm_eps)
        self.multi_modal_projector = MultiModalProjector(config.vision.width, config.language.width)
        self.language_model = GemmaStack(config.language, config.rms_norm_eps, vocab_size=config.vocab_size)


class PaliGemma(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.model = PaliGemmaModel(config)


class GemmaExpert(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        cond_dim = config.expert.width if config.traits.adaptive_expert else None
        self.model = GemmaStack(config.expert, config.rms_norm_eps, cond_dim=cond_dim)


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.paligemma = PaliGemma(config)
        self.gemma_expert = GemmaExpert(config)


class PiZeroModel(PolicyModel):
    """pi0 (a state token, time fused into the action tokens) or pi0.5 (state in the prompt, adaptive
    expert norms), as ``config.traits`` says; inference only. ``set_compute_dtype`` runs the two Gemma
    stacks in a dtype and keeps FP32_MODULE_MARKERS modules in fp32."""

    fp32_markers = FP32_MODULE_MARKERS

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        width = config.expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)
        if config.traits.state_token:
            self.state_proj = nn.Linear(config.max_state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)
        else:
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        self.compute_dtype = torch.float32
        self._time_table = TimeEmbeddingTable(width, config.min_period, config.max_period)

    @property
    def _lm(self) -> GemmaStack:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def _expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    @property
    def action_expert(self) -> nn.Module:
        """The action expert's stack (policy/quant.py keeps it in the compute dtype under int8_weights)."""
        return self._expert

    # ---- prefix ------------------------------------------------------------------
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, N, 3, H, W] in [-1, 1] -> image tokens [B, N*P_img, W_lm] (unscaled projector output)."""
        batch, cameras = images.shape[:2]
        paligemma = self.paligemma_with_expert.paligemma.model
        tokens = paligemma.vision_tower(images.flatten(0, 1).float(), torch.float32)   # [B*N, P_img, W_vis]
        projected = paligemma.multi_modal_projector.linear(tokens)                      # [B*N, P_img, W_lm]
        return self._lm.stream_input(projected.reshape(batch, cameras * projected.shape[1], -1), self.compute_dtype)

    @torch.no_grad()
    def fill_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                    token_masks: torch.Tensor) -> PrefixContext:
        """Vision tower + language model over the prefix -> read-only K/V context.

        images [B, N, 3, H, W] in [-1, 1]; image_masks [B, N] bool; tokens [B, L] int; token_masks [B, L] bool.
        """
        cfg = self.config
        check_prefix_inputs(cfg, images, image_masks, tokens, token_masks)
        image_tokens = self.embed_images(images)                                       # [B, N*P_img, W]
        text_tokens = self._lm.stream_input(self._lm.embed(tokens), self.compute_dtype)  # [B, L, W]
        x = torch.cat([image_tokens, text_tokens], dim=1)                              # [B, P, W]
        image_pad = image_masks[:, :, None].expand(-1, -1, cfg.tokens_per_image).reshape(images.shape[0], -1)
        pad = torch.cat([image_pad, token_masks.bool()], dim=1)                        # [B, P]
        positions = pad.long().cumsum(dim=1) - 1
        cos, sin = rope_cos_sin(positions, cfg.language.head_dim, cfg.rope_theta)
        # Every prefix token has ar=0: valid tokens all see each other.
        allowed = (pad[:, None, :] & pad[:, :, None])[:, None]                         # [B, 1, P, P]
        kv = self._lm.prefix_kv(x, cos, sin, additive_mask(allowed, self.compute_dtype), self.compute_dtype)
        return kv_prefix_context(kv, pad)

    # ---- suffix --------------------------------------------------------------------
    def time_embeddings(self, num_steps: int) -> torch.Tensor:
        """[num_steps + 1, W] fp32: every step's time embedding, then t = 0's (layers.TimeEmbeddingTable)."""
        return self._time_table(num_steps, self.device)

    def _suffix_layout(self, context: PrefixContext) -> 'SuffixLayout':
        """Positions (as RoPE tables) and additive masks of the suffix, fixed for a whole chunk.

        Attention follows the reference's autoregressive blocks (pi0 [state=1, a0=1, a1..=0], pi0.5
        [a0=1, a1..=0]): pi0's state token sees the prefix and itself, so its K/V do not depend on
        the step and are written once per chunk; the action tokens see the prefix, the state token
        and every action token.
        """
        cfg = self.config
        pad = context[PAD_MASK]                                                         # [B, P]
        batch, prefix_len = pad.shape
        horizon, device = cfg.chunk_size, pad.device
        groups = cfg.expert.num_heads // cfg.expert.num_kv_heads
        valid = pad.long().sum(dim=1, keepdim=True)                                     # [B, 1]
        state = None
        start = prefix_len
        if cfg.traits.state_token:
            allowed = torch.cat([pad, pad.new_ones(batch, 1)], dim=1)[:, None, None]     # [B, 1, 1, P+1]
            cos, sin = rope_cos_sin(valid, cfg.expert.head_dim, cfg.rope_theta)
            state = (cos, sin, fold_mask(additive_mask(allowed, self.compute_dtype), groups))
            start += 1
        positions = valid + (start - prefix_len) + torch.arange(horizon, device=device)  # [B, H]
        cos, sin = rope_cos_sin(positions, cfg.expert.head_dim, cfg.rope_theta)
        allowed = torch.cat([pad[:, None, :].expand(batch, horizon, prefix_len),
                             pad.new_ones(batch, horizon, start - prefix_len + horizon)], dim=2)[:, None]
        return SuffixLayout(start, cos, sin, fold_mask(additive_mask(allowed, self.compute_dtype), groups), state)

    def _time_terms(self, num_steps: int) -> torch.Tensor:
        """What the flow time contributes at each step (and at t = 0, last), computed once per chunk: [N + 1, W].

        pi0: the time half of the fused action-time MLP's first layer (with its bias), since
        W [a ; t] + b = W_a a + (W_t t + b); pi0.5: the adaptive-norm condition itself.
        """
        width = self.config.expert.width
        embs = self.time_embeddings(num_steps)                                          # [N + 1, W]
        if not self.config.traits.adaptive_expert:
            layer = self.action_time_mlp_in
            return F.linear(embs, layer.weight[:, width:], layer.bias)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(embs))))

    def _embed_suffix(self, x_t: torch.Tensor, time_terms: torch.Tensor, step: int,
                      clean: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x_t [B, H, A] at step ``step`` -> action tokens [B, H, W] and the adaptive-norm condition or None.

        clean [B, H] bool marks action tokens that see time 0 instead (trained RTC): the time
        term is then per token (pi0: fused into each action token; pi0.5: the condition becomes
        [B, H, W]); otherwise it is shared ([B, W] for pi0.5).
        """
        batch, horizon, _ = x_t.shape
        width = self.config.expert.width
        action_tokens = self.action_in_proj(x_t)                                        # [B, H, W]
        term = time_terms[step]                                                         # [W]
        if clean is not None:
            term = torch.where(clean[..., None], time_terms[-1], term)                  # [B, H, W]
        if not self.config.traits.adaptive_expert:
            hidden = F.linear(action_tokens, self.action_time_mlp_in.weight[:, :width]) + term
            return self._expert.stream_input(self.action_time_mlp_out(F.silu(hidden)), self.compute_dtype), None
        cond = term if clean is not None else term[None].expand(batch, -1)              # [B, H, W] or [B, W]
        return self._expert.stream_input(action_tokens, self.compute_dtype), cond

    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The K/V workspace the loop reads: the prefix K/V extended by the suffix (fast_path.py)."""
        return ((context[KV], context.prefix_len + self.config.suffix_len),)

    @torch.no_grad()
    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                    inference_delay: int = 0, execution_horizon: Optional[int] = None,
                    rtc: Optional[RTCSettings] = None, embodiment: Optional[torch.Tensor] = None,
                    workspace: Optional[Sequence[torch.Tensor]] = None) -> 'ChunkSetup':
        """Everything fixed for one chunk: ``start_chunk`` (inputs checked, the K/V workspace with the prefix,
        the RTC guide), then pi0's state token written into the workspace, the suffix layout, the time terms.

        ``workspace``: caller-owned buffers as ``workspace_spec`` describes them, whose prefix parts already hold
        the entry (the static workspace of vla_policy_node/fast_path.py); nothing is allocated or copied then,
        and the state part is written into them. The stored context is never written: each step writes only
        the action tokens' part of the workspace."""
        start = self.start_chunk(context, noise, num_steps, workspace, prev_chunk_left_over=prev_chunk_left_over,
                                 inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc,
                                 embodiment=embodiment)
        layout = self._suffix_layout(context)
        (kv_workspace,) = start.workspace
        if layout.state is not None:
            if state is None:
                raise ValueError('pi0 needs the normalised state')
            state_token = self._expert.stream_input(self.state_proj(state.float())[:, None], self.compute_dtype)
            self._expert.write_kv(state_token, kv_workspace, context.prefix_len, *layout.state)   # once per chunk
        time_terms = self._time_terms(start.num_steps)                                  # [N + 1, W]
        return ChunkSetup(layout, kv_workspace, time_terms, start.guide, start.noise, start.num_steps)

    @torch.no_grad()
    def euler_loop(self, chunk: 'ChunkSetup') -> torch.Tensor:
        """The per-step loop: x <- x + dt * v(x, t) for every step, from the chunk's noise -> [B, H, A] fp32."""
        guide, layout = chunk.guide, chunk.layout
        clean = guide.clamp[..., 0] if guide is not None and guide.clamp is not None else None   # [B, H]
        dt = -1.0 / chunk.num_steps
        x_t = chunk.noise
        for step in range(chunk.num_steps):
            if guide is not None:
                x_t = guide.clamp_prefix(x_t)
            tokens, cond = self._embed_suffix(x_t, chunk.time_terms, step, clean)      # [B, H, W]
            hidden = self._expert.suffix_forward(tokens, chunk.workspace, layout.start, layout.cos, layout.sin,
                                                 layout.mask, cond)
            velocity = self.action_out_proj(hidden.float())                             # [B, H, A]
            if guide is not None:
                velocity = guide.guide(step, x_t, velocity)
            x_t = x_t + dt * velocity
            if guide is not None:
                x_t = guide.clamp_prefix(x_t)
        return x_t
