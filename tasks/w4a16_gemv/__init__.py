"""Smoke task: RMSNorm -> fused int4 dequant GEMV -> residual add, in one kernel.

Also the worked example of how to add a task (see README, "Adding a task").
"""
