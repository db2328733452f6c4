#!/bin/sh
# A command that stops well (docs/command-jobs.md, "Preemption"): on SIGTERM it takes a moment
# (its checkpoint), says so and exits 0; until then it waits.
trap 'sleep 1; echo "rank $RANK: checkpoint written after SIGTERM"; exit 0' TERM
echo "rank $RANK: training"
while :; do sleep 0.1; done
