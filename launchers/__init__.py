"""Launchers of upstream Megatron-DeepSpeed's pretrain_gpt.py: ``python -m launchers``.

Imports point one way: ``cli`` -> ``doctor`` / ``lab`` -> ``run`` -> ``config`` (and to
``analysis``, never back).
"""
