"""Configs, the main job and the powerful-benchmarker-style runner."""
