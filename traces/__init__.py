"""Trace schema, recorder, loader, replay, compare and reports."""
