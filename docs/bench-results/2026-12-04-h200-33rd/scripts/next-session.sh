# Superseded (34th session) by ../../2026-12-04-cpu-34th/scripts/next-session.sh: the same
# parts, with reuse.patch regenerated against bdac217; this directory's ticktrace/ was fixed
# in place there (its join wrapper dropped the joined uids `_start_decoding` returns since
# 8ff5de0, which failed every joining row).
echo "use docs/bench-results/2026-12-04-cpu-34th/scripts/next-session.sh" >&2; exit 2
