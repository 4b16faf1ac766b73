"""lerobot's full inference pipeline for pi0 / pi0.5, written again for tests, apart from the runtime.

    raw frames (uint8 HWC, any size), raw state, task
      -> prepare_observation_for_inference   /255, HWC -> CHW, batch
      -> pre-processor                       (relative: cache the raw state), normalise, prompt, tokenise
      -> predict_action_chunk                resize_with_pad, [-1, 1], present cameras then masked ones,
                                             pad state, sample_actions(noise), slice to action_dim
      -> post-processor                      unnormalise, (relative) + cached raw state

Sources, huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b: ``policies/utils.py``
(``prepare_observation_for_inference``), ``policies/pi0/processor_pi0.py``,
``policies/pi05/processor_pi05.py``, ``processor/normalize_processor.py``,
``processor/relative_action_processor.py``, ``policies/pi0/modeling_pi0.py`` (``_preprocess_images``,
``prepare_state``, ``predict_action_chunk``), ``policies/common/vla_utils.py`` (``resize_with_pad_torch``).

Only the network is shared with the runtime (``PiZeroModel.sample_actions``, whose parity with
transformers' modules test_model_parity.py checks); config.json, the statistics, the tokenizer, images,
prompts, normalisation and the relative add-back are read and computed here in torch, the way lerobot
does, without the package's helpers. The state is float32, as lerobot's robots deliver it.
"""
import json
from pathlib import Path
from typing import Dict, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from vla_policy_node.policy.families import load_checkpoint

CPU = torch.device('cpu')
EPS = 1e-8   # NormalizerProcessorStep / UnnormalizerProcessorStep default eps


class LerobotReference:
    """One checkpoint folder driven as lerobot drives it (fp32, CPU)."""

    def __init__(self, folder: Path, padded_state_prompt: bool = False) -> None:
        import sentencepiece as spm
        self.folder = Path(folder)
        self.raw = json.loads((self.folder / 'config.json').read_text())
        self.type = self.raw['type']
        features = self.raw['input_features']
        # config.image_features: the VISUAL input features in config order (empty cameras are added after).
        self.image_keys = [key for key, feat in features.items() if feat['type'] == 'VISUAL']
        self.image_keys += [f'observation.images.empty_camera_{i}' for i in range(self.raw.get('empty_cameras', 0))]
        self.action_dim = self.raw['output_features']['action']['shape'][0]
        self.norm_map = self.raw['normalization_mapping']
        self.padded_state_prompt = padded_state_prompt   # lerobot between #1910 and #2964
        self.state_stats = self._stats('policy_preprocessor.json', 'normalizer_processor', 'observation.state')
        self.action_stats = self._stats('policy_postprocessor.json', 'unnormalizer_processor', 'action')
        self.sp = spm.SentencePieceProcessor(model_file=str(self.folder / 'tokenizer' / 'tokenizer.model'))
        self.model = load_checkpoint(self.folder, CPU, torch.float32).model

    def _stats(self, json_name: str, step_name: str, feature: str) -> Dict[str, torch.Tensor]:
        steps = json.loads((self.folder / json_name).read_text())['steps']
        step = next(s for s in steps if s['registry_name'] == step_name)
        flat = load_file(str(self.folder / step['state_file']))
        return {key[len(feature) + 1:]: value.float() for key, value in flat.items() if key.startswith(feature + '.')}

    # ---- processor steps ------------------------------------------------------------------------------
    @staticmethod
    def _normalize(x: torch.Tensor, mode: str, stats: Mapping[str, torch.Tensor], inverse: bool) -> torch.Tensor:
        if mode == 'IDENTITY':
            return x
        if mode == 'MEAN_STD':
            mean, std = stats['mean'], stats['std']
            return x * std + mean if inverse else (x - mean) / (std + EPS)
        low, high = {'QUANTILES': ('q01', 'q99'), 'QUANTILE10': ('q10', 'q90'), 'MIN_MAX': ('min', 'max')}[mode]
        denom = stats[high] - stats[low]
        denom = torch.where(denom == 0, torch.tensor(EPS, dtype=x.dtype), denom)
        if mode == 'MIN_MAX':
            return (x + 1) / 2 * denom + stats[low] if inverse else 2 * (x - stats[low]) / denom - 1
        return (x + 1.0) * denom / 2.0 + stats[low] if inverse else 2.0 * (x - stats[low]) / denom - 1.0

    def prompt(self, task: str, normalized_state: torch.Tensor) -> str:
        if self.type == 'pi0':
            return task if task.endswith('\n') else f'{task}\n'           # Pi0NewLineProcessor
        state = normalized_state[0]
        if self.padded_state_prompt:
            state = F.pad(state, (0, self.raw.get('max_state_dim', 32) - state.shape[0]))
        bins = np.digitize(state.numpy(), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        cleaned = task.strip().replace('_', ' ').replace('\n', ' ')
        return f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "

    def tokens(self, prompt: str):
        # The PaliGemma tokenizer adds BOS; right padding with 0 to max_length, truncation.
        length = self.raw['tokenizer_max_length']
        ids = self.sp.encode(prompt, add_bos=True)[:length]
        tokens = torch.zeros(1, length, dtype=torch.long)
        tokens[0, :len(ids)] = torch.tensor(ids)
        masks = torch.zeros(1, length, dtype=torch.bool)
        masks[0, :len(ids)] = True
        return tokens, masks

    def _mask(self, action_dim: int):
        names = self.raw.get('action_feature_names')
        exclude = self.raw.get('relative_exclude_joints', ['gripper'])
        if not exclude or names is None:
            return [True] * action_dim
        tokens = [str(n).lower() for n in exclude if n]
        mask = [not any(t == str(n).lower() or t in str(n).lower() for t in tokens) for n in names[:action_dim]]
        return mask + [True] * (action_dim - len(mask))

    # ---- model side (PI0Policy.predict_action_chunk) -----------------------------------------------------------
    @staticmethod
    def resize_with_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """[B, H, W, C] float in [0, 1] -> [B, height, width, C], centred zero padding (openpi's function)."""
        images = images.permute(0, 3, 1, 2)
        _, _, cur_h, cur_w = images.shape
        ratio = max(cur_w / width, cur_h / height)
        new_h, new_w = int(cur_h / ratio), int(cur_w / ratio)
        resized = F.interpolate(images, size=(new_h, new_w), mode='bilinear', align_corners=False).clamp(0.0, 1.0)
        pad_h0, rem_h = divmod(height - new_h, 2)
        pad_w0, rem_w = divmod(width - new_w, 2)
        padded = F.pad(resized, (pad_w0, pad_w0 + rem_w, pad_h0, pad_h0 + rem_h), mode='constant', value=0.0)
        return padded.permute(0, 2, 3, 1)

    def _images(self, batch: Mapping[str, torch.Tensor]):
        resolution = tuple(self.raw.get('image_resolution', (224, 224)))
        present = [key for key in self.image_keys if key in batch]
        images, masks = [], []
        for key in present:
            img = batch[key].permute(0, 2, 3, 1)                       # [B, C, H, W] -> [B, H, W, C]
            if tuple(img.shape[1:3]) != resolution:
                img = self.resize_with_pad(img, *resolution)
            images.append((img * 2.0 - 1.0).permute(0, 3, 1, 2))
            masks.append(torch.ones(1, dtype=torch.bool))
        for _ in range(len(self.image_keys) - len(present)):
            images.append(torch.ones_like(images[-1]) * -1)
            masks.append(torch.zeros(1, dtype=torch.bool))
        return torch.stack(images, dim=1), torch.stack(masks, dim=1)

    # ---- the whole pipeline -----------------------------------------------------------------------------------
    @torch.no_grad()
    def actions(self, frames: Mapping[str, np.ndarray], state: np.ndarray, task: str, noise: np.ndarray,
                num_steps: Optional[int] = None) -> np.ndarray:
        """[chunk_size, action_dim] float32 absolute actions, as lerobot's pipeline returns them."""
        batch = {f'observation.images.{name}': torch.from_numpy(frame).float().div(255).permute(2, 0, 1)[None]
                 for name, frame in frames.items()}
        raw_state = torch.from_numpy(np.asarray(state, dtype=np.float32))[None]          # cached by the relative step
        normalized = self._normalize(raw_state, self.norm_map['STATE'], self.state_stats, inverse=False)
        tokens, token_masks = self.tokens(self.prompt(task, normalized))
        images, image_masks = self._images(batch)
        padded_state = F.pad(normalized, (0, self.raw.get('max_state_dim', 32) - normalized.shape[1]))
        noise_t = torch.from_numpy(np.asarray(noise, dtype=np.float32)).reshape(1, *noise.shape[-2:])
        out = self.model.sample_actions(images, image_masks, tokens, token_masks, padded_state, noise=noise_t,
                                        num_steps=num_steps or self.raw.get('num_inference_steps', 10))
        actions = out[:, :, :self.action_dim].float()
        actions = self._normalize(actions, self.norm_map['ACTION'], self.action_stats, inverse=True)
        if self.raw.get('use_relative_actions', False):
            mask = torch.tensor(self._mask(actions.shape[-1]), dtype=actions.dtype)
            dims = mask.shape[0]
            actions = actions.clone()
            actions[..., :dims] += (raw_state[..., :dims] * mask).unsqueeze(-2)
        return actions[0].numpy()
