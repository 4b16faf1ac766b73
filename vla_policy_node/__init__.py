"""pi0-family Vision-Language-Action policy as a ROS 2 node, with an exact-match prefix K/V cache."""

__version__ = '0.1.0'
