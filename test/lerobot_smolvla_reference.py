"""lerobot's SmolVLA inference pipeline written again, in plain torch, apart from the package (tests only).

    raw frames (uint8 HWC, any size), raw state, task
      -> prepare_observation_for_inference   /255, HWC -> CHW, batch
      -> pre-processor                       task + "\\n", tokenizer (right padding, pad_language_to,
                                             tokenizer_max_length, truncation), MEAN_STD state
      -> SmolVLAPolicy.predict_action_chunk  prepare_images (resize_with_pad, padding LEFT/TOP, x*2-1,
                                             present cameras then at most empty_cameras masked ones),
                                             pad state, VLAFlowMatching.sample_actions(noise), slice action_dim
      -> post-processor                      MEAN_STD unnormalise

Sources, huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b (2026-08-23):
``src/lerobot/policies/smolvla/modeling_smolvla.py`` (``prepare_images``, ``prepare_state``,
``embed_prefix``, ``embed_suffix``, ``sample_actions``, ``denoise_step``),
``src/lerobot/policies/smolvla/smolvlm_with_expert.py`` (``apply_rope``, ``get_intermediate_size``,
layer mapping, ``forward_attn_layer``, ``forward_cross_attn_layer``, ``eager_attention_forward``),
``src/lerobot/policies/smolvla/configuration_smolvla.py``, ``src/lerobot/policies/smolvla/processor_smolvla.py``,
``src/lerobot/policies/common/vla_utils.py`` (``resize_with_pad``, ``make_att_2d_masks``,
``create_sinusoidal_pos_embedding``, ``pad_vector``), ``src/lerobot/policies/common/flow_matching.py``
(``euler_integrate``), ``src/lerobot/processor/{newline_task_processor,tokenizer_processor,normalize_processor}.py``,
``src/lerobot/policies/utils.py`` (``prepare_observation_for_inference``), ``src/lerobot/policies/rtc/modeling_rtc.py``
(``RTCProcessor.denoise_step``, ``get_prefix_weights``: guided real-time chunking). The backbone modules lerobot takes
from transformers (5.x): ``models/smolvlm/modeling_smolvlm.py`` (``SmolVLMVisionEmbeddings`` with its bucketised
position ids, ``SmolVLMEncoderLayer``, ``SmolVLMConnector.pixel_shuffle``) and ``models/llama/modeling_llama.py``
(``LlamaRMSNorm``: ``w * x.to(input_dtype)``, ``LlamaMLP``).

Checked against real lerobot (that source, installed in a scratch venv with transformers 5.5.4 and torch 2.11,
``bench/compare_lerobot_smolvla.py``) on the tiny checkpoint of smolvla_fixtures.py: fp32 actions within 1.2e-7
(transformers runs the vision attention through SDPA, here it is written out), the bf16 recipe bit for bit.

Nothing here imports the package: config.json, ``vlm_config.json`` (the backbone's HF config, standing in
for the hub id), model.safetensors (lerobot's keys), the processor statistics and ``tokenizer/tokenizer.json``
are read directly, and every layer is a function over the weight dict.

Precision: by default everything is float32 (weights and activations). ``recipe='bfloat16'`` is lerobot's bf16
recipe as lerobot builds it under transformers 5 (the hub text_config says ``torch_dtype: bfloat16``): the
text decoder (embedding, layers, norm) and the action expert hold bf16 weights, except the expert's
cross-attention k/v_proj (made anew as fp32 nn.Linear); the vision tower, the connector and lerobot's own
projections stay fp32, and activations follow lerobot's casts exactly (``.to(weight dtype)``
before each projection, in-place residual adds into the bf16 output, fp32 RoPE and softmax, ``probs.to(v)``,
the final ``suffix_out.to(float32)``).
"""
import json
import math
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

EPS = 1e-8   # NormalizerProcessorStep / UnnormalizerProcessorStep default eps
VLM = 'model.vlm_with_expert.vlm.model.'
EXPERT = 'model.vlm_with_expert.lm_expert.'


# ---- free functions, each one lerobot's / transformers' ----------------------------------------------------
def resize_with_pad(img: torch.Tensor, height: int, width: int, pad_value: float = 0.0) -> torch.Tensor:
    """vla_utils.resize_with_pad: (b, c, h, w); bilinear, no clamp, padding on the LEFT and TOP."""
    cur_h, cur_w = img.shape[2:]
    if cur_h == height and cur_w == width:
        return img
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = int(cur_h / ratio), int(cur_w / ratio)
    resized = F.interpolate(img, size=(new_h, new_w), mode='bilinear', align_corners=False)
    return F.pad(resized, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=pad_value)


def make_att_2d_masks(pad_masks: torch.Tensor, att_masks: torch.Tensor) -> torch.Tensor:
    cumsum = torch.cumsum(att_masks, dim=1)
    att_2d = cumsum[:, None, :] <= cumsum[:, :, None]
    pad_2d = pad_masks[:, None, :] * pad_masks[:, :, None]
    return att_2d & pad_2d


def apply_rope(x: torch.Tensor, positions: torch.Tensor, max_wavelength: float = 10_000) -> torch.Tensor:
    """smolvlm_with_expert.apply_rope: x [B, L, H, D], split-half rotation computed in fp32."""
    d_half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.to(torch.float32)
    freq_exponents = (2.0 / x.shape[-1]) * torch.arange(d_half, dtype=torch.float32)
    timescale = max_wavelength ** freq_exponents
    radians = positions[..., None].to(torch.float32) / timescale[None, None, :].to(torch.float32)
    radians = radians[..., None, :]
    sin, cos = torch.sin(radians), torch.cos(radians)
    x1, x2 = x.split(d_half, dim=-1)
    res = torch.empty_like(x)
    res[..., :d_half] = x1 * cos - x2 * sin
    res[..., d_half:] = x2 * cos + x1 * sin
    return res.to(dtype)


def sinusoidal_time(time: torch.Tensor, dimension: int, min_period: float, max_period: float) -> torch.Tensor:
    """vla_utils.create_sinusoidal_pos_embedding on CPU (float64), [sin, cos]."""
    fraction = torch.linspace(0.0, 1.0, dimension // 2, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    scaling_factor = 1.0 / period * 2 * math.pi
    sin_input = time[..., None] * scaling_factor
    return torch.cat([torch.sin(sin_input), torch.cos(sin_input)], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: fp32 statistics, ``weight * x.to(input_dtype)`` (plain w, not Gemma's 1 + w)."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(input_dtype)


def linear(x: torch.Tensor, w: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    return F.linear(x, w[name + '.weight'], w.get(name + '.bias'))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate='tanh')   # transformers' gelu_pytorch_tanh


def rtc_prefix_weights(schedule: str, start: int, end: int, total: int) -> torch.Tensor:
    """RTCProcessor.get_prefix_weights (+ _linweights, _add_trailing_zeros, _add_leading_ones)."""
    start = min(start, end)
    schedule = schedule.upper()
    if schedule == 'ZEROS':
        weights = torch.zeros(total)
        weights[:start] = 1.0
        return weights
    if schedule == 'ONES':
        weights = torch.ones(total)
        weights[end:] = 0.0
        return weights
    steps = total - max(total - end, 0) - start
    lin = torch.tensor([]) if end <= start or steps <= 0 else torch.linspace(1, 0, steps + 2)[1:-1]
    if schedule == 'EXP':
        lin = lin * torch.expm1(lin).div(math.e - 1)
    if total - end > 0:
        lin = torch.cat([lin, torch.zeros(total - end)])
    if min(start, total) > 0:
        lin = torch.cat([torch.ones(min(start, total)), lin])
    return lin


def rtc_denoise_step(rtc: Mapping, x_t, prev_chunk_left_over, inference_delay, time, denoise, execution_horizon):
    """RTCProcessor.denoise_step (guided mode), autograd and all, as lerobot runs it."""
    tau = 1 - time
    if prev_chunk_left_over is None:
        return denoise(x_t)
    x_t = x_t.clone().detach()
    if prev_chunk_left_over.dim() < 3:
        prev_chunk_left_over = prev_chunk_left_over.unsqueeze(0)
    if execution_horizon is None:
        execution_horizon = rtc.get('execution_horizon', 10)
    execution_horizon = min(execution_horizon, prev_chunk_left_over.shape[1])
    bsz, chunk, dim = x_t.shape
    if prev_chunk_left_over.shape[1] < chunk or prev_chunk_left_over.shape[2] < dim:
        padded = torch.zeros(bsz, chunk, dim)
        padded[:, :prev_chunk_left_over.shape[1], :prev_chunk_left_over.shape[2]] = prev_chunk_left_over
        prev_chunk_left_over = padded
    weights = rtc_prefix_weights(rtc.get('prefix_attention_schedule', 'LINEAR'), inference_delay,
                                 execution_horizon, chunk).unsqueeze(0).unsqueeze(-1)
    with torch.enable_grad():
        v_t = denoise(x_t)
        x_t.requires_grad_(True)
        x1_t = x_t - time * v_t
        err = (prev_chunk_left_over - x1_t) * weights
        correction = torch.autograd.grad(x1_t, x_t, err.clone().detach(), retain_graph=False)[0]
    max_guidance_weight = torch.as_tensor(rtc.get('max_guidance_weight', 10.0))
    tau_tensor = torch.as_tensor(tau)
    squared_one_minus_tau = (1 - tau_tensor) ** 2
    inv_r2 = (squared_one_minus_tau + tau_tensor ** 2) / squared_one_minus_tau
    c = torch.nan_to_num((1 - tau_tensor) / tau_tensor, posinf=max_guidance_weight)
    guidance_weight = torch.minimum(torch.nan_to_num(c * inv_r2, posinf=max_guidance_weight), max_guidance_weight)
    return v_t - guidance_weight * correction


# ---- the reference ----------------------------------------------------------------------------------------
class LerobotSmolVLAReference:
    """One SmolVLA checkpoint folder driven as lerobot drives it, on the CPU."""

    def __init__(self, folder: Path, recipe: str = 'float32') -> None:
        from tokenizers import Tokenizer
        self.folder = Path(folder)
        self.raw = json.loads((self.folder / 'config.json').read_text())
        if self.raw.get('type') != 'smolvla':
            raise ValueError(f"not a smolvla config: type {self.raw.get('type')!r}")
        if self.raw.get('adapt_to_pi_aloha') or self.raw.get('add_image_special_tokens'):
            raise NotImplementedError('adapt_to_pi_aloha / add_image_special_tokens are not re-implemented')
        self.vlm = json.loads((self.folder / 'vlm_config.json').read_text())
        self.vis, self.txt = self.vlm['vision_config'], self.vlm['text_config']
        features = self.raw['input_features']
        # config.image_features in config order; validate_features() appends the empty cameras.
        self.image_keys = [key for key, feat in features.items() if feat['type'] == 'VISUAL']
        self.image_keys += [f'observation.images.empty_camera_{i}' for i in range(self.raw.get('empty_cameras', 0))]
        self.action_dim = self.raw['output_features']['action']['shape'][0]
        self.norm_map = self.raw['normalization_mapping']
        self.state_stats = self._stats('policy_preprocessor.json', 'normalizer_processor', 'observation.state')
        self.action_stats = self._stats('policy_postprocessor.json', 'unnormalizer_processor', 'action')
        self.tokenizer = Tokenizer.from_file(str(self.folder / 'tokenizer' / 'tokenizer.json'))
        self.pad_id = self.tokenizer.token_to_id('<|im_end|>')

        # SmolVLMWithExpertModel.__init__: text layers cut to num_vlm_layers, the expert a Llama copy.
        self.hidden = self.txt['hidden_size']
        self.heads, self.kv_heads = self.txt['num_attention_heads'], self.txt['num_key_value_heads']
        self.head_dim = self.txt.get('head_dim') or self.hidden // self.heads
        self.rms_eps = self.txt.get('rms_norm_eps', 1e-5)
        total = self.txt['num_hidden_layers']
        n_vlm = self.raw.get('num_vlm_layers', -1)
        self.num_vlm_layers = min(n_vlm, total) if n_vlm > 0 else total
        n_exp = self.raw.get('num_expert_layers', -1)
        self.num_expert_layers = n_exp if n_exp > 0 else self.num_vlm_layers
        assert self.num_vlm_layers % self.num_expert_layers == 0
        self.expert_hidden = int(self.hidden * self.raw['expert_width_multiplier'])
        self.every = self.raw.get('self_attn_every_n_layers', -1)
        self.attention_mode = self.raw.get('attention_mode', 'self_attn')

        weights = load_file(str(self.folder / 'model.safetensors'))
        self.recipe = recipe
        if recipe == 'bfloat16':
            # As lerobot builds it (checked with lerobot 0.6.2 + transformers 5.5.4): the text model and the
            # expert from the bf16 text_config; the cross-attention layers' k/v_proj are nn.Linear made anew
            # in SmolVLMWithExpertModel.__init__ and stay fp32, as do lm_head, vision, connector, projections.
            fp32 = {f'{EXPERT}layers.{j}.self_attn.{n}_proj.weight' for j in range(self.num_expert_layers)
                    for n in 'kv' if 'cross' in self.attention_mode and not (self.every > 0 and j % self.every == 0)}
            low = ('model.vlm_with_expert.vlm.model.text_model.', EXPERT)
            weights = {k: (v.to(torch.bfloat16) if k.startswith(low) and k not in fp32 else v)
                       for k, v in weights.items()}
        elif recipe != 'float32':
            raise ValueError(recipe)
        self.w = weights

    def _stats(self, json_name: str, step_name: str, feature: str) -> Dict[str, torch.Tensor]:
        steps = json.loads((self.folder / json_name).read_text())['steps']
        step = next(s for s in steps if s['registry_name'] == step_name)
        flat = load_file(str(self.folder / step['state_file']))
        return {key[len(feature) + 1:]: value.float() for key, value in flat.items() if key.startswith(feature + '.')}

    # ---- processor steps ------------------------------------------------------------------------------
    def normalize_state(self, raw_state: torch.Tensor) -> torch.Tensor:
        assert self.norm_map['STATE'] == 'MEAN_STD'
        return (raw_state - self.state_stats['mean']) / (self.state_stats['std'] + EPS)

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        assert self.norm_map['ACTION'] == 'MEAN_STD'
        return actions * self.action_stats['std'] + self.action_stats['mean']

    def tokens(self, task: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """NewLineTaskProcessorStep + TokenizerProcessorStep(padding=pad_language_to, padding_side='right',
        max_length=tokenizer_max_length, truncation=True): ids [1, L] int64, attention mask [1, L] bool."""
        text = task if task.endswith('\n') else f'{task}\n'
        max_length = self.raw['tokenizer_max_length']
        ids = self.tokenizer.encode(text).ids[:max_length]       # SmolVLM2's tokenizer adds no BOS / EOS
        length = max_length if self.raw.get('pad_language_to', 'longest') == 'max_length' else len(ids)
        tokens = torch.full((1, length), self.pad_id, dtype=torch.long)
        tokens[0, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        masks = torch.zeros(1, length, dtype=torch.bool)
        masks[0, :len(ids)] = True
        return tokens, masks

    def images(self, frames: Mapping[str, np.ndarray]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """prepare_observation_for_inference + SmolVLAPolicy.prepare_images: lists of [1, 3, h, w] in [-1, 1]
        and [1] bool masks; present cameras in config order, then at most ``empty_cameras`` masked ones."""
        batch = {f'observation.images.{name}': (torch.from_numpy(np.ascontiguousarray(frame)).type(torch.float32)
                                                / 255).permute(2, 0, 1).contiguous()[None]
                 for name, frame in frames.items()}
        present = [key for key in self.image_keys if key in batch]
        missing = [key for key in self.image_keys if key not in batch]
        if not present:
            raise ValueError('All image features are missing from the batch.')
        width, height = self.raw['resize_imgs_with_padding']        # stored as (width, height)
        images, masks = [], []
        for key in present:
            img = resize_with_pad(batch[key], height, width, pad_value=0)
            images.append(img * 2.0 - 1.0)
            masks.append(torch.ones(1, dtype=torch.bool))
        for n in range(len(missing)):
            if n >= self.raw.get('empty_cameras', 0):
                break
            images.append(torch.ones_like(images[-1]) * -1)
            masks.append(torch.zeros_like(masks[-1]))
        return images, masks

    # ---- backbone ---------------------------------------------------------------------------------------
    def vision_position_ids(self, n_h: int, n_w: int) -> torch.Tensor:
        """SmolVLMVisionEmbeddings' bucketised ids for a full (unmasked) patch grid."""
        side = self.vis['image_size'] // self.vis['patch_size']
        boundaries = torch.arange(1 / side, 1.0, 1 / side)
        h_idx = torch.arange(n_h, dtype=torch.float32)
        w_idx = torch.arange(n_w, dtype=torch.float32)
        frac_h = torch.clamp(h_idx[None, :] * (1.0 / torch.tensor([n_h]))[:, None], max=1.0 - 1e-6)
        frac_w = torch.clamp(w_idx[None, :] * (1.0 / torch.tensor([n_w]))[:, None], max=1.0 - 1e-6)
        bucket_h = torch.bucketize(frac_h, boundaries, right=True)
        bucket_w = torch.bucketize(frac_w, boundaries, right=True)
        return (bucket_h[:, :, None] * side + bucket_w[:, None, :]).reshape(1, -1)

    def embed_image(self, img: torch.Tensor) -> torch.Tensor:
        """SigLIP (SmolVLMVisionTransformer) + connector (pixel shuffle, projection): [1, tokens, hidden]."""
        w, p = self.w, VLM + 'vision_model.'
        patch = self.vis['patch_size']
        dtype = w[p + 'embeddings.patch_embedding.weight'].dtype
        x = F.conv2d(img.to(dtype), w[p + 'embeddings.patch_embedding.weight'],
                     w[p + 'embeddings.patch_embedding.bias'], stride=patch)
        x = x.flatten(2).transpose(1, 2)
        pos = self.vision_position_ids(img.shape[2] // patch, img.shape[3] // patch)
        x = x + F.embedding(pos, w[p + 'embeddings.position_embedding.weight'])
        d = self.vis['hidden_size']
        heads = self.vis['num_attention_heads']
        hd = d // heads
        eps = self.vis.get('layer_norm_eps', 1e-6)
        for i in range(self.vis['num_hidden_layers']):
            q = f'{p}encoder.layers.{i}.'
            h = F.layer_norm(x, (d,), w[q + 'layer_norm1.weight'], w[q + 'layer_norm1.bias'], eps)
            shape = (*h.shape[:-1], -1, hd)
            qs = linear(h, w, q + 'self_attn.q_proj').view(shape).transpose(1, 2)
            ks = linear(h, w, q + 'self_attn.k_proj').view(shape).transpose(1, 2)
            vs = linear(h, w, q + 'self_attn.v_proj').view(shape).transpose(1, 2)
            att = torch.matmul(qs, ks.transpose(-1, -2)) * hd ** -0.5
            att = F.softmax(att, dim=-1, dtype=torch.float32).to(qs.dtype)
            out = torch.matmul(att, vs).transpose(1, 2).reshape(*h.shape[:-1], -1)
            x = x + linear(out, w, q + 'self_attn.out_proj')
            h = F.layer_norm(x, (d,), w[q + 'layer_norm2.weight'], w[q + 'layer_norm2.bias'], eps)
            x = x + linear(gelu_tanh(linear(h, w, q + 'mlp.fc1')), w, q + 'mlp.fc2')
        x = F.layer_norm(x, (d,), w[p + 'post_layernorm.weight'], w[p + 'post_layernorm.bias'], eps)
        # SmolVLMConnector.pixel_shuffle
        s = self.vlm['scale_factor']
        bsz, seq, dim = x.shape
        side = int(seq ** 0.5)
        x = x.view(bsz, side, side, dim).view(bsz, side, int(side / s), dim * s).permute(0, 2, 1, 3)
        x = x.reshape(bsz, int(side / s), int(side / s), dim * s * s).permute(0, 2, 1, 3)
        x = x.reshape(bsz, int(seq / (s * s)), dim * s * s)
        return F.linear(x, w[VLM + 'connector.modality_projection.proj.weight'])

    def embed_prefix(self, images, img_masks, lang_tokens, lang_masks, state):
        """VLAFlowMatching.embed_prefix: [images][language][one state token]; att 0 ... 0 1."""
        embs, pad_masks, att_masks = [], [], []
        for img, img_mask in zip(images, img_masks):
            img_emb = self.embed_image(img)
            img_emb = img_emb * torch.tensor(img_emb.shape[-1] ** 0.5, dtype=img_emb.dtype)
            bsize, n = img_emb.shape[:2]
            embs.append(img_emb)
            pad_masks.append(img_mask[:, None].expand(bsize, n))
            att_masks += [0] * n
        lang_emb = F.embedding(lang_tokens, self.w[VLM + 'text_model.embed_tokens.weight'])
        lang_emb = lang_emb * math.sqrt(lang_emb.shape[-1])
        embs.append(lang_emb)
        pad_masks.append(lang_masks)
        att_masks += [0] * lang_emb.shape[1]
        state_emb = linear(state, self.w, 'model.state_proj')[:, None, :]
        embs.append(state_emb)
        pad_masks.append(torch.ones(state_emb.shape[0], 1, dtype=torch.bool))
        att_masks += [1]
        embs = torch.cat(embs, dim=1)
        pad_masks = torch.cat(pad_masks, dim=1)
        att_masks = torch.tensor(att_masks, dtype=torch.bool)[None, :]
        prefix_length = self.raw.get('prefix_length', -1)
        if pad_masks.shape[1] < prefix_length:
            extra = prefix_length - pad_masks.shape[1]
            embs = F.pad(embs, (0, 0, 0, extra))
            pad_masks = F.pad(pad_masks, (0, extra))
            att_masks = F.pad(att_masks, (0, extra))
        return embs, pad_masks, att_masks.expand(embs.shape[0], -1)

    def embed_suffix(self, noisy_actions: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        action_emb = linear(noisy_actions, self.w, 'model.action_in_proj')
        time_emb = sinusoidal_time(timestep, self.expert_hidden, self.raw['min_period'], self.raw['max_period'])
        time_emb = time_emb.type(dtype=action_emb.dtype)[:, None, :].expand_as(action_emb)
        x = linear(torch.cat([action_emb, time_emb], dim=2), self.w, 'model.action_time_mlp_in')
        return linear(F.silu(x), self.w, 'model.action_time_mlp_out')

    def attention(self, mask, q, k, v):
        """SmolVLMWithExpertModel.eager_attention_forward: GQA, fp32 scores, finfo.min masking."""
        bsz, seq = k.shape[:2]
        groups = self.heads // self.kv_heads
        hd = self.head_dim
        k = k[:, :, :, None, :].expand(bsz, seq, self.kv_heads, groups, hd).reshape(bsz, seq, self.heads, hd)
        v = v[:, :, :, None, :].expand(bsz, seq, self.kv_heads, groups, hd).reshape(bsz, seq, self.heads, hd)
        q = q.to(torch.float32).transpose(1, 2)
        k = k.to(torch.float32).transpose(1, 2)
        att = torch.matmul(q, k.transpose(2, 3))
        att *= hd ** -0.5
        att = torch.where(mask[:, None, :, :], att, torch.finfo(torch.float32).min)
        probs = F.softmax(att, dim=-1).to(dtype=v.dtype)
        out = torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        return out.reshape(bsz, -1, self.heads * hd)

    def expert_layer_index(self, i: int) -> Optional[int]:
        """get_model_layers: the expert layer paired with VLM layer i (None: the expert skips it)."""
        multiple_of = self.num_vlm_layers // self.num_expert_layers
        if multiple_of > 0 and i > 0 and i % multiple_of != 0:
            return None
        return i // multiple_of if multiple_of > 0 else i

    def is_self_attn_layer(self, i: int) -> bool:
        return 'cross' not in self.attention_mode or (self.every > 0 and i % self.every == 0)

    def _qkv(self, prefix: str, x: torch.Tensor):
        w = self.w
        h = rms_norm(x, w[prefix + 'input_layernorm.weight'], self.rms_eps)
        shape = (*h.shape[:-1], -1, self.head_dim)
        h = h.to(w[prefix + 'self_attn.q_proj.weight'].dtype)
        return tuple(linear(h, w, f'{prefix}self_attn.{name}_proj').view(shape) for name in 'qkv')

    def _finish(self, prefix: str, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """o_proj, residual, post-attention norm, SiLU-gated MLP, residual (SmolVLMWithExpertModel.forward)."""
        w = self.w
        att = att.to(w[prefix + 'self_attn.o_proj.weight'].dtype)
        out = linear(att, w, prefix + 'self_attn.o_proj')
        out += x
        after_first_residual = out.clone()
        out = rms_norm(out, w[prefix + 'post_attention_layernorm.weight'], self.rms_eps)
        out = linear(F.silu(linear(out, w, prefix + 'mlp.gate_proj')) * linear(out, w, prefix + 'mlp.up_proj'), w,
                     prefix + 'mlp.down_proj')
        out += after_first_residual
        return out

    def prefill(self, embs, pad_masks, att_masks) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """The prefix pass: every VLM layer self-attends; returns each layer's post-RoPE K and V [B, P, kv, hd]."""
        mask = make_att_2d_masks(pad_masks, att_masks)
        positions = torch.cumsum(pad_masks, dim=1) - 1
        cache = []
        x = embs
        for i in range(self.num_vlm_layers):
            prefix = f'{VLM}text_model.layers.{i}.'
            q, k, v = self._qkv(prefix, x)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
            cache.append((k, v))
            x = self._finish(prefix, x, self.attention(mask, q, k, v))
        return cache

    def denoise_step(self, cache, prefix_pad_masks, x_t, timestep) -> torch.Tensor:
        x = self.embed_suffix(x_t, timestep)
        bsz, suffix_len = x.shape[:2]
        prefix_len = prefix_pad_masks.shape[1]
        suffix_pad = torch.ones(bsz, suffix_len, dtype=torch.bool)
        suffix_att = torch.ones(bsz, suffix_len, dtype=x.dtype)
        full_mask = torch.cat([prefix_pad_masks[:, None, :].expand(bsz, suffix_len, prefix_len),
                               make_att_2d_masks(suffix_pad, suffix_att)], dim=2)
        positions = torch.sum(prefix_pad_masks, dim=-1)[:, None] + torch.cumsum(suffix_pad, dim=1) - 1
        for i in range(self.num_vlm_layers):
            e = self.expert_layer_index(i)
            if self.is_self_attn_layer(i):
                if e is None:
                    raise NotImplementedError('lerobot fails here too (no expert layer in a self-attention layer)')
                prefix = f'{EXPERT}layers.{e}.'
                q, k, v = self._qkv(prefix, x)
                q, k = apply_rope(q, positions), apply_rope(k, positions)
                keys = torch.cat([cache[i][0], k], dim=1)          # DynamicCache.update, cropped after the step
                values = torch.cat([cache[i][1], v], dim=1)
                att = self.attention(full_mask, q, keys, values)
            else:
                if e is None:
                    continue                                       # the expert's hidden state passes unchanged
                prefix = f'{EXPERT}layers.{e}.'
                w = self.w
                h = rms_norm(x, w[prefix + 'input_layernorm.weight'], self.rms_eps)
                h = h.to(w[prefix + 'self_attn.q_proj.weight'].dtype)
                q = linear(h, w, prefix + 'self_attn.q_proj').view(*h.shape[:-1], -1, self.head_dim)
                k_in, v_in = cache[i]
                k_in = k_in.to(w[prefix + 'self_attn.k_proj.weight'].dtype).reshape(*k_in.shape[:2], -1)
                v_in = v_in.to(w[prefix + 'self_attn.v_proj.weight'].dtype).reshape(*v_in.shape[:2], -1)
                k = linear(k_in, w, prefix + 'self_attn.k_proj').view(*k_in.shape[:-1], -1, self.head_dim)
                v = linear(v_in, w, prefix + 'self_attn.v_proj').view(*v_in.shape[:-1], -1, self.head_dim)
                expert_positions = positions - torch.min(positions, dim=1, keepdim=True).values   # 0..H-1
                q = apply_rope(q, expert_positions)
                att = self.attention(full_mask[:, -suffix_len:, :k.shape[1]], q, k, v)
            x = self._finish(prefix, x, att)
        out = rms_norm(x, self.w[EXPERT + 'norm.weight'], self.rms_eps)
        out = out[:, -self.raw['chunk_size']:].to(dtype=torch.float32)
        return linear(out, self.w, 'model.action_out_proj')

    def sample_actions(self, images, img_masks, lang_tokens, lang_masks, state, noise,
                       rtc: Optional[Mapping] = None, prev_chunk_left_over: Optional[torch.Tensor] = None,
                       inference_delay: int = 0, execution_horizon: Optional[int] = None) -> torch.Tensor:
        """sample_actions + euler_integrate; ``rtc`` (an RTCConfig as a dict: prefix_attention_schedule,
        max_guidance_weight, execution_horizon) turns on RTCProcessor.denoise_step guidance."""
        embs, pad_masks, att_masks = self.embed_prefix(images, img_masks, lang_tokens, lang_masks, state)
        cache = self.prefill(embs, pad_masks, att_masks)
        num_steps = self.raw['num_steps']
        dt = -1.0 / num_steps
        x_t = noise
        for step in range(num_steps):
            time = 1.0 + step * dt
            time_tensor = torch.tensor(time, dtype=torch.float32).expand(x_t.shape[0])

            def denoise(input_x_t, current_timestep=time_tensor):
                return self.denoise_step(cache, pad_masks, input_x_t, current_timestep)

            if rtc is not None:
                v_t = rtc_denoise_step(rtc, x_t, prev_chunk_left_over, inference_delay, time, denoise,
                                       execution_horizon)
            else:
                v_t = denoise(x_t)
            x_t = x_t + dt * v_t
        return x_t

    # ---- the whole pipeline -----------------------------------------------------------------------------------
    @torch.no_grad()
    def actions(self, frames: Mapping[str, np.ndarray], state: np.ndarray, task: str, noise: np.ndarray,
                rtc: Optional[Mapping] = None, prev_chunk_left_over: Optional[np.ndarray] = None,
                inference_delay: int = 0, execution_horizon: Optional[int] = None) -> np.ndarray:
        """[chunk_size, action_dim] float32 actions, as lerobot's pipeline returns them (predict_action_chunk
        with the RTC kwargs when ``rtc`` is given; the leftover is normalised, [T, A] as lerobot takes it)."""
        raw_state = torch.from_numpy(np.asarray(state, dtype=np.float32))[None]
        normalized = self.normalize_state(raw_state)
        tokens, token_masks = self.tokens(task)
        images, image_masks = self.images(frames)
        padded_state = F.pad(normalized, (0, self.raw['max_state_dim'] - normalized.shape[1]))
        noise_t = torch.from_numpy(np.asarray(noise, dtype=np.float32)).reshape(1, *noise.shape[-2:])
        leftover = None if prev_chunk_left_over is None else torch.as_tensor(
            np.asarray(prev_chunk_left_over, dtype=np.float32))
        out = self.sample_actions(images, image_masks, tokens, token_masks, padded_state, noise_t, rtc=rtc,
                                  prev_chunk_left_over=leftover, inference_delay=inference_delay,
                                  execution_horizon=execution_horizon)
        return self.unnormalize_actions(out[:, :, :self.action_dim])[0].numpy()
