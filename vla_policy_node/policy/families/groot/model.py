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

    fill_prefix   ViT + text model + vlln + vl_self_attention at the prompt's own length, and every cross block's
                  K/V over the token subset it reads (text blocks: the non-image tokens, image blocks: the image
                  tokens), once per observation -> a PrefixContext of three token sequences, each with its mask:
                    prefix   ``features`` [B, P, W] fp32 (the processed features) and ``token_mask`` [B, P]
                    text     ``text_kv`` [C_text, 2, B, heads, P - I, Dh] and ``text_mask`` [B, P - I]
                    image    ``image_kv`` [C_img, 2, B, heads, I, Dh] and ``image_mask`` [B, I] (all True)
                  P is the prompt bucket (the runtime's prompt_buckets): the prompt's own tokens, then masked zeros
    chunk_setup   per chunk: the state token, the RTC guide (GR00T's inpainting, ``rtc_guide``); the time terms
                  (the DiT's AdaLN and output modulations, the action encoder's time encoding) and the position
                  rows depend on the step count alone and are made once per step count (``time_table``)
    euler_loop    the N steps from the chunk's tensors alone (no host synchronisation: capturable)

Why the prompt runs at its own length but the cross K/V are padded: lerobot's vl_self_attention attends over every
token of its unpadded batch of one, unmasked, so the backbone and the self-attention run on the prompt's real tokens
only (the prefix's shape follows the instruction: ``capturable_prefix`` is False). Everything after them is exact
under padding: the DiT's cross-attention masks its keys, so the text K/V padded to the bucket with a False mask give
the same attention, and the denoise has one shape per bucket (the fast path's static workspace and graphs).

lerobot recomputes the cross K/V over every token at every step and masks; the gathered K/V attend to exactly
the tokens its mask lets through.

Precision (``set_compute_dtype``): parameters are always fp32 (lerobot's model_params_fp32). float32 is lerobot
with autocast off; bfloat16 runs every call under ``torch.autocast(bfloat16)``, lerobot's inference recipe
(modeling_groot.py predict_action_chunk), with transformers' and diffusers' casts reproduced op for op.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ....cache.context import PREFIX, ContextAxes, PrefixContext
from ...family import PolicyModel, WorkspaceSpec
from ...layers import loop_packer
from ...rtc import RTCSettings
from .config import GrootConfig
from .dit import (AlternateVLDiT, CategorySpecificMLP, MultiEmbodimentActionEncoder, SelfAttentionTransformer,
                  action_time_sinusoid)
from .images import patchify
from .qwen3vl import Qwen3Backbone, mrope_positions
from .transforms import Inpainting, inpainting

FEATURES, TOKEN_MASK = 'features', 'token_mask'
TEXT_KV, TEXT_MASK, TEXT = 'text_kv', 'text_mask', 'text'
IMAGE_KV, IMAGE_MASK, IMAGE = 'image_kv', 'image_mask', 'image'
# [C, 2, B, heads, T, Dh]: cross block, (key, value), batch, heads, the sequence's tokens, head dim.
TEXT_KV_AXES = ContextAxes(batch=2, tokens=4, sequence=TEXT)
IMAGE_KV_AXES = ContextAxes(batch=2, tokens=4, sequence=IMAGE)
CONTEXT_AXES = {FEATURES: ContextAxes(0, 1, PREFIX), TOKEN_MASK: ContextAxes(0, 1, PREFIX), TEXT_KV: TEXT_KV_AXES,
                TEXT_MASK: ContextAxes(0, 1, TEXT), IMAGE_KV: IMAGE_KV_AXES, IMAGE_MASK: ContextAxes(0, 1, IMAGE)}
CONTEXT_MASKS = {PREFIX: TOKEN_MASK, TEXT: TEXT_MASK, IMAGE: IMAGE_MASK}


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


class GrootPrefixInputs(NamedTuple):
    """What fill_prefix takes (``GrootFamily.prefix_inputs``): images [B, N, 3, h, w] normalised (each camera
    through images.frame_to_model on its own), tokens [B, L] (the prompt's own tokens, image tokens expanded) and
    token_mask [B, P >= L] (True: a real token among the first L; P: the prompt bucket)."""

    images: torch.Tensor
    tokens: torch.Tensor
    token_mask: torch.Tensor


@dataclass
class TimeTable:
    """What depends on the step count alone (weights and N), made once per step count and reused by every chunk:
    block_terms [N, L, 1, 2W] and out_terms [N, 1, 2W] (the DiT's AdaLN and output modulations per step),
    time_encoding [N, 1, 1, D] (the action encoder's sin-cos of each step's bucket), positions [1, H, D] (the
    action tokens' position rows; zeros without add_pos_embed)."""

    block_terms: torch.Tensor
    out_terms: torch.Tensor
    time_encoding: torch.Tensor
    positions: torch.Tensor


@dataclass
class GrootChunk:
    """One chunk's fixed inputs to the Euler loop (fast_path.py treats them as a graph's static inputs).

    text_kv [C_text, 2, B, heads, T, Dh], image_kv [C_img, 2, B, heads, I, Dh]: the cross K/V (the workspace);
    text_mask [B, 1, 1, T] bool; embodiment: the id every row uses (one GEMM over the rows) or [B] int64 (per row);
    state_tokens [B, 1, D]; the step count's TimeTable; noise [B, H, A] fp32; guide: GR00T's inpainting
    (transforms.Inpainting, batch-first) or None.
    """

    text_kv: torch.Tensor
    image_kv: torch.Tensor
    text_mask: torch.Tensor
    embodiment: Union[int, torch.Tensor]
    state_tokens: torch.Tensor
    times: TimeTable
    noise: torch.Tensor
    guide: Optional[Inpainting]
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
        self._time_tables: Dict[tuple, TimeTable] = {}

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

    @property
    def action_expert(self) -> nn.Module:
        """The action head: the DiT, the state / action encoders and the decoder every step runs."""
        return self.action_head

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
    def fill_prefix(self, images: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor) -> PrefixContext:
        """GrootPrefixInputs -> the context (module docstring): the backbone over the L tokens, every sequence
        padded to the bucket P with masked zeros."""
        check_groot_inputs(self.config, images, tokens, token_mask)
        length, bucket = tokens.shape[1], token_mask.shape[1]
        valid = token_mask[:, :length].bool()
        with self._autocast():
            features, image_index, text_index = self.backbone_features(images, tokens, valid)
            head = self.action_head
            features = head.vlln(features)
            if head.vl_self_attention is not None:
                features = head.vl_self_attention(features, valid[:, None, None, :])
            text_kv, image_kv = self._cross_kv(features, text_index, image_index)
        text_mask = torch.gather(valid, 1, text_index)
        pad = bucket - length
        image_tokens = image_index.shape[1]
        tensors = {FEATURES: F.pad(features.float(), (0, 0, 0, pad)), TOKEN_MASK: F.pad(valid, (0, pad)),
                   TEXT_KV: F.pad(text_kv, (0, 0, 0, pad)), TEXT_MASK: F.pad(text_mask, (0, pad)),
                   IMAGE_KV: image_kv, IMAGE_MASK: valid.new_ones(valid.shape[0], image_tokens)}
        return PrefixContext(tensors, CONTEXT_AXES, batch_size=valid.shape[0], prefix_len=bucket,
                             masks=CONTEXT_MASKS)

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
                dtype = torch.float32 if self.compute_dtype == torch.float32 else self.compute_dtype
                out.append(features.new_zeros(0, 2, batch, size.num_heads, tokens, size.head_dim, dtype=dtype))
        return out[0], out[1]

    # ---- per chunk -------------------------------------------------------------------------------------------
    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The loop reads the cross K/V only, at their own lengths (no suffix is written into them)."""
        return ((context[TEXT_KV], context[TEXT_KV].shape[-2]), (context[IMAGE_KV], context[IMAGE_KV].shape[-2]))

    def rtc_guide(self, prev_chunk_left_over: Optional[torch.Tensor], noise: torch.Tensor, num_steps: int, *,
                  inference_delay: int, execution_horizon: Optional[int],
                  rtc: Optional[RTCSettings]) -> Optional[Inpainting]:
        """GR00T's own real-time chunking (rtc mode 'inpainting', transforms.inpainting): the leftover's rows start
        the chunk and the velocity ramps in over the overlap; ``execution_horizon``, else ``rtc.execution_horizon``,
        bounds the overlap. None without ``rtc`` or a leftover (the plain loop)."""
        if rtc is None:
            return None
        horizon = execution_horizon if execution_horizon is not None else rtc.execution_horizon
        return inpainting(prev_chunk_left_over, noise, inference_delay, horizon, self.config.rtc_ramp_rate)

    @torch.no_grad()
    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                    inference_delay: int = 0, execution_horizon: Optional[int] = None,
                    rtc: Optional[RTCSettings] = None, embodiment: Optional[torch.Tensor] = None,
                    workspace: Optional[Sequence[torch.Tensor]] = None) -> GrootChunk:
        """Everything fixed for one chunk; ``context`` is only read (without ``workspace`` the loop reads its cross
        K/V in place: it never writes them). ``embodiment`` [B]: each row's (None: the checkpoint's)."""
        cfg = self.config
        if state is None or tuple(state.shape) != (context.batch_size, cfg.max_state_dim):
            raise ValueError(f'GR00T needs the normalised state [B, {cfg.max_state_dim}]')
        buffers = workspace if workspace is not None else (context[TEXT_KV], context[IMAGE_KV])
        start = self.start_chunk(context, noise, num_steps, buffers, prev_chunk_left_over=prev_chunk_left_over,
                                 inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc,
                                 embodiment=embodiment)
        category = chunk_category(start.embodiment, cfg.embodiment_id)
        batch = noise.shape[0]
        with self._autocast():
            state_tokens = self.action_head.state_encoder(state.float().view(batch, 1, -1), category)
        text_kv, image_kv = start.workspace
        return GrootChunk(text_kv=text_kv, image_kv=image_kv, text_mask=context[TEXT_MASK][:, None, None, :],
                          embodiment=category, state_tokens=state_tokens,
                          times=self.time_table(start.num_steps, noise.shape[1], noise.device), noise=start.noise,
                          guide=start.guide, num_steps=start.num_steps)

    def time_table(self, steps: int, horizon: int, device: torch.device) -> TimeTable:
        """The TimeTable of ``steps`` Euler steps, made on first use and kept (a few per model: one per step count,
        horizon, device and dtype); made again when the weights it reads change."""
        head, cfg = self.action_head, self.config
        watched = [head.model.timestep_encoder.timestep_embedder.linear_1.weight, head.model.proj_out_1.weight,
                   *(block.norm1.linear.weight for block in head.model.transformer_blocks)]
        if cfg.head.add_pos_embed:
            watched.append(head.position_embedding.weight)
        key = (steps, horizon, str(device), self.compute_dtype,
               tuple((weight.data_ptr(), weight._version) for weight in watched))
        table = self._time_tables.get(key)
        if table is None:
            buckets = [int(step / float(steps) * cfg.head.num_timestep_buckets) for step in range(steps)]
            timesteps = torch.tensor(buckets, dtype=torch.long, device=device)
            width = cfg.head.input_embedding_dim
            with torch.no_grad(), self._autocast():
                block_terms, out_terms = head.model.time_terms(timesteps)          # [L, N, 2D], [N, 2D]
                time_encoding = action_time_sinusoid(timesteps, width)             # [N, D]
                if cfg.head.add_pos_embed:
                    positions = head.position_embedding(torch.arange(horizon, device=device))[None]
                else:
                    positions = torch.zeros(1, horizon, width, device=device)
            table = TimeTable(block_terms=block_terms.transpose(0, 1)[:, :, None], out_terms=out_terms[:, None],
                              time_encoding=time_encoding[:, None, None], positions=positions)
            if len(self._time_tables) >= 8:
                self._time_tables.clear()
            self._time_tables[key] = table
        return table

    # ---- per step --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def euler_loop(self, chunk: GrootChunk) -> torch.Tensor:
        """x <- x + (1 / N) * v(x, t_i) (* the guide's velocity scale) for i = 0 .. N - 1 -> [B, H, A] fp32."""
        head = self.action_head
        guide, times = chunk.guide, chunk.times
        x = chunk.noise if guide is None else torch.where(guide.keep, guide.target, chunk.noise)
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
        # The DiT's weights prepacked for the loop's B * (1 + H)-row GEMMs (layers.loop_packer).
        with self._autocast(), loop_packer(self, batch * (1 + horizon), x.device, self.compute_dtype):
            for step in range(chunk.num_steps):
                time = times.time_encoding[step].expand(batch, horizon, -1)
                tokens = head.action_encoder(x, time, chunk.embodiment) + times.positions
                tokens = torch.cat([chunk.state_tokens, tokens], dim=1)
                out = head.model(tokens, times.block_terms[step], times.out_terms[step], tuple(cross_kv),
                                 tuple(masks))
                velocity = head.action_decoder(out, chunk.embodiment)
                update = dt * velocity[:, -horizon:]
                x = x + (update if guide is None else update * guide.velocity_scale)
        return x.float()


def chunk_category(embodiment: Optional[torch.Tensor], default: int) -> Union[int, torch.Tensor]:
    """The embodiment the chunk's rows run as: one id for every row (its weight slices are views: one GEMM over
    the rows, as lerobot's per-row slices compute), else the ids [B] (per-row weights)."""
    if embodiment is None:
        return int(default)
    ids = embodiment.tolist()
    return int(ids[0]) if len(set(ids)) == 1 else embodiment


def check_groot_inputs(config: GrootConfig, images: torch.Tensor, tokens: torch.Tensor,
                       token_mask: torch.Tensor) -> None:
    """GrootPrefixInputs against the config: one image per camera at the model size, L <= P <= the longest
    prompt, one batch."""
    cameras = len(config.camera_names)
    height, width = config.image_resolution
    if images.dim() != 5 or tuple(images.shape[1:]) != (cameras, 3, height, width):
        raise ValueError(f'images must be [B, {cameras}, 3, {height}, {width}], got {tuple(images.shape)}')
    batch = images.shape[0]
    if tokens.dim() != 2 or token_mask.dim() != 2 or tokens.shape[0] != batch or token_mask.shape[0] != batch \
            or not config.image_tokens < tokens.shape[1] <= token_mask.shape[1] <= config.tokenizer_max_length:
        raise ValueError(f'tokens [B, L] and token_mask [B, P] need {config.image_tokens} < L <= P <= '
                         f'{config.tokenizer_max_length}, got {tuple(tokens.shape)} and {tuple(token_mask.shape)}')
