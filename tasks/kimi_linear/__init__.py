"""Kimi-Linear W4A16 hybrid decode block (KernelBench-Mega 02_kimi_linear_decode)."""
