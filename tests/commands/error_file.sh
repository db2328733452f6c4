#!/bin/sh
# Rank 0 fails with status 2 after writing its error file, which says retrying cannot help; rank
# 1 runs on until it is stopped.
if [ "$RANK" = 0 ]; then
  printf '%s' '{"message": "ValueError: learning rate -1 is negative", "traceback": "Traceback (most recent call last):\n  File \"train.py\", line 7", "retry": false}' > "$SUBSTRAX_ERROR_FILE"
  exit 2
fi
exec sleep 1000
