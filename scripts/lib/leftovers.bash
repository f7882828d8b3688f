# Sourced by scripts/test and scripts/chaos: the sweep that kills every process a run left
# behind, found by a marker in its environment.
#
#   source "$root/scripts/lib/leftovers.bash"
#   export IDEM_TEST_RUN_ID=$run_id      # before starting anything
#   ...; idem_kill_leftovers "$run_id"   # on exit
#
# Every process started after the export inherits the marker, including children that
# outlive a crashed or timed-out parent (re-parented away from us, so `jobs` and process
# groups cannot find them). The environment is the one trace they cannot shed.

# idem_kill_leftovers RUN_ID
#   SIGKILLs every process (except this shell) whose environment holds
#   IDEM_TEST_RUN_ID=RUN_ID, and says how many it found.
idem_kill_leftovers() {
  local marker="IDEM_TEST_RUN_ID=$1" dir pid entry
  local -a found=()
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    # Pure bash on purpose: a grep here would itself carry the marker.
    {
      while IFS= read -r -d '' entry; do
        if [[ $entry == "$marker" ]]; then
          found+=("$pid")
          break
        fi
      done
    } 2>/dev/null <"$dir/environ" || true
  done
  if ((${#found[@]})); then
    echo "killing ${#found[@]} leftover process(es): ${found[*]}"
    kill -KILL "${found[@]}" 2>/dev/null || true
  fi
}
