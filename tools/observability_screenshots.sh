#!/usr/bin/env bash
# Takes the pictures of docs/observability.md from a real run, with headless Chromium (Debian's
# `chromium`): a Fashion-MNIST job on a local cluster (2 workers x 2 CPU devices), then
#   docs/images/terminal-plot.png   `substraxctl metrics JOB --plot` as a terminal shows it;
#   docs/images/tensorboard.png     TensorBoard's time series of `metrics JOB --tensorboard DIR`.
# The cluster, TensorBoard and the browser are stopped on exit, whatever happens.
#
#   tools/observability_screenshots.sh        # installs chromium if missing (apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=docs/images
VENV="${SUBSTRAX_VENV:-/opt/substrax/venv}"

SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh
if ! command -v chromium >/dev/null; then
  echo "observability_screenshots: installing Debian's chromium..." >&2
  SUDO=(); [ "$(id -u)" -eq 0 ] || SUDO=(sudo)
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
fi
bazel build --noshow_progress //client:substraxctl //coordinator:substrax-coordinator \
  //agent:substrax-agent //worker:substrax-job >&2
BIN="$(bazel info bazel-bin 2>/dev/null)"
CTL="$BIN/client/substraxctl"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/observability.XXXXXX")"
TB_PID=""
cleanup() {
  [ -z "$TB_PID" ] || kill "$TB_PID" 2>/dev/null || true
  "$CTL" local down --state-dir "$WORK/cluster" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

eval "$("$CTL" local up --workers 2 --cpu-devices 2 --data-root /usr/share/datasets \
  --state-dir "$WORK/cluster" --coordinator-binary "$BIN/coordinator/substrax-coordinator" \
  --agent-binary "$BIN/agent/substrax-agent" --job-binary "$BIN/worker/substrax-job")"
sed -e 's/^  epochs: .*/  steps: 1500/' -e 's/report_every_steps: .*/report_every_steps: 25/' \
  examples/fashion_mnist_mlp.yaml >"$WORK/fmnist.yaml"
grep -q '^  steps: 1500' "$WORK/fmnist.yaml" || echo "  steps: 1500" >>"$WORK/fmnist.yaml"
JOB="$("$CTL" submit "$WORK/fmnist.yaml")"
"$CTL" watch "$JOB" >&2

shot() {  # url png width height [extra chromium flags...]
  local url="$1" png="$2" w="$3" h="$4"
  shift 4
  chromium --headless=new --no-sandbox --use-angle=swiftshader --enable-unsafe-swiftshader \
    --hide-scrollbars --no-first-run \
    --user-data-dir="$WORK/chromium" --window-size="$w,$h" --screenshot="$png" "$@" "$url" \
    >/dev/null 2>&1
  [ -s "$png" ] || { echo "observability_screenshots: no picture in $png" >&2; exit 1; }
}

# The terminal chart: the command's own output in a terminal-like page (the text is escaped).
mkdir -p "$OUT"
"$CTL" metrics "$JOB" --name loss --name accuracy --plot --width 96 --height 26 >"$WORK/plot.txt"
{
  echo '<!doctype html><meta charset="utf-8"><body style="margin:0;background:#1e1e1e">'
  echo '<pre style="margin:0;padding:14px;color:#d4d4d4;font:15px/1.25 DejaVu Sans Mono,monospace">'
  printf '$ substraxctl metrics %s --name loss --name accuracy --plot --width 96 --height 26\n' "$JOB"
  sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' "$WORK/plot.txt"
  echo '</pre>'
} >"$WORK/plot.html"
shot "file://$WORK/plot.html" "$OUT/terminal-plot.png" 920 530

# TensorBoard over the job's series.
"$CTL" metrics "$JOB" --tensorboard "$WORK/tb/$JOB" >&2
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$VENV/bin/tensorboard" --logdir "$WORK/tb" --host 127.0.0.1 --port "$PORT" \
  >"$WORK/tensorboard.log" 2>&1 &
TB_PID=$!
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/data/runs" | grep -q "$JOB" && break
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/data/runs" | grep -q "$JOB" ||
  { echo "observability_screenshots: TensorBoard did not serve the run:" >&2; cat "$WORK/tensorboard.log" >&2; exit 1; }
shot "http://127.0.0.1:$PORT/#scalars&tagFilter=^(loss|accuracy|samples_per_second)$" \
  "$OUT/tensorboard.png" 1400 900 --virtual-time-budget=30000
echo "observability_screenshots: wrote $OUT/terminal-plot.png and $OUT/tensorboard.png" >&2
