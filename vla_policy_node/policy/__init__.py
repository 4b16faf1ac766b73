"""The model and nothing else: pure torch, no rclpy."""
