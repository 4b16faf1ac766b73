"""GR00T N1.7 (lerobot's GR00TN17), inference only, with a state-free prefix cache.

lerobot (``policies/groot/groot_n1_7.py`` GR00TN17.get_action at huggingface/lerobot 7427f318) runs, per call,

    backbone      Qwen3-VL over [prompt with the image tokens] -> features (qwen3vl.py)
    head          vlln, vl_self_attention over the features; the state encoder (one token)
    denoise       x ~ noise; for t_i = i / N, i < N (time 0 -> 1, noise -> data):
                    tokens = [state ; action_encoder(x, bucket(t_i)) + position embedding]
                    v = action_decoder(AlternateVLDiT(tokens, features, bucket(t_i)))
                    x += (1 / N) * v[-H:] * velocity_scale        (velocity_scale 1 without RTC)

The backbone inputs come from the frames and the task only, and the state reaches only the state token, so this
module splits the call in three:

    fill_prefix   ViT + text model + vlln + vl_self_attention, and every cross block's K/V over the token subset
                  it reads (text blocks: the non-image tokens, image blocks: the image tokens), once per
                  observation -> PrefixContext: kv = the text blocks' K/V [C_text, 2, B, heads, P_text, Dh],
                  pad_mask = which of those text tokens are real [B, P_text], extra = the image blocks' K/V
                  (``image_kv``), the processed features (``features`` [B, P, W], fp32) and the prompt's
                  token mask (``token_mask`` [B, P])
    chunk_setup   per chunk: the state token, every step's time terms (the DiT's AdaLN and output modulations,
                  the action encoder's time encoding), the position embedding rows, GR00T's RTC inpainting
    euler_loop    the N steps from the chunk's tensors alone (no host synchronisation: capturable)

lerobot recomputes the cross K/V over every token at every step and masks; the gathered K/V attend to exactly
the tokens its mask lets through. Right-padded prompts are supported (masked as keys everywhere, also in
vl_self_attention, which lerobot runs unmasked on its unpadded batch of one).

Precision (``set_compute_dtype``): parameters are always fp32 (lerobot's model_params_fp32). float32 is lerobot
with autocast off; bfloat16 runs every call under ``torch.autocast(bfloat16)``, lerobot's inference recipe
(modeling_groot.py predict_action_chunk), with transformers' and diffusers' casts reproduced op for op.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ....cache.context import PrefixContext
from ...family import PolicyModel, WorkspaceSpec, check_chunk_inputs, check_prefix_inputs
from ...layers import PackedLinears
from ...rtc import RTCSettings
from .config import GrootConfig
from .dit import (AlternateVLDiT, CategorySpecificMLP, MultiEmbodimentActionEncoder, SelfAttentionTransformer,
                  action_time_sinusoid)
from .images import patchify
from .qwen3vl import Qwen3Backbone, mrope_positions
from .transforms import inpainting

IMAGE_KV = 'image_kv'
FEATURES = 'features'
TOKEN_MASK = 'token_mask'


class GrootActionHead(nn.Module):
    """lerobot GR00TN17ActionHead's modules (``action_head.*`` keys)."""

    def __init__(self, config: GrootConfig) -> None:
        super().__init__()
        head = config.head
        self.model = AlternateVLDiT(head.dit, head.backbone_embedding_dim)
        self.state_encoder = CategorySpecificMLP(head.max_num_embodiments, head.max_state_dim, head.hidden_size,
                                                 head.input_embedding_dim)
        self.action_encoder = MultiEmbodimentActionEncoder(head.max_action_dim, head.input_embedding_dim,
                                                           head.max_num_embodiments)
        self.action_decoder = CategorySpecificMLP(head.max_num_embodiments, head.hidden_size, head.hidden_size,
                                                  head.max_action_dim)
        self.vlln = nn.LayerNorm(head.backbone_embedding_dim) if head.use_vlln else nn.Identity()
        self.vl_self_attention = (SelfAttentionTransformer(head.vl_self_attention)
                                  if head.vl_self_attention.num_layers > 0 else None)
        if head.add_pos_embed:
            self.position_embedding = nn.Embedding(head.max_seq_len, head.input_embedding_dim)


@dataclass
class GrootChunk:
    """One chunk's fixed inputs to the Euler loop (fast_path.py treats them as a graph's static inputs).

    text_kv [C_text, 2, B, heads, P_text, Dh], image_kv [C_img, 2, B, heads, P_img, Dh]: the cross K/V (the
    workspace); text_mask [B, 1, 1, P_text] bool; embodiment: the id every row uses; state_tokens [B, 1, D]; block_terms
    [N, L, 1, 2D] and out_terms [N, 1, 2D]: the DiT's modulations per step; time_encoding [N, 1, 1, D];
    positions [1, H, D] (zeros without add_pos_embed); x0 [B, H, A] fp32; velocity_scale [B, H, A] fp32.
    """

    text_kv: torch.Tensor
    image_kv: torch.Tensor
    text_mask: torch.Tensor
    embodiment: int
    state_tokens: torch.Tensor
    block_terms: torch.Tensor
    out_terms: torch.Tensor
    time_encoding: torch.Tensor
    positions: torch.Tensor
    x0: torch.Tensor
    velocity_scale: torch.Tensor
    num_steps: int


class GrootModel(PolicyModel):
    """Module names mirror lerobot's GR00TN17 (``_groot_model.`` stripped from the state dict's keys)."""

    def __init__(self, config: GrootConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = Qwen3Backbone(config.backbone, config.head.select_layer)
        self.action_head = GrootActionHead(config)
        self.compute_dtype = torch.float32
        self._tables: Dict[tuple, tuple] = {}

    # ---- precision and device -----------------------------------------------------------------------------
    def param_dtype(self, name: str, compute_dtype: torch.dtype) -> torch.dtype:
        return torch.float32            # lerobot's model_params_fp32: bf16 is autocast over fp32 weights

    def set_compute_dtype(self, dtype: torch.dtype) -> 'GrootModel':
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f'GR00T runs in float32 or bfloat16 (lerobot\'s autocast recipe), not {dtype}')
        return super().set_compute_dtype(dtype)

    @property
    def device(self) -> torch.device:
        return self.action_head.action_decoder.layer2.W.device

    def _autocast(self):
        """lerobot's inference autocast (bf16 over fp32 weights) or nothing (fp32). No weight-cast cache, so a
        captured CUDA graph reads the weights, not a cache filled at capture."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype, cache_enabled=False)

    def _vision_tables(self, grid: Tuple[int, int]) -> Tuple[torch.Tensor, ...]:
        """The ViT's position embeddings and rotary tables for ``grid`` (weights-only: made once, at the first
        fill_prefix, which runs eagerly before any capture)."""
        visual = self.backbone.visual
        key = (grid, visual.pos_embed.weight.device, visual.pos_embed.weight.data_ptr())
        if key not in self._tables:
            self._tables = {key: (visual.position_embeddings(*grid),) + visual.rotary(*grid, key[1])}
        return self._tables[key]

    # ---- prefix (cache miss) ---------------------------------------------------------------------------------
    @torch.no_grad()
    def fill_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                    token_masks: torch.Tensor) -> PrefixContext:
        """images [B, N, 3, h, w] normalised (images.frame_to_model); image_masks [B, N] (all True: GR00T has no
        empty cameras); tokens, token_masks [B, L]: the prompt with its image tokens, right-padded."""
        check_prefix_inputs(self.config, images, image_masks, tokens, token_masks)
        valid = token_masks.bool()
        with self._autocast():
            features, image_index, text_index = self.backbone_features(images, tokens, valid)
            head = self.action_head
            features = head.vlln(features)
            if head.vl_self_attention is not None:
                features = head.vl_self_attention(features, valid[:, None, None, :])
            text_mask = torch.gather(valid, 1, text_index)
            text_kv, image_kv = self._cross_kv(features, text_index, image_index)
        return PrefixContext(kv=text_kv, pad_mask=text_mask,
                             extra={IMAGE_KV: image_kv, FEATURES: features.float(), TOKEN_MASK: valid})

    def backbone_features(self, images: torch.Tensor, tokens: torch.Tensor,
                          valid: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Qwen3Backbone.forward: ViT, the image tokens' embeddings replaced, mRoPE, the text model -> features
        [B, L, W] (lerobot's ``backbone_features``), the image tokens' positions [B, N_img] and the other
        tokens' [B, L - N_img], each in prompt order (a stable sort: no host synchronisation)."""
        cfg = self.config
        batch, cameras = images.shape[:2]
        image_tokens = cameras * cfg.tokens_per_image
        geometry = cfg.geometry
        grid = geometry.grid
        pixels = patchify(images.flatten(0, 1).float(), geometry)                 # [B*N, h*w, C*T*p*p]
        merged, taps = self.backbone.visual(pixels, *grid, tables=self._vision_tables(grid))
        text = self.backbone.language_model
        embeds = text.embed_tokens(tokens)
        is_image = tokens == cfg.backbone.image_token_id
        order = torch.argsort((~is_image).to(torch.int8), dim=1, stable=True)       # image tokens first, in order
        image_index, text_index = order[:, :image_tokens], order[:, image_tokens:]
        width = embeds.shape[-1]
        scatter = image_index[:, :, None].expand(-1, -1, width)
        embeds = embeds.scatter(1, scatter, merged.reshape(batch, image_tokens, width).to(embeds.dtype))
        positions = mrope_positions(is_image, cfg.tokens_per_image, grid[1] // geometry.merge_size,
                                    max(grid) // geometry.merge_size)
        features = text(embeds, positions, valid, image_index,
                        [tap.reshape(batch, image_tokens, width) for tap in taps])
        return features, image_index, text_index

    def _cross_kv(self, features: torch.Tensor, text_index: torch.Tensor,
                  image_index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every cross block's to_k / to_v over its token subset -> (text blocks', image blocks') K/V stacked
        [C, 2, B, heads, P_subset, Dh]."""
        width = features.shape[-1]
        subsets = {True: torch.gather(features, 1, text_index[:, :, None].expand(-1, -1, width)),
                   False: torch.gather(features, 1, image_index[:, :, None].expand(-1, -1, width))}
        dit = self.action_head.model
        stacks = {True: [], False: []}
        for index in self.config.cross_blocks:
            reads_text = dit.size.attends_text(index)
            stacks[reads_text].append(torch.stack(dit.transformer_blocks[index].attn1.kv(subsets[reads_text])))
        out = []
        for reads_text in (True, False):
            if stacks[reads_text]:
                out.append(torch.stack(stacks[reads_text]))
            else:
                batch, tokens = subsets[reads_text].shape[:2]
                size = dit.size
                out.append(features.new_zeros(0, 2, batch, size.num_heads, tokens, size.head_dim))
        return out[0], out[1]

    # ---- per chunk -------------------------------------------------------------------------------------------
    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The loop reads the cross K/V only, at their own lengths (no suffix is written into them)."""
        image_kv = context.extra[IMAGE_KV]
        return ((context.kv, context.kv.shape[-2]), (image_kv, image_kv.shape[-2]))

    @torch.no_grad()
    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                    inference_delay: int = 0, execution_horizon: Optional[int] = None,
                    rtc: Optional[RTCSettings] = None,
                    workspace: Optional[Sequence[torch.Tensor]] = None) -> GrootChunk:
        """Everything fixed for one chunk; ``context`` is only read. RTC: GR00T's inpainting (transforms.py)
        whenever ``rtc`` is given with a leftover (its mode and schedule are pi-style guidance settings GR00T has
        no use for; ``execution_horizon``, else ``rtc.execution_horizon``, bounds the overlap)."""
        cfg = self.config
        if state is None or tuple(state.shape) != (context.batch_size, cfg.max_state_dim):
            raise ValueError(f'GR00T needs the normalised state [B, {cfg.max_state_dim}]')
        steps = check_chunk_inputs(cfg, context, noise, num_steps)
        spec = self.workspace_spec(context)
        if workspace is None:
            buffers = tuple(source for source, _ in spec)          # read in place: the loop never writes them
        else:
            buffers = tuple(workspace)
            if len(buffers) != 2 or any(tuple(b.shape) != tuple(s.shape) for b, (s, _) in zip(buffers, spec)):
                raise ValueError('workspace must be the two cross K/V buffers of workspace_spec')
        batch, horizon, _ = noise.shape
        device = noise.device
        head = self.action_head
        buckets = [int(step / float(steps) * cfg.head.num_timestep_buckets) for step in range(steps)]
        timesteps = torch.tensor(buckets, dtype=torch.long, device=device)
        width = cfg.head.input_embedding_dim
        with self._autocast():
            state_tokens = head.state_encoder(state.float().view(batch, 1, -1), cfg.embodiment_id)
            block_terms, out_terms = head.model.time_terms(timesteps)          # [L, N, 2D], [N, 2D]
            time_encoding = action_time_sinusoid(timesteps, width)             # [N, D]
        if cfg.head.add_pos_embed:
            positions = head.position_embedding(torch.arange(horizon, device=device))[None]
        else:
            positions = torch.zeros(1, horizon, width, device=device)
        guide = None
        if rtc is not None:
            guide = inpainting(prev_chunk_left_over, noise, inference_delay,
                               execution_horizon if execution_horizon is not None else rtc.execution_horizon,
                               cfg.rtc_ramp_rate)
        x0 = noise.float().clone() if guide is None else guide.x0
        scale = torch.ones_like(x0) if guide is None else guide.velocity_scale
        return GrootChunk(text_kv=buffers[0], image_kv=buffers[1], text_mask=context.pad_mask[:, None, None, :],
                          embodiment=cfg.embodiment_id, state_tokens=state_tokens,
                          block_terms=block_terms.transpose(0, 1)[:, :, None], out_terms=out_terms[:, None],
                          time_encoding=time_encoding[:, None, None], positions=positions, x0=x0,
                          velocity_scale=scale, num_steps=steps)

    # ---- per step --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def euler_loop(self, chunk: GrootChunk) -> torch.Tensor:
        """x <- x + (1 / N) * v(x, t_i) * velocity_scale for i = 0 .. N - 1 -> [B, H, A] fp32."""
        head = self.action_head
        x = chunk.x0
        batch, horizon, _ = x.shape
        dt = 1.0 / chunk.num_steps
        # Each cross block's K/V (its slot in the text or the image stack) and key mask (image tokens are all real).
        cross_kv, masks, used = [], [], {True: 0, False: 0}
        for index in self.config.cross_blocks:
            reads_text = head.model.size.attends_text(index)
            stack = chunk.text_kv if reads_text else chunk.image_kv
            cross_kv.append((stack[used[reads_text], 0], stack[used[reads_text], 1]))
            used[reads_text] += 1
            masks.append(chunk.text_mask if reads_text else None)
        with self._autocast(), self._packer(batch * (1 + horizon), x.device):
            for step in range(chunk.num_steps):
                time = chunk.time_encoding[step].expand(batch, horizon, -1)
                tokens = head.action_encoder(x, time, chunk.embodiment) + chunk.positions
                tokens = torch.cat([chunk.state_tokens, tokens], dim=1)
                out = head.model(tokens, chunk.block_terms[step], chunk.out_terms[step], tuple(cross_kv), tuple(masks))
                velocity = head.action_decoder(out, chunk.embodiment)
                x = x + dt * velocity[:, -horizon:] * chunk.velocity_scale
        return x.float()

    def _packer(self, rows: int, device: torch.device):
        """CPU fp32 with MKL: the DiT's weights prepacked for the loop's B * (1 + H)-row GEMMs (layers.PackedLinears:
        the same values, one more copy of the packed weights while the packer lives); otherwise a no-op context."""
        if device.type != 'cpu' or self.compute_dtype != torch.float32 or not PackedLinears.available():
            return contextlib.nullcontext()
        packer = getattr(self, '_packed_linears', None)
        if packer is None or packer.rows != rows:
            packer = self._packed_linears = PackedLinears(rows)
        return packer
