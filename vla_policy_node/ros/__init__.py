"""Everything that imports rclpy: the lifecycle node, its parameters and message conversions."""
