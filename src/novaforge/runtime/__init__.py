"""Runtime: the reference interpreter and compiled programs."""
