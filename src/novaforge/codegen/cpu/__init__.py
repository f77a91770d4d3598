"""CPU backend: C++/OpenMP code generation (see backend.py and docs/cpu-backend.md)."""
