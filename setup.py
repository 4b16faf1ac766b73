"""ament_python package definition; also a plain pip-installable package."""
import os
from glob import glob

from setuptools import find_packages, setup

package_name = 'vla_policy_node'

# ROS 2 Kilted wheels from PyPI, for machines without an apt ROS install.
# On a robot, ROS comes from apt/rosdep and this extra is not needed.
ROS_WHEELS = [
    'ros-rclpy',
    'ros-std-msgs',
    'ros-std-srvs',
    'ros-sensor-msgs',
    'ros-trajectory-msgs',
    'ros-diagnostic-msgs',
    'ros-lifecycle-msgs',
    'ros-rosgraph-msgs',
    'ros-rmw-fastrtps-cpp',
]

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*', 'bench']),
    # The embedded demo checkpoint (checkpoint_path builtin:demo), read in place.
    package_data={package_name: ['demo_checkpoint/*.json', 'demo_checkpoint/*.safetensors',
                                 'demo_checkpoint/tokenizer/*']},
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        (os.path.join('share', package_name, 'launch'), glob(os.path.join('launch', '*launch.[pxy][yma]*'))),
        (os.path.join('share', package_name, 'config'), glob(os.path.join('config', '*.yaml'))),
    ],
    python_requires='>=3.10',
    install_requires=[
        'setuptools',
        'numpy>=1.22',
        # Never pinned exactly: on Jetson torch comes from the vendor's wheels.
        'torch>=2.1',
        'safetensors>=0.4',
        'sentencepiece>=0.1.99',
        'tokenizers>=0.15',
        # GR00T N1.7 renders its backbone's chat template with it (as transformers does); 3.0.3 is what
        # Humble's apt ships (python3-jinja2, a rosdep key in package.xml).
        'jinja2>=3.0',
        'xxhash>=3.0',
        'pillow>=9.0',
        'pyyaml>=5.4',
        'rosbags>=0.10',
        'matplotlib>=3.5',
        'tqdm>=4.60',
        # Remote inference (vla_policy_node/remote): websockets.asyncio (client and server) first appears in 13.0,
        # so the apt python3-websockets of Humble (10.1) and Jazzy (10.4) is too old and pip brings it; msgpack
        # 1.0.3 is what Humble's and Jazzy's apt ship (python3-msgpack, a rosdep key in package.xml).
        'websockets>=13.0',
        'msgpack>=1.0.3',
    ],
    extras_require={
        'ros': ROS_WHEELS,
        'test': ['pytest>=7', 'pytest-timeout>=2.1', 'pytest-xdist>=3', 'transformers>=4.40', 'flake8>=5'],
        # vla_policy_bag_to_lerobot and vla_policy_replay --dataset (vla_policy_node/dataset). av >= 15 keeps
        # lerobot's own pin (av>=15,<16 in its dataset extra) satisfiable in one environment; every av wheel
        # from 15 on carries libsvtav1, lerobot's default video codec.
        'dataset': ['pyarrow>=14', 'av>=15'],
        # vla_policy_fleet (vla_policy_node/fleet, docs/fleet.md): Ray Serve with its FastAPI ingress. The floor is the
        # Ray whose request-router API (ray.serve.request_router, alpha) the robot-affine router was written against.
        'fleet': ['ray[serve]>=2.60'],
    },
    zip_safe=True,
    maintainer='vla_policy_node developers',
    maintainer_email='vla-policy-node@example.com',
    description='Vision-Language-Action policies (pi0, pi0.5, SmolVLA, GR00T N1.7) as a ROS 2 node with an '
                'exact-match prefix cache',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'vla_policy_node = vla_policy_node.ros.main:main',
            'vla_policy_replay = vla_policy_node.replay.cli:main',
            'vla_policy_play = vla_policy_node.replay.play:main',
            'vla_policy_make_bag = vla_policy_node.replay.make_bag:main',
            'vla_policy_make_checkpoint = vla_policy_node.policy.tiny_default:main',
            'vla_policy_serve = vla_policy_node.remote.server:main',
            'vla_policy_fleet = vla_policy_node.fleet.cli:main',
            'vla_policy_gripper_relay = vla_policy_node.ros.gripper_relay:main',
            'vla_policy_check_checkpoint = vla_policy_node.doctor:main',
            'vla_policy_train_demo = vla_policy_node.train_demo:main',
            'vla_policy_bag_to_lerobot = vla_policy_node.dataset.convert:main',
        ],
    },
)
