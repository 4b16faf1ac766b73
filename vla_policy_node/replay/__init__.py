"""Bag reading/writing, sample-bag generation and a pure-Python bag player."""
