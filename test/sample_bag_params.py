"""The params file a replay of the sample bag runs with (vla_policy_make_bag's joints, an instruction, 10 Hz, 0.1 s
actions, a camera skew the bag's camera phases fit in); ``extra`` adds or overrides parameters."""
import json
from pathlib import Path

JOINTS = [f'joint_{i}' for i in range(1, 7)]
BASE = {'joint_names': JOINTS, 'instruction': 'pick up the red block', 'control_rate_hz': 10.0,
        'action_period_sec': 0.1, 'max_camera_skew_sec': 0.25}


def write_sample_bag_params(folder: Path, **extra) -> Path:
    path = Path(folder) / 'params.yaml'
    lines = ['/**:', '  ros__parameters:']
    lines += [f'    {key}: {json.dumps(value)}' for key, value in {**BASE, **extra}.items()]
    path.write_text('\n'.join(lines) + '\n')
    return path
