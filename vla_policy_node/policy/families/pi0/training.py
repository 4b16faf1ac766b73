"""pi0's training forward and flow-matching loss, as lerobot and openpi train it (the embedded demo's trainer).

``vla_policy_train_demo`` (vla_policy_node/train_demo.py) fits the tiny pi0 of ``builtin:demo`` with these;
inference never imports this module. The forward is built from the model's own submodules (names as lerobot's checkpoint
keys) and each decoder layer's own forward, so training and inference run the same layers.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...layers import FusedProjection, additive_mask, fold_mask, rope_cos_sin, sincos_time_embedding

# lerobot PI0Config (configuration_pi0.py, lerobot 7427f318) and openpi pi0.py compute_loss:
# time ~ Beta(1.5, 1) * 0.999 + 0.001.
TIME_BETA_ALPHA = 1.5
TIME_BETA_BETA = 1.0
TIME_SCALE = 0.999
TIME_OFFSET = 0.001


class _DifferentiableProjection:
    """Stands in for a FusedProjection while training: the same outputs from the module's own linears, so
    gradients reach their parameters (the fused inference GEMM runs on a detached concatenation)."""

    def __init__(self, fused: FusedProjection) -> None:
        self.fused = fused

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.linear(x, linear.weight, linear.bias) for linear in self.fused.linears], dim=-1)


@contextlib.contextmanager
def trainable(model: nn.Module) -> Iterator[nn.Module]:
    """``with trainable(model):`` every parameter owns its storage and every fused projection is replaced by
    a differentiable one; on exit the fused projections are back (they re-fuse on their next call)."""
    for param in model.parameters():
        param.data = param.data.clone()           # fused views -> own storage, for the optimiser
    swapped: List[Tuple[object, str, FusedProjection]] = []
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, FusedProjection):
                swapped.append((module, name, value))
                setattr(module, name, _DifferentiableProjection(value))
    model.train()
    try:
        yield model
    finally:
        for module, name, value in swapped:
            setattr(module, name, value)
        model.eval()


def predict_velocity(model: nn.Module, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                     token_masks: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor,
                     time_t: torch.Tensor) -> torch.Tensor:
    """pi0's training forward: prefix and suffix in one pass, both streams layer by layer -> v_t [B, H, A].

    Built from the model's submodules (names as lerobot's checkpoint keys) and each decoder layer's own
    forward, as lerobot's PI0Pytorch.forward / openpi's Pi0.compute_loss compute it: prefix = [image
    tokens (projector output) ; language embeddings (scaled by sqrt(width))], suffix = [state_proj(state) ;
    action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t) ; sincos(t)])))], autoregressive
    blocks [prefix = 0, state = 1, a0 = 1, a1.. = 0], positions cumsum(pad) - 1. The prefix never attends to
    the suffix, so each layer runs the prefix first (its own K/V), then the suffix against [prefix ; suffix]
    K/V: exactly the joint attention, in two calls of the same layers inference uses.

    images [B, N, 3, h, w] in [-1, 1]; image_masks [B, N]; tokens, token_masks [B, L]; state [B, max_state_dim]
    normalised and zero-padded; x_t [B, H, max_action_dim]; time_t [B].
    """
    cfg = model.config
    paligemma = model.paligemma_with_expert.paligemma.model
    language = paligemma.language_model
    expert = model.paligemma_with_expert.gemma_expert.model
    batch, cameras = images.shape[:2]
    horizon = cfg.chunk_size
    # ---- prefix embeddings
    vision = paligemma.vision_tower(images.flatten(0, 1).float(), torch.float32)          # [B*N, P_img, W_vis]
    image_tokens = paligemma.multi_modal_projector.linear(vision).reshape(batch, cameras * vision.shape[1], -1)
    prefix = torch.cat([image_tokens, language.embed(tokens)], dim=1)                      # [B, P, W_lm]
    image_pad = image_masks[:, :, None].expand(-1, -1, cfg.tokens_per_image).reshape(batch, -1)
    pad = torch.cat([image_pad, token_masks.bool()], dim=1)                                # [B, P]
    prefix_len = pad.shape[1]
    # ---- suffix embeddings (pi0: state token, then the action tokens with the time fused in)
    width = cfg.expert.width
    state_token = model.state_proj(state.float())[:, None]                                # [B, 1, W]
    action_emb = model.action_in_proj(x_t.float())                                        # [B, H, W]
    time_emb = sincos_time_embedding(time_t, width, cfg.min_period, cfg.max_period).float()
    fused = torch.cat([action_emb, time_emb[:, None].expand(-1, horizon, -1)], dim=2)      # [B, H, 2W]
    action_tokens = model.action_time_mlp_out(F.silu(model.action_time_mlp_in(fused)))
    suffix = torch.cat([state_token, action_tokens], dim=1)                               # [B, S, W]
    suffix_len = suffix.shape[1]
    # ---- positions and masks
    size = cfg.language
    groups = size.num_heads // size.num_kv_heads
    cos_p, sin_p = rope_cos_sin(pad.long().cumsum(dim=1) - 1, size.head_dim, cfg.rope_theta)
    mask_p = fold_mask(additive_mask((pad[:, None, :] & pad[:, :, None])[:, None], torch.float32), groups)
    valid = pad.long().sum(dim=1, keepdim=True)
    cos_s, sin_s = rope_cos_sin(valid + torch.arange(suffix_len), size.head_dim, cfg.rope_theta)
    sees_suffix = torch.ones(suffix_len, suffix_len, dtype=torch.bool)
    sees_suffix[0, 1:] = False                                          # the state token sees only itself
    allowed = torch.cat([pad[:, None, :].expand(batch, suffix_len, prefix_len),
                         sees_suffix[None].expand(batch, -1, -1)], dim=2)[:, None]        # [B, 1, S, P+S]
    mask_s = fold_mask(additive_mask(allowed, torch.float32), groups)
    # ---- the two streams, layer by layer
    x_p, x_s = prefix, suffix
    depth = len(language.layers)
    for i, (lm_layer, ex_layer) in enumerate(zip(language.layers, expert.layers)):
        kv_prefix = x_p.new_zeros(2, batch, size.num_kv_heads, prefix_len, size.head_dim)
        # The last prefix layer's output feeds nothing the loss reads (pi0 reads the suffix only).
        x_p = lm_layer(x_p, kv_prefix, 0, cos_p, sin_p, mask_p, kv_only=i == depth - 1)
        kv = torch.cat([kv_prefix, kv_prefix.new_zeros(2, batch, size.num_kv_heads, suffix_len, size.head_dim)], 3)
        x_s = ex_layer(x_s, kv, prefix_len, cos_s, sin_s, mask_s)
    hidden = expert.final_norm(x_s, None)[:, -horizon:]
    return model.action_out_proj(hidden.float())


def sample_time(batch: int) -> torch.Tensor:
    """Flow-matching time, as lerobot's sample_time_beta (policies/common/flow_matching.py) and openpi's
    compute_loss draw it: Beta(1.5, 1) * 0.999 + 0.001, so t = 1 is (nearly) pure noise."""
    beta = torch.distributions.Beta(torch.tensor(TIME_BETA_ALPHA), torch.tensor(TIME_BETA_BETA))
    return beta.sample((batch,)) * TIME_SCALE + TIME_OFFSET


def flow_matching_loss(model: nn.Module, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                       token_masks: torch.Tensor, state: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor,
                       time_t: torch.Tensor, action_dim: int) -> torch.Tensor:
    """pi0's flow-matching loss, as lerobot's PI0Pytorch.forward + PI0Policy.forward
    (src/lerobot/policies/pi0/modeling_pi0.py, lerobot 7427f318) and openpi's Pi0.compute_loss
    (src/openpi/models/pi0.py) compute it:

        x_t = t * noise + (1 - t) * actions,   u_t = noise - actions,   loss = mean((v_t - u_t)^2)

    ``actions`` [B, H, max_action_dim] are normalised and zero-padded past ``action_dim`` (lerobot's
    pad_vector); ``noise`` covers every dimension, padding included. Padded dimensions: lerobot truncates
    the per-element loss to the real action dimensions (``losses[:, :, :original_action_dim]``) before the
    mean, and so does this; openpi averages over all padded dimensions too (it predicts u = noise there).
    Inference reads only the first ``action_dim`` outputs either way.
    """
    t = time_t[:, None, None]
    x_t = t * noise + (1 - t) * actions
    u_t = noise - actions
    v_t = predict_velocity(model, images, image_masks, tokens, token_masks, state, x_t, time_t)
    return F.mse_loss(v_t, u_t, reduction='none')[:, :, :action_dim].mean()
