"""The Triton (GPU) backend: analysis of kernel bodies, Triton renderers, loader and runtime."""
