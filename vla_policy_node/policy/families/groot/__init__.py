"""GR00T N1.7 (lerobot policies/groot): the family GrootFamily (adapter.py) and its modules."""
