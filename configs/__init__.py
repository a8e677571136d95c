"""The trainer's YAML configs, shipped as package data (read by :mod:`train.config`)."""
