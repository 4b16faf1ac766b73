"""Checkpoint doctor: what a lerobot ``pretrained_model/`` folder is, what the node would refuse, what it needs.

    vla_policy_check_checkpoint DIR [--tokenizer PATH] [--fps 50] [--latency-ms 150] [--quantization int8_weights]

Every family of the registry (``policy/families``) through the family seam (policy/family.py):
its field table, its folder config, its model class and weight keys, its tokenizer class and source. No GPU
and no weights: ``model.safetensors`` is read as far as its JSON header (names, dtypes, shapes),
the model is built on torch's meta device (shapes only) to compare the tensors, and only the
small normalisation statistics and the tokenizer are read. Prints:
  - the policy type, cameras, state/action dims, chunk size and steps, the normalisation;
  - every config field and every file problem the node would refuse (not only the first);
  - whether a tokenizer is there, else the exact command that fetches it (gated on the Hub);
  - weight bytes per dtype, prefix tokens, cache-entry bytes, GPU memory of model + default cache
    in bf16 and under each ``quantization`` mode (the meta model quantized as the node would, its parameter
    and buffer bytes summed), and which device sizes (8, 16, 32, 64 GB) hold it;
  - the action period: 1 / --fps, else the fps the checkpoint records (training.json, or lerobot's
    train_config.json and its dataset's meta/info.json: policy/checkpoint.py ``recorded_fps``), else
    an assumed 50 fps, said so;
  - a parameter block to start from.
Exit status: 0 when the node would load the folder, 1 when it would refuse it, 2 when DIR is no
folder at all (missing, or a file).
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .params import SPECS

# safetensors dtype names -> bytes per element (the format's header spells them so).
SAFETENSORS_DTYPE_BYTES = {'F64': 8, 'F32': 4, 'F16': 2, 'BF16': 2, 'I64': 8, 'I32': 4, 'I16': 2, 'I8': 1,
                           'U8': 1, 'BOOL': 1, 'F8_E4M3': 1, 'F8_E5M2': 1}
MAX_HEADER_BYTES = 100 * 2 ** 20
# The frame rate the parameter block assumes when neither --fps nor the checkpoint gives one (said so).
ASSUMED_FPS = 50.0
GENERIC_ACCESS_NOTE = 'If the repository is gated, accept its licence on the Hub and log in first.'


@dataclass
class Diagnosis:
    folder: Path
    lines: List[str] = field(default_factory=list)       # the report, in order
    refusals: List[str] = field(default_factory=list)    # what the node would refuse

    def section(self, title: str) -> None:
        self.lines += ['', f'== {title}']

    def say(self, text: str) -> None:
        self.lines.append(f'  {text}')

    def refuse(self, text: str) -> None:
        self.refusals.append(text)
        self.lines.append(f'  REFUSED: {text}')


def read_safetensors_header(path: Path) -> Dict[str, Dict[str, Any]]:
    """The tensors of a safetensors file from its header only: name -> {'dtype', 'shape'} (no data read)."""
    with open(path, 'rb') as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ValueError('shorter than a safetensors header')
        (length,) = struct.unpack('<Q', prefix)
        if length > MAX_HEADER_BYTES:
            raise ValueError(f'header of {length} bytes: not a safetensors file')
        raw = handle.read(length)
    if len(raw) != length:
        raise ValueError('truncated safetensors header')
    header = json.loads(raw.decode('utf-8'))
    return {name: entry for name, entry in header.items() if name != '__metadata__'}


def tensor_bytes(entry: Mapping[str, Any]) -> int:
    count = 1
    for size in entry['shape']:
        count *= int(size)
    return count * SAFETENSORS_DTYPE_BYTES.get(entry['dtype'], 0)


def _mib(count: float) -> str:
    if count < 2 ** 20:
        return f'{count / 2 ** 10:,.1f} KiB'
    return f'{count / 2 ** 20:,.1f} MiB' if count < 2 ** 30 else f'{count / 2 ** 30:,.2f} GiB'


def _config_refusals(raw: Mapping[str, Any], fields: Mapping[str, Any], type_name: str
                     ) -> Tuple[List[str], Dict[str, Any]]:
    """Every config.json field the family refuses (its field table), and the document with those fields at
    loadable values (unknown ones left out, the others at their first accepted value)."""
    from .policy.config_fields import DEFAULT_ONLY

    found, usable = [], dict(raw)
    for name, value in raw.items():
        entry = fields.get(name)
        if entry is None:
            found.append(f'config.json field {name} = {json.dumps(value)[:80]}: a lerobot {type_name} config has '
                         'no such field; refused rather than ignored')
            usable.pop(name)
        elif entry.handling == DEFAULT_ONLY and not any(type(value) is type(ok) and value == ok
                                                        for ok in entry.accepted):
            allowed = ' or '.join(json.dumps(ok) for ok in entry.accepted)
            found.append(f'config.json {name} = {json.dumps(value)[:80]}: {entry.why}; loads only with {allowed}')
            usable[name] = entry.accepted[0]
    return found, usable


def _tokenizer_hub_name(folder: Path) -> Optional[str]:
    """The tokenizer the checkpoint's pre-processor names (lerobot's tokenizer step), or None."""
    from .policy.checkpoint import PREPROCESSOR_FILE

    try:
        steps = json.loads((folder / PREPROCESSOR_FILE).read_text()).get('steps', [])
    except (OSError, ValueError, AttributeError):
        return None
    for step in steps:
        name = (step.get('config') or {}).get('tokenizer_name') if isinstance(step, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def fetch_tokenizer_command(folder: Path, source: Any) -> List[str]:
    """The command that fetches only the tokenizer's files (policy/family.py TokenizerSource: its file, or its
    ``include`` patterns) into <folder>/tokenizer/, where the node looks, and how the other generation of the
    Hugging Face CLI spells it: ``hf download`` (huggingface_hub >= 1.0, the only one it installs) repeats
    ``--include`` per pattern, where ``huggingface-cli download`` takes them after one ``--include`` (and keeps
    only the last repeated one)."""
    target = f'--local-dir {folder / "tokenizer"}'
    if not source.include:
        return [f'hf download {source.hub_name} {source.file_name} {target}',
                '(huggingface_hub before 1.0: `huggingface-cli download` takes the same arguments)']
    patterns = [f"'{pattern}'" for pattern in source.include]
    return [f'hf download {source.hub_name} {" ".join("--include " + p for p in patterns)} {target}',
            f'(huggingface_hub before 1.0: `huggingface-cli download {source.hub_name} --include {" ".join(patterns)} '
            f'{target}`)']


def _weights(diagnosis: Diagnosis, family: Any, config: Any, header: Dict[str, Dict[str, Any]]) -> int:
    """Names and shapes against the family's model built on the meta device (nothing allocated), every mismatch
    listed; returns the model's bytes in bf16 (the parts the family keeps in fp32 counted as fp32)."""
    import torch

    from .policy.checkpoint import WEIGHTS_FILE

    keys = family.weight_keys
    with torch.device('meta'):
        model = family.model_class(config)
    expected = {name: (tuple(t.shape), t.numel()) for name, t in model.state_dict().items()}
    canonical = {file_key: keys.canonical(file_key) for file_key in header}
    found: Dict[str, str] = {}
    unexpected, misshaped = [], []
    for file_key, key in canonical.items():
        if key in expected:
            found[key] = file_key
            if tuple(header[file_key]['shape']) != expected[key][0]:
                misshaped.append(f'{file_key} {list(header[file_key]["shape"])} (expected {list(expected[key][0])})')
        elif not keys.known_unused(key):
            unexpected.append(file_key)
    for key, stand_in in keys.stand_ins.items():      # tied embeddings: an export may keep only the LM head
        if key in expected and key not in found and stand_in in canonical.values():
            found[key] = stand_in
    missing = sorted(set(expected) - set(found))
    for kind, names in (('missing', missing), ('unexpected', sorted(unexpected)), ('mis-shaped', misshaped)):
        if names:
            shown = ', '.join(names[:6]) + (f' and {len(names) - 6} more' if len(names) > 6 else '')
            diagnosis.refuse(f'{WEIGHTS_FILE}: {len(names)} {kind} tensor(s): {shown}')
    if not (missing or unexpected or misshaped):
        diagnosis.say(f'{len(found)} tensors match a {config.policy_type} model of this config.json')
    return sum(count * (4 if model.param_dtype(name, torch.bfloat16) == torch.float32 else 2)
               for name, (_, count) in expected.items())


# What a device must keep free besides model + cache: the OS, the ROS 2 graph (drivers, controllers), the CUDA
# context and the activations of one chunk. A Jetson shares this memory with the CPU.
HEADROOM_BYTES = 4 << 30
DEVICE_SIZES_GB = (8, 16, 32, 64)


def quantized_bytes(family: Any, config: Any) -> Dict[str, int]:
    """The model's bytes under each quantization mode (bf16 compute): built on the meta device, quantized by
    policy/quant.py as the node does, every parameter and buffer summed (nothing allocated)."""
    import torch

    from .policy.quant import MODES, model_bytes, quantize_model

    figures = {}
    for mode in MODES:
        with torch.device('meta'):
            model = family.model_class(config)
        model.set_compute_dtype(torch.bfloat16)
        quantize_model(model, mode, torch.device('meta'))
        figures[mode] = model_bytes(model)
    return figures


def _memory_per_mode(diagnosis: Diagnosis, family: Any, config: Any, cache: int, chosen: str) -> None:
    figures = quantized_bytes(family, config)
    diagnosis.say(f'model + default cache per quantization mode (bf16 compute; fits: total + '
                  f'{_mib(HEADROOM_BYTES)} headroom for the OS, ROS 2, the CUDA context and activations):')
    for mode, count in figures.items():
        total = count + cache
        fits = [f'{size} GB {"yes" if total + HEADROOM_BYTES <= size * 10 ** 9 else "no"}'
                for size in DEVICE_SIZES_GB]
        marker = '  <- --quantization' if mode == chosen else ''
        diagnosis.say(f'  {mode:13} weights {_mib(count)} ({count / figures["none"]:.2f}x) + cache {_mib(cache)} '
                      f'= {_mib(total)}; {", ".join(fits)}{marker}')


def diagnose(folder: Path, tokenizer: Optional[Path] = None, fps: Optional[float] = None,
             latency_ms: Optional[float] = None, quantization: str = 'none') -> Diagnosis:
    """The whole report for one folder (see the module docstring), through the policy-family registry."""
    from .policy.checkpoint import WEIGHTS_FILE, CheckpointError, read_config_json
    from .policy.config_fields import IMPLEMENTED, ConfigError
    from .policy.families import family_class

    folder = Path(folder)
    diagnosis = Diagnosis(folder)
    diagnosis.lines.append(f'checkpoint {folder}')
    try:
        raw = read_config_json(folder)
        family = family_class(raw.get('type'))
    except (CheckpointError, ConfigError) as exc:
        diagnosis.refuse(str(exc))
        return diagnosis

    diagnosis.section('config.json fields the node refuses')
    refused, usable = _config_refusals(raw, family.config_fields(), family.type_name)
    for problem in refused:
        diagnosis.refuse(problem)
    try:
        config = family.folder_config(folder, usable)
    except (ConfigError, CheckpointError) as exc:
        diagnosis.refuse(str(exc))
        return diagnosis
    if not refused:
        diagnosis.say('none')
    else:
        diagnosis.say('(below: the checkpoint as if those fields were at their loadable values)')

    diagnosis.section('policy')
    diagnosis.say(f'type {config.policy_type} (family {family.__name__}); {config.num_inference_steps} '
                  'flow-matching steps')
    diagnosis.say(f'cameras {list(config.camera_names)}' + (f' + {config.empty_cameras} empty (masked)'
                                                            if config.empty_cameras else '')
                  + f'; images {config.image_resolution[1]}x{config.image_resolution[0]}')
    diagnosis.say(f'state_dim {config.state_dim}, action_dim {config.action_dim} (padded to '
                  f'{config.max_state_dim} / {config.max_action_dim})')
    if config.action_feature_names:
        diagnosis.say(f'action names {list(config.action_feature_names)}')
    diagnosis.say(f'chunk_size {config.chunk_size}, n_action_steps {config.n_action_steps}')
    if config.use_relative_actions:
        diagnosis.say(f'relative actions (offsets from the state), except joints containing '
                      f'{list(config.relative_exclude_joints)}')
    if config.rtc_training_max_delay:
        diagnosis.say(f'trained for real-time chunking: rtc_training_max_delay {config.rtc_training_max_delay}')
    mapping = ', '.join(f'{k} {v}' for k, v in sorted(config.normalization_mapping.items()))
    consulted = family.config_fields().get('normalization_mapping')
    if consulted is not None and consulted.handling != IMPLEMENTED:     # e.g. GR00T: its processor steps normalise
        diagnosis.say(f'normalization_mapping ({mapping}): {consulted.why}')
    else:
        diagnosis.say(f'normalisation {mapping}')
    try:
        state, action = family.folder_normalizers(folder, config)
        diagnosis.say(f'statistics: state {state.mode} ({state.dim} values), action {action.mode} '
                      f'({action.dim} values)'.replace('(-1 values)', '(none needed)'))
    except CheckpointError as exc:
        diagnosis.refuse(str(exc))

    diagnosis.section('weights (safetensors header only)')
    bf16_bytes = 0
    try:
        header = read_safetensors_header(folder / WEIGHTS_FILE)
    except FileNotFoundError:
        diagnosis.refuse(f'no {WEIGHTS_FILE} in {folder}')
    except (OSError, ValueError) as exc:
        diagnosis.refuse(f'{WEIGHTS_FILE} is not a readable safetensors file: {exc}')
    else:
        per_dtype: Dict[str, int] = {}
        for entry in header.values():
            per_dtype[entry['dtype']] = per_dtype.get(entry['dtype'], 0) + tensor_bytes(entry)
        sizes = [f'{dtype} {_mib(count)} ({count:,} B)' for dtype, count in sorted(per_dtype.items())]
        diagnosis.say('bytes per dtype: ' + ', '.join(sizes))
        bf16_bytes = _weights(diagnosis, family, config, header)

    diagnosis.section('tokenizer')
    found = tokenizer if tokenizer is not None else family.folder_tokenizer(folder, config)
    if found is not None and Path(found).exists():
        _tokenizer_check(diagnosis, family, Path(found), config)
    else:
        # The files the family reads and where they come from: the repository the checkpoint's pre-processor
        # names, else the family's own.
        source = family.tokenizer_source(config, _tokenizer_hub_name(folder))
        diagnosis.refuse(f'no tokenizer in {folder / "tokenizer"} (or at tokenizer_path): the robot cannot '
                         f'download {source.hub_name}')
        what = 'its tokenizer files' if source.include else 'only the tokenizer file'
        diagnosis.say(f'on a machine with internet, fetch {what}, then copy the folder over:')
        for line in fetch_tokenizer_command(folder, source):
            diagnosis.say(f'  {line}')
        diagnosis.say(source.access_note or GENERIC_ACCESS_NOTE)

    diagnosis.section('memory (analytic)')
    entry = config.cache_entry_bytes(2)
    cache = min(SPECS['cache_max_bytes'].default, SPECS['cache_max_entries'].default * entry)
    image_tokens = len(config.all_camera_names) * config.tokens_per_image
    diagnosis.say(f'prefix up to {config.prefix_len} tokens: {len(config.all_camera_names)} image slots x '
                  f'{config.tokens_per_image} + {config.prefix_len - image_tokens} for the prompt')
    diagnosis.say(f'one cache entry {_mib(entry)} ({entry:,} B) in bf16; the default cache (cache_max_entries '
                  f'{SPECS["cache_max_entries"].default}, cache_max_bytes {_mib(SPECS["cache_max_bytes"].default)}) '
                  f'holds up to {_mib(cache)}')
    if bf16_bytes:
        diagnosis.say(f'GPU, bf16: model {_mib(bf16_bytes)} (the parts the family keeps in fp32 counted so) + cache '
                      f'{_mib(cache)} = {_mib(bf16_bytes + cache)}, plus the CUDA context and activations')
        _memory_per_mode(diagnosis, family, config, cache, quantization)

    diagnosis.section('action period')
    fps, origin = action_rate(diagnosis, folder, fps)
    diagnosis.section('a parameter block to start from (docs/parameters.md, "Choosing the control parameters")')
    diagnosis.lines += suggested_parameters(folder, config, fps, latency_ms, origin)
    return diagnosis


def action_rate(diagnosis: Diagnosis, folder: Path, fps: Optional[float]) -> Tuple[float, str]:
    """The training data's frame rate: ``--fps``, else what the checkpoint records (checkpoint.recorded_fps),
    else ASSUMED_FPS, said as an assumption; with where it comes from, for the parameter block."""
    from .policy.checkpoint import recorded_fps

    recorded = recorded_fps(folder)
    if fps:
        origin = f'{fps:g} fps (--fps)'
        if recorded is not None and abs(recorded[0] - fps) > 1e-6 * fps:
            diagnosis.say(f'WARNING: --fps {fps:g}, but {recorded[1]} records {recorded[0]:g} fps')
    elif recorded is not None:
        fps, where = recorded
        origin = f'{fps:g} fps, recorded in {where}'
    else:
        fps = ASSUMED_FPS
        origin = f'ASSUMED {fps:g} fps: the checkpoint records none (pass --fps)'
    diagnosis.say(f'{origin}: action_period_sec {1.0 / fps:.4g}')
    return fps, origin


def _tokenizer_check(diagnosis: Diagnosis, family: Any, path: Path, config: Any) -> None:
    from .policy.tokenizer import TokenizerError

    try:
        loaded = family.tokenizer_class.from_path(path)
    except (TokenizerError, ValueError, OSError) as exc:
        diagnosis.refuse(str(exc))
        return
    if loaded.vocab_size > config.vocab_size:
        diagnosis.refuse(f'tokenizer {path} has {loaded.vocab_size} tokens, more than the model embedding '
                         f'({config.vocab_size})')
        return
    try:
        family.check_tokenizer(loaded, config, path)
    except (TokenizerError, ValueError) as exc:
        diagnosis.refuse(str(exc))
        return
    diagnosis.say(f'{path} ({loaded.vocab_size} tokens)')


def suggested_parameters(folder: Path, config: Any, fps: float, latency_ms: Optional[float],
                         origin: str) -> List[str]:
    """A params block: joint placeholders, cameras, the action period (``origin``: where ``fps`` comes from),
    execute_steps and a rate that fits."""
    names = list(config.action_feature_names or [f'<joint_{i + 1}>' for i in range(config.action_dim)])
    period = 1.0 / fps
    execute = min(config.n_action_steps, config.chunk_size)
    lines = ['/**/vla_policy:', '  ros__parameters:', f'    checkpoint_path: {folder}',
             f'    joint_names: {json.dumps(names)}   # your controller\'s names, in the action order']
    if config.state_dim != config.action_dim:
        lines.append(f'    state_joint_names: {json.dumps([f"<state_{i + 1}>" for i in range(config.state_dim)])}')
    lines.append(f'    camera_names: {json.dumps(list(config.camera_names))}')
    lines.append(f'    camera_topics: {json.dumps([f"/<camera for {c}>/image_raw" for c in config.camera_names])}')
    lines.append(f'    action_period_sec: {period:.4g}   # 1 / the training data\'s fps: {origin}')
    span = execute * period
    # Replan when half of the published span is left, and never faster than inference allows.
    rate = 1.0 / (span / 2)
    if latency_ms:
        rate = min(rate, 1000.0 / (1.5 * latency_ms))
    rate = max(0.1, min(rate, 30.0))
    lines.append(f'    execute_steps: {execute}   # n_action_steps: {execute * period:.2f} s per trajectory')
    lines.append(f'    control_rate_hz: {float(f"{rate:.2g}")}   # a new chunk every {1 / rate:.2f} s: '
                 '1/control_rate_hz + latency < execute_steps * action_period_sec')
    if latency_ms and 1.0 / rate + latency_ms / 1000.0 >= span:
        lines.append(f'    # WARNING: a {latency_ms:g} ms inference does not fit a {span:.2f} s trajectory: the arm '
                     'would stop between chunks')
    lines.append('    chunking: "rtc"   # smooth hand-over between chunks')
    lines += _shipped_demo_note(folder)
    return lines


def _shipped_demo_note(folder: Path) -> List[str]:
    """For the embedded demo checkpoint: why the shipped params file runs it otherwise than the block above."""
    from .policy.builtin import DEMO_CHECKPOINT

    if Path(folder).resolve() != DEMO_CHECKPOINT.resolve():
        return []
    rate, chunking = SPECS['control_rate_hz'].default, SPECS['chunking'].default
    return ['    # The shipped config/vla_policy.yaml and config/demo.yaml run builtin:demo otherwise, at',
            f'    # control_rate_hz {float(rate)} and chunking "{chunking}" (the parameters\' defaults): its model '
            'answers in milliseconds,',
            '    # so it can replan at every action, and each chunk is sampled on its own, as lerobot\'s rollout '
            'runs a policy.',
            '    # The block above is the rule for a checkpoint of real size: replan half way through each '
            'trajectory, with rtc.']


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='vla_policy_check_checkpoint', description=__doc__.split('\n\n')[0])
    parser.add_argument('folder', help='lerobot pretrained_model/ folder (or builtin:demo, builtin:tiny)')
    parser.add_argument('--tokenizer', type=Path, help='tokenizer.model / tokenizer.json (the node\'s tokenizer_path)')
    parser.add_argument('--fps', type=float, help='frame rate of the training data (sets action_period_sec)')
    parser.add_argument('--latency-ms', type=float, help='measured inference latency (latency_total_p95 in '
                        '/diagnostics) to fit the control rate to')
    parser.add_argument('--quantization', default='none', choices=('none', 'int8_weights', 'fp8'),
                        help='the node\'s quantization parameter: marks its line in the memory table')
    args = parser.parse_args(argv)
    from .policy.builtin import checkpoint_folder    # the node's reading of checkpoint_path, builtins included

    args.folder = checkpoint_folder(args.folder)
    if not args.folder.is_dir():
        print(f'vla_policy_check_checkpoint: {args.folder} is not a folder', file=sys.stderr)
        return 2
    diagnosis = diagnose(args.folder, args.tokenizer, args.fps, args.latency_ms, args.quantization)
    print('\n'.join(diagnosis.lines))
    print()
    if diagnosis.refusals:
        print(f'the node would refuse this checkpoint: {len(diagnosis.refusals)} problem(s) above (REFUSED)')
        return 1
    print('the node would load this checkpoint')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
