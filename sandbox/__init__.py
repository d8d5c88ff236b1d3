"""Build, isolate, check and time candidate kernels. The parent side never touches CUDA."""
