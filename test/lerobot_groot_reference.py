"""lerobot's GR00T N1.7 inference pipeline written again, in plain torch, apart from the package (tests only).

    raw frames (uint8 HWC), raw state, task
      -> prepare_observation_for_inference   /255, HWC -> CHW, batch of one
      -> GrootN17PackInputsStep              cameras in video_modality_keys order, float -> uint8 (truncation),
                                             task formalised, state min/max normalised (0 where max == min), clipped,
                                             zero-padded, embodiment id from the mapping
      -> GrootN17VLMEncodeStep               per frame: square resize, centre crop, resize (torchvision bicubic +
                                             antialias on uint8); chat template; Qwen3VLProcessor: smart_resize, fused
                                             rescale / normalise, temporal repeat, merge-block patches, image tokens
                                             expanded in the text before tokenising
      -> GrootPolicy.predict_action_chunk    Qwen3Backbone (ViT, text model cut at select_layer, mRoPE from
                                             get_rope_index, DeepStack, the last layer's output taken by a hook before
                                             its DeepStack addition), GR00TN17ActionHead.get_action (vlln,
                                             vl_self_attention unmasked, state encoder, Euler steps t = i / N with every
                                             cross block's K/V computed over all tokens under the boolean masks),
                                             native RTC (inpainting, velocity ramp), cut to the horizon and action_dim
      -> post-processor                      clip, inverse min/max, LIBERO gripper sign

Sources, huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b: ``src/lerobot/policies/groot/``
(``processor_groot.py``, ``modeling_groot.py``, ``groot_n1_7.py``, ``utils.py``,
``action_head/cross_attention_dit.py``);
transformers 5.5.4 ``models/qwen3_vl/modeling_qwen3_vl.py``, ``models/qwen3_vl/processing_qwen3_vl.py``,
``models/qwen2_vl/image_processing_qwen2_vl.py``, ``image_processing_backends.py``, ``utils/chat_template_utils.py``;
diffusers 0.39 ``models/attention_processor.py`` (AttnProcessor2_0), ``models/embeddings.py``
(get_timestep_embedding); torchvision 0.26 ``transforms/v2/functional/_geometry.py`` (resize_image).

Nothing here imports the package: config.json, the base and backbone configs, model.safetensors (lerobot's keys), the
processor files and the processor folder (tokenizer.json through ``tokenizers``, the chat template through jinja2)
are read directly, and every layer is a function over the weight dict. ``bf16=True`` runs the model under
``torch.autocast(bfloat16)`` (lerobot's use_bf16 inference) over the fp32 weights. Checked against real lerobot by
bench/compare_lerobot_groot.py (the stored fixtures in test/fixtures/).
"""
from __future__ import annotations

import itertools
import json
import math
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file

V = 'backbone.model.model.visual.'
T = 'backbone.model.model.language_model.'
H = 'action_head.'


def _json(path: Path) -> Dict:
    return json.loads(Path(path).read_text())


class LerobotGrootReference:
    def __init__(self, policy: Path, processor: Optional[Path] = None) -> None:
        policy = Path(policy)
        self.config = _json(policy / 'config.json')
        self.base = _json(Path(self.config['base_model_path']) / 'config.json')
        self.qwen = _json(Path(self.base['model_name']) / 'config.json')
        pre = _json(policy / 'policy_preprocessor.json')['steps']
        post = _json(policy / 'policy_postprocessor.json')['steps']
        self.pack = pre[2]['config']
        self.encode = pre[3]['config']
        self.state_stats = load_numpy(str(policy / pre[2]['state_file']))
        self.decode_step = post[0]
        if 'state_file' in post[0]:
            self.decode_stats = load_numpy(str(policy / post[0]['state_file']))
        self.processor = Path(processor or self.encode['model_name'])
        self.image_processor = _json(self.processor / 'preprocessor_config.json')
        weights = load_file(str(policy / 'model.safetensors'))
        self.w = {k[len('_groot_model.'):]: v.float() for k, v in weights.items()}
        self.w[T + 'embed_tokens.weight'] = self.w['backbone.model.lm_head.weight']       # tied
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_file(str(self.processor / 'tokenizer.json'))
        self.tokenizer_config = _json(self.processor / 'tokenizer_config.json')

    # ---- pre-processor -------------------------------------------------------------------------------------------
    def cameras(self) -> List[str]:
        available = [k[len('observation.images.'):] for k in self.config['input_features']
                     if k.startswith('observation.images.')]
        keys = self.pack.get('video_modality_keys')
        if not keys:
            return sorted(available)
        ordered = []
        for key in keys:
            for candidate in [key] + (['image2'] if key == 'wrist_image' else []):
                if candidate in available:
                    ordered.append(candidate)
                    break
        return ordered or sorted(available)

    @staticmethod
    def tv_resize(image: torch.Tensor, size) -> torch.Tensor:
        """torchvision v2 resize_image on a uint8 CHW tensor, bicubic + antialias (CPU: native uint8 kernel)."""
        if tuple(image.shape[-2:]) == tuple(size):
            return image
        return F.interpolate(image[None], size=list(size), mode='bicubic', align_corners=False, antialias=True)[0]

    def frame(self, image: torch.Tensor) -> torch.Tensor:
        """_transform_n1_7_image_for_vlm_torch, uint8 CHW."""
        target = self.encode['image_target_size']
        edge = self.encode.get('shortest_image_edge') or target[0]
        image = self.tv_resize(image, (edge, edge))
        fraction = self.encode.get('crop_fraction')
        if fraction is None and self.encode.get('image_crop_size') is not None:
            fraction = self.encode['image_crop_size'][0] / float(target[0])
        if fraction is not None and 0.0 < fraction < 1.0:
            ch = max(1, int(round(image.shape[-2] * fraction)))
            cw = max(1, int(round(image.shape[-1] * fraction)))
            top, left = max(0, (image.shape[-2] - ch) // 2), max(0, (image.shape[-1] - cw) // 2)
            image = image[..., top:top + ch, left:left + cw]
        return self.tv_resize(image, tuple(target))

    def smart_resize(self, height: int, width: int):
        ip = self.image_processor
        factor = ip['patch_size'] * ip['merge_size']
        size = ip.get('size') or {}
        low, high = ip.get('min_pixels', size.get('shortest_edge')), ip.get('max_pixels', size.get('longest_edge'))
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > high:
            beta = math.sqrt((height * width) / high)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < low:
            beta = math.sqrt(low / (height * width))
            h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def image_processor_call(self, images: List[torch.Tensor]):
        """Qwen2VLImageProcessor._preprocess, one image at a time -> pixel_values, grid_thw."""
        ip = self.image_processor
        patch, merge, temporal = ip['patch_size'], ip['merge_size'], ip['temporal_patch_size']
        mean = torch.tensor(ip['image_mean']) * (1.0 / ip.get('rescale_factor', 1 / 255))
        std = torch.tensor(ip['image_std']) * (1.0 / ip.get('rescale_factor', 1 / 255))
        values, grids = [], []
        for image in images:
            image = self.tv_resize(image, self.smart_resize(*image.shape[-2:]))
            pixels = (image.to(torch.float32) - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
            frames = pixels[None, None].repeat(1, temporal, 1, 1, 1)          # (1, T, C, H, W)
            channels, height, width = pixels.shape
            gh, gw = height // patch, width // patch
            blocks = frames.view(1, 1, temporal, channels, gh // merge, merge, patch, gw // merge, merge, patch)
            blocks = blocks.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
            values.append(blocks.reshape(gh * gw, channels * temporal * patch * patch))
            grids.append([1, gh, gw])
        return torch.cat(values), torch.tensor(grids)

    def prompt(self, task: str, images: int, grid) -> List[int]:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        if self.pack.get('formalize_language', True):
            task = ''.join(ch for ch in task.lower() if ch.isalnum() or ch.isspace() or ch == '_')
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters['tojson'] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
        content = [{'type': 'image', 'image': None} for _ in range(images)] + [{'type': 'text', 'text': task}]
        specials = {k: self.tokenizer_config[k] for k in ('bos_token', 'eos_token', 'pad_token', 'unk_token')
                    if isinstance(self.tokenizer_config.get(k), str)}
        text = env.from_string(self.tokenizer_config['chat_template']).render(
            messages=[{'role': 'user', 'content': content}], tools=None, documents=None, add_generation_prompt=False,
            **specials)
        merge = self.image_processor['merge_size']
        for g in grid:                                            # Qwen3VLProcessor: expand in the text, then tokenise
            count = int(g[0] * g[1] * g[2]) // merge ** 2
            text = text.replace('<|image_pad|>', '<|placeholder|>' * count, 1)
        text = text.replace('<|placeholder|>', '<|image_pad|>')
        return self.tokenizer.encode(text).ids

    def normalized_state(self, state: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(state, dtype=torch.float32)[None]
        d = x.shape[-1]

        def align(name, default):
            t = torch.as_tensor(self.state_stats[f'observation.state.{name}']).flatten().float()
            return t[:d] if t.numel() >= d else torch.cat([t, torch.full((d - t.numel(),), default)])
        if self.pack.get('normalize_min_max', True):
            low, high = align('min', 0.0), align('max', 1.0)
            denom = high - low
            mask = denom != 0
            mapped = 2 * (x - low) / torch.where(mask, denom, torch.ones_like(denom)) - 1
            x = torch.where(mask, mapped, torch.zeros_like(mapped))
            if self.pack.get('clip_outliers', True):
                x = x.clamp(-1.0, 1.0)
        return torch.cat([x, torch.zeros(1, self.pack['max_state_dim'] - d)], dim=1)[:, None]

    def preprocess(self, frames: Mapping[str, np.ndarray], state: np.ndarray, task: str) -> Dict[str, torch.Tensor]:
        images = []
        for name in self.cameras():
            unit = torch.from_numpy(np.asarray(frames[name])).type(torch.float32) / 255       # HWC
            uint8 = (unit.permute(2, 0, 1).clamp(0, 1) * 255.0).to(torch.uint8)
            images.append(self.frame(uint8))
        pixel_values, grid = self.image_processor_call(images)
        ids = self.prompt(task or 'Perform the task.', len(images), grid.tolist())
        tag = self.pack['embodiment_tag']
        return {'pixel_values': pixel_values, 'image_grid_thw': grid, 'input_ids': torch.tensor([ids]),
                'state': self.normalized_state(state), 'embodiment_id': self.pack['embodiment_mapping'].get(tag, 0)}

    # ---- the backbone ---------------------------------------------------------------------------------------------
    def linear(self, x, name, bias=True):
        return F.linear(x, self.w[name + '.weight'], self.w.get(name + '.bias') if bias else None)

    def layer_norm(self, x, name, eps):
        return F.layer_norm(x, (x.shape[-1],), self.w[name + '.weight'], self.w[name + '.bias'], eps)

    def rms(self, x, name):
        eps = self.qwen['text_config'].get('rms_norm_eps', 1e-6)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return self.w[name] * h.to(x.dtype)

    @staticmethod
    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)

    def vision(self, pixel_values, grid):
        vc = self.qwen['vision_config']
        heads, merge = vc['num_heads'], vc['spatial_merge_size']
        weight = self.w[V + 'patch_embed.proj.weight']
        x = F.conv3d(pixel_values.view(-1, vc.get('in_channels', 3), vc['temporal_patch_size'], vc['patch_size'],
                                       vc['patch_size']).to(weight.dtype), weight, self.w[V + 'patch_embed.proj.bias'],
                     stride=weight.shape[2:]).view(-1, vc['hidden_size'])
        side = int(vc['num_position_embeddings'] ** 0.5)
        table = self.w[V + 'pos_embed.weight']
        pos, rot = [], []
        head_dim = vc['hidden_size'] // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2)))
        for t, h, w in grid.tolist():
            hi, wi = torch.linspace(0, side - 1, h), torch.linspace(0, side - 1, w)
            hf, wf = hi.int(), wi.int()
            hc, wc = (hf + 1).clip(max=side - 1), (wf + 1).clip(max=side - 1)
            dh, dw = hi - hf, wi - wf
            idx = [(hf[None].T * side + wf[None]).flatten(), (hf[None].T * side + wc[None]).flatten(),
                   (hc[None].T * side + wf[None]).flatten(), (hc[None].T * side + wc[None]).flatten()]
            wts = [((1 - dh)[None].T * (1 - dw)[None]).flatten(), ((1 - dh)[None].T * dw[None]).flatten(),
                   (dh[None].T * (1 - dw)[None]).flatten(), (dh[None].T * dw[None]).flatten()]
            e = [table[i] * torch.tensor(v.tolist())[:, None] for i, v in zip(idx, wts)]
            p = (e[0] + e[1] + e[2] + e[3]).repeat(t, 1)
            pos.append(p.view(t, h // merge, merge, w // merge, merge, -1).permute(0, 1, 3, 2, 4, 5).flatten(0, 4))
            rows = (torch.arange(h // merge)[:, None, None, None] * merge + torch.arange(merge)[None, None, :, None])
            cols = (torch.arange(w // merge)[None, :, None, None] * merge + torch.arange(merge)[None, None, None, :])
            shape = (h // merge, w // merge, merge, merge)
            coords = torch.stack([rows.expand(shape).reshape(-1), cols.expand(shape).reshape(-1)], -1).repeat(t, 1)
            freq = torch.outer(torch.arange(max(h, w), dtype=torch.float), inv)
            rot.append(freq[coords].flatten(1))
        x = x + torch.cat(pos)
        rot = torch.cat(rot)
        emb = torch.cat((rot, rot), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        lengths = (grid[:, 1] * grid[:, 2] * grid[:, 0]).tolist()
        taps = []
        for i in range(vc['depth']):
            b = f'{V}blocks.{i}.'
            hn = self.layer_norm(x, b + 'norm1', 1e-6)
            q, k, v = self.linear(hn, b + 'attn.qkv').reshape(x.shape[0], 3, heads, -1).permute(1, 0, 2, 3).unbind(0)
            qd, kd = q.dtype, k.dtype
            q = (q.float() * cos + self.rotate_half(q.float()) * sin).to(qd)
            k = (k.float() * cos + self.rotate_half(k.float()) * sin).to(kd)
            outs = []
            for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
                o = F.scaled_dot_product_attention(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                                                   vs.transpose(0, 1)[None], scale=head_dim ** -0.5)
                outs.append(o[0].transpose(0, 1))
            x = x + self.linear(torch.cat(outs).reshape(x.shape[0], -1), b + 'attn.proj')
            hn = self.layer_norm(x, b + 'norm2', 1e-6)
            x = x + self.linear(F.gelu(self.linear(hn, b + 'mlp.linear_fc1'), approximate='tanh'), b + 'mlp.linear_fc2')
            if i in vc['deepstack_visual_indexes']:
                j = vc['deepstack_visual_indexes'].index(i)
                taps.append(self.merger(x, f'{V}deepstack_merger_list.{j}.', post=True))
        return self.merger(x, V + 'merger.', post=False), taps

    def merger(self, x, prefix, post):
        merged = x.shape[-1] * self.qwen['vision_config']['spatial_merge_size'] ** 2
        x = self.layer_norm(x.view(-1, merged), prefix + 'norm', 1e-6) if post else \
            self.layer_norm(x, prefix + 'norm', 1e-6).view(-1, merged)
        return self.linear(F.gelu(self.linear(x, prefix + 'linear_fc1')), prefix + 'linear_fc2')

    def rope_index(self, ids, grid):
        """get_rope_index for one unpadded prompt -> (3, 1, S)."""
        merge = self.qwen['vision_config']['spatial_merge_size']
        types = (ids == self.qwen['image_token_id']).long().tolist()
        grids, pieces, current = iter(grid.tolist()), [], 0
        for key, group in itertools.groupby(enumerate(types), lambda x: x[1]):
            group = list(group)
            length = group[-1][0] + 1 - group[0][0]
            if key == 0:
                pieces.append(torch.arange(length).view(1, -1).expand(3, -1) + current)
                current += length
            else:
                t, h, w = next(grids)
                gh, gw = h // merge, w // merge
                wpos = torch.arange(current, current + gw).repeat(gh * t)
                hpos = torch.arange(current, current + gh).repeat_interleave(gw * t)
                tpos = torch.full((gh * gw * t,), current, dtype=torch.long)
                pieces.append(torch.stack([tpos, hpos, wpos]))
                current += max(h, w) // merge
        return torch.cat(pieces, dim=1)[:, None]

    def text_model(self, embeds, positions, image_mask, deepstack):
        tc = self.qwen['text_config']
        heads, kv_heads, head_dim = tc['num_attention_heads'], tc['num_key_value_heads'], tc['head_dim']
        rope = tc.get('rope_parameters') or tc.get('rope_scaling') or {}
        theta = tc.get('rope_theta', rope.get('rope_theta'))
        section = rope['mrope_section']
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim))
        freqs = (inv[None, None, :, None].expand(3, 1, -1, 1) @ positions[:, :, None, :].float()).transpose(2, 3)
        out = freqs[0].clone()
        for dim, offset in ((1, 1), (2, 2)):
            out[..., offset:section[dim] * 3:3] = freqs[dim][..., offset:section[dim] * 3:3]
        emb = torch.cat((out, out), dim=-1)
        cos, sin = emb.cos().to(embeds.dtype)[:, None], emb.sin().to(embeds.dtype)[:, None]
        seq = embeds.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        x = embeds
        layers = self.base['select_layer']
        captured = None
        for i in range(layers):
            p = f'{T}layers.{i}.'
            h = self.rms(x, p + 'input_layernorm.weight')
            q = self.rms(self.linear(h, p + 'self_attn.q_proj', False).view(1, seq, heads, head_dim),
                         p + 'self_attn.q_norm.weight').transpose(1, 2)
            k = self.rms(self.linear(h, p + 'self_attn.k_proj', False).view(1, seq, kv_heads, head_dim),
                         p + 'self_attn.k_norm.weight').transpose(1, 2)
            v = self.linear(h, p + 'self_attn.v_proj', False).view(1, seq, kv_heads, head_dim).transpose(1, 2)
            q, k = q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin
            k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=head_dim ** -0.5)
            x = x + self.linear(o.transpose(1, 2).reshape(1, seq, -1), p + 'self_attn.o_proj', False)
            h = self.rms(x, p + 'post_attention_layernorm.weight')
            gate = self.linear(h, p + 'mlp.gate_proj', False)
            x = x + self.linear(F.silu(gate) * self.linear(h, p + 'mlp.up_proj', False), p + 'mlp.down_proj', False)
            captured = x                                    # the forward hook on the last layer sees this
            if i < len(deepstack):
                x = x.clone()
                x[image_mask] = x[image_mask] + deepstack[i].to(x.dtype)
        return captured

    def backbone(self, inputs):
        ids = inputs['input_ids']
        merged, taps = self.vision(inputs['pixel_values'], inputs['image_grid_thw'])
        embeds = F.embedding(ids, self.w[T + 'embed_tokens.weight'])
        image_mask = ids == self.qwen['image_token_id']
        embeds = embeds.masked_scatter(image_mask[..., None].expand_as(embeds), merged.to(embeds.dtype))
        positions = self.rope_index(ids[0], inputs['image_grid_thw'])
        return self.text_model(embeds, positions, image_mask, taps), image_mask

    # ---- the action head ------------------------------------------------------------------------------------------
    def attention(self, x, prefix, heads, context=None, mask=None):
        q = self.linear(x, prefix + 'to_q')
        source = x if context is None else context
        k, v = self.linear(source, prefix + 'to_k'), self.linear(source, prefix + 'to_v')
        b = x.shape[0]
        q, k, v = (t.view(b, -1, heads, t.shape[-1] // heads).transpose(1, 2) for t in (q, k, v))
        if mask is not None:                     # diffusers prepare_attention_mask: repeat per head, (B, H, 1, S)
            mask = mask.repeat_interleave(heads, dim=0).view(b, heads, -1, mask.shape[-1])
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        o = o.transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[-1]).to(q.dtype)
        return self.linear(o, prefix + 'to_out.0') / 1.0

    def ff(self, x, prefix):
        return self.linear(F.gelu(self.linear(x, prefix + 'ff.net.0.proj'), approximate='tanh'), prefix + 'ff.net.2')

    def category(self, x, name, cat):
        return torch.bmm(x, self.w[name + '.W'][cat]) + self.w[name + '.b'][cat].unsqueeze(1)

    def dit(self, x, vl, t_disc, image_mask, attention_mask):
        cfg = self.base['diffusion_model_cfg']
        heads = cfg['num_attention_heads']
        width = heads * cfg['attention_head_dim']
        m = H + 'model.'
        half = 128
        exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32) / (half - 1)
        angles = t_disc[:, None].float() * torch.exp(exponent)[None]
        proj = torch.cat([torch.sin(angles), torch.cos(angles)], -1)
        proj = torch.cat([proj[:, half:], proj[:, :half]], -1).to(torch.float32)
        temb = self.linear(F.silu(self.linear(proj, m + 'timestep_encoder.timestep_embedder.linear_1')),
                           m + 'timestep_encoder.timestep_embedder.linear_2')
        image_attn, text_attn = image_mask & attention_mask, (~image_mask) & attention_mask
        every = self.base.get('attend_text_every_n_blocks', 2)
        for i in range(cfg['num_layers']):
            p = f'{m}transformer_blocks.{i}.'
            scale, shift = self.linear(F.silu(temb), p + 'norm1.linear').chunk(2, dim=1)
            h = F.layer_norm(x, (width,), eps=1e-5) * (1 + scale[:, None]) + shift[:, None]
            if i % 2 == 1:
                a = self.attention(h, p + 'attn1.', heads)
            else:
                mask = text_attn if i % (2 * every) == 0 else image_attn
                a = self.attention(h, p + 'attn1.', heads, vl, mask)
            x = a + x
            x = self.ff(F.layer_norm(x, (width,), eps=1e-5), p) + x
        shift, scale = self.linear(F.silu(temb), m + 'proj_out_1').chunk(2, dim=1)
        x = F.layer_norm(x, (width,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return self.linear(x, m + 'proj_out_2')

    def action_head(self, features, image_mask, state, cat, noise, steps, rtc=None):
        vl = self.layer_norm(features, H + 'vlln', 1e-5) if self.base.get('use_vlln', True) else features
        vcfg = self.base['vl_self_attention_cfg']
        for i in range(vcfg['num_layers']):
            p = f'{H}vl_self_attention.transformer_blocks.{i}.'
            vl = self.attention(self.layer_norm(vl, p + 'norm1', 1e-5), p + 'attn1.', vcfg['num_attention_heads']) + vl
            vl = self.ff(self.layer_norm(vl, p + 'norm3', 1e-5), p) + vl
        processed = vl
        state_features = self.category(F.relu(self.category(state, H + 'state_encoder.layer1', cat)),
                                       H + 'state_encoder.layer2', cat)
        actions = noise.clone().to(vl.dtype)
        horizon = actions.shape[1]
        velocity_scale = torch.ones_like(actions)
        if rtc is not None:
            prev, overlap, frozen, ramp_rate = rtc
            length = prev.shape[1]
            actions[:, :overlap] = prev[:, length - overlap:length]
            velocity_scale[:, :frozen] = 0.0
            ts = torch.linspace(0.0, 1.0, overlap - frozen + 2)
            ramp = 1 - torch.exp(-ramp_rate * ts)
            ramp = ramp / ramp[-1].clamp_min(1e-8)
            velocity_scale[:, frozen:overlap] = ramp[1:-1][None, :, None]
        dt = 1.0 / steps
        emb_dim = self.base['input_embedding_dim']
        attention_mask = torch.ones_like(image_mask)
        for step in range(steps):
            t_disc = int(step / float(steps) * self.base.get('num_timestep_buckets', 1000))
            ts = torch.full((1,), t_disc)
            a = self.category(actions, H + 'action_encoder.W1', cat)
            half = emb_dim // 2
            exponent = -torch.arange(half, dtype=torch.float) * (torch.log(torch.tensor(10000.0)) / half)
            freqs = ts.unsqueeze(1).expand(-1, horizon).float().unsqueeze(-1) * exponent.exp()
            time = torch.cat([torch.sin(freqs), torch.cos(freqs)], -1).to(a.dtype)
            hdn = self.category(torch.cat([a, time], -1), H + 'action_encoder.W2', cat)
            a = self.category(hdn * torch.sigmoid(hdn), H + 'action_encoder.W3', cat)
            if self.base.get('add_pos_embed', True):
                a = a + self.w[H + 'position_embedding.weight'][torch.arange(horizon)].unsqueeze(0)
            out = self.dit(torch.cat([state_features, a], 1), vl, ts, image_mask, attention_mask)
            pred = self.category(F.relu(self.category(out, H + 'action_decoder.layer1', cat)),
                                 H + 'action_decoder.layer2', cat)
            actions = actions + dt * pred[:, -horizon:] * velocity_scale
        return actions, processed, state_features

    # ---- the whole call ---------------------------------------------------------------------------------------
    def rtc_options(self, leftover: np.ndarray, delay: int, execution_horizon: int):
        prev = torch.from_numpy(np.asarray(leftover, np.float32))[None]
        rows = prev.abs().sum(dim=(0, 2)) > 0
        if not rows.any():
            return None
        prev = prev[:, :int(rows.nonzero()[-1].item()) + 1]
        horizon, width = self.base['action_horizon'], self.base['max_action_dim']
        prev = prev[:, -horizon:]
        prev = prev[:, :, :width] if prev.shape[2] >= width else torch.cat(
            [prev, torch.zeros(1, prev.shape[1], width - prev.shape[2])], 2)
        overlap = max(0, min(prev.shape[1], execution_horizon))
        if overlap == 0:
            return None
        ramp = self.config.get('rtc_ramp_rate') or self.base.get('rtc_ramp_rate', 6.0)
        return prev, overlap, max(0, min(int(delay), overlap)), float(ramp)

    def horizon(self) -> int:
        return max(1, min(self.base['action_horizon'], self.config['chunk_size'], self.config['n_action_steps']))

    def decode(self, actions: torch.Tensor) -> np.ndarray:
        step = self.decode_step
        cfg = step['config']
        transform = self.config.get('action_decode_transform')
        if step['registry_name'] == 'groot_action_unpack_unnormalize_v2':
            a = actions[..., :cfg['env_action_dim']] if cfg['env_action_dim'] else actions
            d = a.shape[-1]
            a = a.clamp(-1.0, 1.0) if cfg.get('clip_normalized_action') else a
            low = torch.as_tensor(self.decode_stats['action.min'], dtype=a.dtype)
            high = torch.as_tensor(self.decode_stats['action.max'], dtype=a.dtype)
            low, high = F.pad(low[:d], (0, max(0, d - low.numel()))), F.pad(high[:d], (0, max(0, d - high.numel())))
            denom = high - low
            mask = denom != 0
            a = torch.where(mask, (a + 1.0) * 0.5 * torch.where(mask, denom, torch.ones_like(denom)) + low, low)
            if transform == 'libero' and a.shape[-1] >= 7:
                a = a.clone()
                a[..., -1] = -torch.sign(2.0 * a[..., -1] - 1.0)
            return a.numpy()
        a = actions.numpy()
        modality = cfg['modality_config']['action']
        a = a[:, :max(1, min(a.shape[1], len(modality['delta_indices'])))]
        groups, start = {}, 0
        for key in modality['modality_keys']:
            stats = cfg['raw_stats']['action'][key]
            low = np.asarray(stats['q01' if cfg['use_percentiles'] else 'min'], np.float32)
            high = np.asarray(stats['q99' if cfg['use_percentiles'] else 'max'], np.float32)
            part = a[..., start:start + low.size]
            groups[key] = (np.clip(part, -1.0, 1.0) + 1.0) * 0.5 * (high - low) + low
            start += low.size
        out = np.concatenate([groups[k] for k in modality['modality_keys']], -1)[..., :cfg['env_action_dim']]
        if transform == 'libero':
            g = list(modality['modality_keys']).index('gripper')
            col = sum(groups[k].shape[-1] for k in modality['modality_keys'][:g])
            out = out.copy()
            out[..., col:col + 1] = -np.sign(2.0 * out[..., col:col + 1] - 1.0)
        return out

    @torch.no_grad()
    def __call__(self, frames, state, task, noise, bf16: bool = False, leftover=None, delay: int = 0,
                 execution_horizon: Optional[int] = None, steps: Optional[int] = None) -> Dict[str, np.ndarray]:
        inputs = self.preprocess(frames, state, task)
        cat = torch.full((1,), inputs['embodiment_id'], dtype=torch.long)
        steps = steps or self.config.get('num_inference_timesteps') or self.base['num_inference_timesteps']
        rtc = None
        if leftover is not None:
            rtc = self.rtc_options(leftover, delay, execution_horizon)
        context = torch.autocast('cpu', dtype=torch.bfloat16) if bf16 else nullcontext()
        with context:
            features, image_mask = self.backbone(inputs)
            actions, processed, state_features = self.action_head(
                features, image_mask, inputs['state'], cat, torch.as_tensor(noise, dtype=torch.float32), steps, rtc)
        actions = actions[:, :self.horizon(), :len(self.config['output_features']['action']['shape']) and
                          self.config['output_features']['action']['shape'][0]].float()
        return {'input_ids': inputs['input_ids'].numpy(), 'pixel_values': inputs['pixel_values'].numpy(),
                'state': inputs['state'].numpy(), 'backbone': features.float().numpy(),
                'processed': processed.float().numpy(), 'state_features': state_features.float().numpy(),
                'normalized_actions': actions.numpy(), 'actions': self.decode(actions)}
