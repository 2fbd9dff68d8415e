#!/usr/bin/env bash
# Run make targets in lanes: the targets of a lane one after another, the
# lanes side by side. make test is four lanes, so the tiers that wait on
# real processes (Envoy, Redis, a kube-apiserver, a soak's clock) overlap
# instead of queueing.
#
#   scripts/test-lanes.sh NAME=STEP[,STEP...] ...
#   e.g. scripts/test-lanes.sh unit=nice:unit,chart-test e2e=e2e
#
# A step is a make target; nice:TARGET runs it at a lower CPU priority
# (nice 10), for steps that only compile and run tests in virtual time:
# they yield the cores to the lanes whose real processes run on real
# timeouts (a gate's message timeout, a Redis call's), whatever the load.
#
# Each lane's output goes to bin/test-logs/NAME.log (TEST_LOGS to change the
# directory); the terminal gets one line per step. A lane runs every step
# even after one fails (a failure in one tier does not hide the others).
# At the end: a table of each step's seconds and result, the tail of every
# failing step's log, and a non-zero exit if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

make=${MAKE:-make}
logs=${TEST_LOGS:-bin/test-logs}
tail_lines=${TEST_LOG_TAIL:-120}
[ $# -gt 0 ] || { echo "usage: $0 NAME=STEP[,STEP...] ..." >&2; exit 2; }
mkdir -p "$logs"
# One run at a time per log directory: a second would truncate this one's logs.
exec 9>"$logs/.lock"
flock -n 9 || { echo "$0: another run is writing $logs (TEST_LOGS to use another directory)" >&2; exit 2; }

# Each lane is a background job in a process group of its own (set -m), so an
# interrupt or a CI timeout stops every lane and what it started.
set -m
pids=() names=()
stop() {
	for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
	wait
	exit 130
}
trap stop INT TERM

lane() { # name targets...; fails if any step failed
	local name=$1 target start rc failed=0
	shift
	: >"$logs/$name.log"
	: >"$logs/$name.steps"
	for target in "$@"; do
		start=$SECONDS
		echo "[$name] make $target: started $(date -u +%T)"
		echo "=== make $target (started $(date -u +%T))" >>"$logs/$name.log"
		case $target in
		nice:*) nice -n 10 "$make" --no-print-directory "${target#nice:}" >>"$logs/$name.log" 2>&1 9>&- ;;
		*) "$make" --no-print-directory "$target" >>"$logs/$name.log" 2>&1 9>&- ;;
		esac
		rc=$?
		echo "=== make $target: exit $rc after $((SECONDS - start)) s" >>"$logs/$name.log"
		# The step's line range in the log, for the failure's tail.
		printf '%s\t%s\t%s\t%s\n' "$target" "$((SECONDS - start))" "$rc" "$(wc -l <"$logs/$name.log")" >>"$logs/$name.steps"
		echo "[$name] make $target: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)") after $((SECONDS - start)) s"
		[ "$rc" = 0 ] || failed=1
	done
	return $failed
}

started=$SECONDS
for spec in "$@"; do
	name=${spec%%=*}
	IFS=, read -r -a targets <<<"${spec#*=}"
	lane "$name" "${targets[@]}" &
	pids+=("$!") names+=("$name")
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
trap - INT TERM

echo
printf '%-8s %-16s %8s  %s\n' lane step seconds result
for name in "${names[@]}"; do
	lane_s=0
	while IFS=$'\t' read -r target secs rc _; do
		printf '%-8s %-16s %8s  %s\n' "$name" "$target" "$secs" "$([ "$rc" = 0 ] && echo pass || echo "FAIL (exit $rc)")"
		lane_s=$((lane_s + secs))
		[ "$rc" = 0 ] || failed=1
	done <"$logs/$name.steps"
	printf '%-8s %-16s %8s\n' "$name" "(lane)" "$lane_s"
done
printf '%-8s %-16s %8s  %s\n' all "(wall)" "$((SECONDS - started))" "$([ $failed = 0 ] && echo pass || echo FAIL)"

for name in "${names[@]}"; do
	from=1
	while IFS=$'\t' read -r target secs rc to; do
		if [ "$rc" != 0 ]; then
			echo
			echo "--- $logs/$name.log: make $target failed; what failed, then its last $tail_lines lines:"
			sed -n "${from},${to}p" "$logs/$name.log" | grep -E -e '^\s*--- FAIL' -e '^FAIL' -e '^panic:'
			echo "..."
			sed -n "${from},${to}p" "$logs/$name.log" | tail -n "$tail_lines"
		fi
		from=$((to + 1))
	done <"$logs/$name.steps"
done
exit $failed
