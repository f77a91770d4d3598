"""Reports: explain (pass-level visibility), metrics, the memory plan, the demo."""
