"""Graph passes: one file each, run in order by passes/pipeline.py."""
