#!/bin/sh
# A shell script as a command job (`per_worker`): records its environment in $1, reports a step
# after a malformed line, then rank 1 fails with status 3 after saying why on stderr while rank 0
# waits to be stopped (its pid in $1).
out="$1"
env > "$out/env-$SUBSTRAX_ATTEMPT-$RANK"
echo "rank $RANK attempt $SUBSTRAX_ATTEMPT restart $TORCHELASTIC_RESTART_COUNT resume ${SUBSTRAX_RESUME_FROM:-none}"
echo 'this is not json' >> "$SUBSTRAX_REPORT_FILE"
printf '{"type":"step","step":1,"metrics":{"x":%s}}\n' "$RANK" >> "$SUBSTRAX_REPORT_FILE"
if [ "$RANK" = 1 ]; then
  echo "rank 1: the data shard is corrupt" >&2
  exit 3
fi
echo $$ > "$out/pid-$SUBSTRAX_ATTEMPT-$RANK"
exec sleep 1000
