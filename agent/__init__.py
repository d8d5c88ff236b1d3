"""Optimization sessions: the measure -> propose -> build -> evaluate -> keep/revert loop, and its planners."""
