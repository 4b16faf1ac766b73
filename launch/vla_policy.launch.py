"""Start the policy node.

    ros2 launch vla_policy_node vla_policy.launch.py [params_file:=...] [checkpoint_path:=...]
        [namespace:=...] [use_sim_time:=true]
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

PACKAGE = 'vla_policy_node'


def _policy_node(context):
    """The node, with checkpoint_path overriding the params file only when given."""
    overrides = {'use_sim_time': LaunchConfiguration('use_sim_time').perform(context).lower() in ('true', '1')}
    checkpoint = LaunchConfiguration('checkpoint_path').perform(context)
    if checkpoint:
        overrides['checkpoint_path'] = checkpoint
    return [Node(
        package=PACKAGE,
        executable='vla_policy_node',
        name='vla_policy',
        namespace=LaunchConfiguration('namespace'),
        parameters=[LaunchConfiguration('params_file'), overrides],
        output='screen',
        emulate_tty=True,
    )]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), 'config', 'vla_policy.yaml']),
            description='Node parameters (config/vla_policy.yaml documents every one).'),
        DeclareLaunchArgument('checkpoint_path', default_value='',
                              description='lerobot pretrained_model folder; empty: the one in params_file.'),
        DeclareLaunchArgument('namespace', default_value='', description='Namespace of the node.'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='Follow /clock (rosbag replay with --clock, simulators).'),
        OpaqueFunction(function=_policy_node),
    ])
