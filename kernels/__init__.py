"""The seed kernels, kernels/<task>/seed.cu: package data, read through importlib.resources (tasks.base)."""
