# shell_checks.sh — the counters and checks the CLI shell tests (tests/cli_*.sh) share; sourced,
# not run (its name is outside CTest's cli_*.sh glob). Each check adds to pass or fail; a script
# ends with `echo "NAME: $pass passed, $fail failed"` and `[ "$fail" -eq 0 ]`.
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if [ "$2" = "$3" ]; then ok; else bad "$1: got [$2], want [$3]"; fi; }
has() { case "$2" in *"$3"*) ok ;; *) bad "$1: [$2] lacks [$3]" ;; esac; }
differ() { if [ "$2" != "$3" ]; then ok; else bad "$1: both [$2]"; fi; }
