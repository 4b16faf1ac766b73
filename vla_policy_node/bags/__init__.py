"""rosbag2 bags without ROS, below every tool that reads or writes them (the replay, the player, the
LeRobotDataset converter, the demo): ``bag_io`` reads and writes them through ``rosbags``, ``bag_time`` runs
the node's control timer over their messages."""
