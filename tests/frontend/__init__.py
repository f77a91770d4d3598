"""Tests of the frontend: ATen lowering rules against eager, capture errors, recompilation."""
