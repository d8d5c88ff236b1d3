"""Task definitions: reference, baseline, inputs, tolerances and kernel binding per task."""
