# Run in the 23rd session (14:08 UTC): lines 7-16 of
# docs/bench-results/2026-12-03-h200-22nd/scripts/d28-next-session.sh, as they stand there
# (the 8B against mlx_lm.server as the lease's first run, then the tests of its part 2).
