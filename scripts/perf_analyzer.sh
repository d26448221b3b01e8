#!/usr/bin/env bash
# Triton's perf_analyzer, unchanged, against the server's KServe v2 endpoint
# (inference.GRPCInferenceService). The PyPI `perf-analyzer` wheels are built for glibc >= 2.38
# (manylinux_2_38) and a newer libstdc++ than Debian 12 has, so the binary runs in a Debian trixie
# root made with debootstrap (as scripts/container_base.sh makes the bookworm container base),
# with the wheel in a venv inside it. The root shares the host's network, so perf_analyzer reaches
# a server listening on the host's loopback. Needs root.
#
#   scripts/perf_analyzer.sh setup                      # build the root once; check that perf_analyzer runs
#   scripts/perf_analyzer.sh run [ADDRESS [MODEL]] [-- EXTRA_PERF_ANALYZER_FLAGS...]
#   scripts/perf_analyzer.sh exec [PERF_ANALYZER_ARGS...]   # perf_analyzer as is, inside the root
#   scripts/perf_analyzer.sh bench [MODEL_DIR]          # `make perf-analyzer`: see below
#
# `run` (defaults: ADDRESS 127.0.0.1:50051, MODEL de-en) sends single-sentence BYTES requests
# (`--shape TEXT:1`, `--input-data` made of German test sentences), with no request parameters
# (the server's default beam applies), at each concurrency level, and prints perf_analyzer's CSV
# for all levels. Environment:
#   PA_ROOT=/var/tmp/mtserve-trixie   where the root lives (built once; a lock serialises builders)
#   PA_VERSION=2.60.0                 the perf-analyzer wheel (changing it reinstalls only the wheel)
#   DEBIAN_MIRROR=http://deb.debian.org/debian
#   CONCURRENCY=1,2,4,8               a list (one perf_analyzer run per level) or a range a:b[:step]
#   PA_WINDOW_MS=5000                 time window of one measurement (--measurement-interval)
#   PA_STABILITY=25 PA_MAX_TRIALS=10  stable: the last 3 windows' throughputs and mean latencies each within
#                                     a factor 1 + PA_STABILITY/100; give up after PA_MAX_TRIALS windows
#   PA_SENTENCES=100                  sentences in the input data (the first ones of the test set)
#   PA_DATA=$MTSERVE_DATA_DIR/test_2016_flickr.de.gz (default ../shared/data/multi30k/...)
#   PA_CSV=FILE                       also write the merged CSV here
#   PA_LOG_DIR=DIR                    keep each run's perf_analyzer output and CSV there (cN-N.log/.csv)
#
# `bench` (default MODEL_DIR models/de-en/1, its export made beforehand) starts `mtserve serve` with
# its default settings (metrics off; extra arguments after MODEL_DIR go to it) on a free loopback
# port, waits for SERVING, and at each level of CONCURRENCY (a list here) runs perf_analyzer against
# its KServe model (the manifest's name), then right after it the project's load generator
# (benchmarks/online.py's run_level: single-sentence Translate calls, beam 0 = the server's default,
# as perf_analyzer's requests carry no parameters) on the same server and sentences for
# PA_ONLINE_S=15 seconds; then it stops the server and prints both tables in Markdown.
# PY=.venv/bin/python runs the server and the load generator; PA_OUT=DIR keeps the CSVs, the
# online JSON, tables.md and the server log (default: a temporary directory, printed at the end).
#
# Mounts (/proc, and /dev bound) live in a private mount namespace (unshare --mount) that ends
# with the command: nothing stays mounted on the host, even after a kill -9.
# Exit status: perf_analyzer's (99 when it cannot talk to the server), 2 for a usage or set-up
# error, 3 when the root cannot be built here (not root, debootstrap failed).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PA_ROOT=${PA_ROOT:-/var/tmp/mtserve-trixie}
PA_VERSION=${PA_VERSION:-2.60.0}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
VENV=/opt/perf-analyzer  # inside the root
BIN=/usr/local/bin/perf_analyzer  # inside the root: a link to the wheel's binary
STAMP=.mtserve-perf-analyzer

die() {
  echo "perf_analyzer.sh: $*" >&2
  exit 2
}
log() { echo "perf_analyzer.sh: $*" >&2; }

# Run a command in the root: a private mount namespace with /proc and /dev, host network.
in_root() {
  local root=$1
  shift
  # shellcheck disable=SC2016  # expanded by the inner shell
  unshare --mount --propagation private -- /bin/sh -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    exec chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"
  ' in_root "$root" "$@"
}

# The venv and the wheel in `root`; the link to the binary; `perf_analyzer --help` runs.
install_wheel() {
  local root=$1
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  # pip inside uses the host's CA bundle when there is one (a TLS-intercepting proxy's CA is in it).
  local cert=()
  if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/host-ca-certificates.crt"
    cert=(--cert /etc/ssl/host-ca-certificates.crt)
  fi
  local index=()
  [[ -n ${PIP_INDEX_URL:-} ]] && index=(--index-url "$PIP_INDEX_URL")
  [[ -x $root$VENV/bin/python ]] || in_root "$root" python3 -m venv "$VENV"
  in_root "$root" "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
    "${cert[@]}" "${index[@]}" "perf-analyzer==$PA_VERSION"
  # The wheel's `perf_analyzer` console script runs the binary with subprocess.run and always exits
  # 0; link the binary itself so that its exit status comes through.
  local bins=("$root$VENV"/lib/python3*/site-packages/perf_analyzer/bin/perf_analyzer)
  [[ -x ${bins[0]} ]] || die "perf-analyzer==$PA_VERSION installed no binary (the placeholder 0.1.0?)"
  ln -sfn "${bins[0]#"$root"}" "$root$BIN"
  # It has no --help: without arguments it prints its usage (and exits 99).
  local usage
  usage=$(in_root "$root" "$BIN" 2>&1 || true)
  if ! grep -q -- '--concurrency-range' <<<"$usage"; then
    tail -5 <<<"$usage" >&2
    die "perf_analyzer does not run in $root"
  fi
  echo "$PA_VERSION" >"$root/$STAMP"
}

setup() {
  [[ $(id -u) == 0 ]] || { log "needs root (debootstrap, chroot, mount)"; exit 3; }
  if [[ $(cat "$PA_ROOT/$STAMP" 2>/dev/null) == "$PA_VERSION" ]]; then
    return 0
  fi
  mkdir -p "$(dirname "$PA_ROOT")"
  exec 9>"$PA_ROOT.lock"
  flock 9  # another setup may be building it: wait for it
  if [[ $(cat "$PA_ROOT/$STAMP" 2>/dev/null) == "$PA_VERSION" ]]; then
    return 0
  fi
  if [[ -d $PA_ROOT ]]; then  # a finished root with another wheel version
    log "installing perf-analyzer==$PA_VERSION in $PA_ROOT"
    install_wheel "$PA_ROOT"
    return 0
  fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
  fi
  [[ -e /usr/share/debootstrap/scripts/$SUITE ]] || die "this debootstrap does not know $SUITE"
  # Built beside its final place and renamed when complete: an interrupted build leaves no root
  # that looks finished (the next setup starts that one again).
  local partial=$PA_ROOT.partial
  rm -rf --one-file-system "$partial"
  local t0=$SECONDS
  log "debootstrap $SUITE into $partial"
  # Exit status 3: debootstrap itself failed (no mirror, no privileges): the environment, not this script.
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,libssl3t64,zlib1g \
    "$SUITE" "$partial" "$MIRROR" >&2 || { log "debootstrap failed (see above)"; exit 3; }
  rm -rf "$partial"/var/lib/apt/lists/* "$partial"/var/cache/apt/archives/*.deb
  log "installing perf-analyzer==$PA_VERSION"
  install_wheel "$partial"
  mv "$partial" "$PA_ROOT"
  log "root ready in $((SECONDS - t0)) s: $PA_ROOT ($(du -sh "$PA_ROOT" | cut -f1))"
}

# German sentences as perf_analyzer input data for the BYTES input TEXT, shape [1].
input_data() {
  local data=${PA_DATA:-${MTSERVE_DATA_DIR:-$REPO/../shared/data/multi30k}/test_2016_flickr.de.gz} n=${PA_SENTENCES:-100}
  [[ -r $data ]] || die "no test sentences at $data (set PA_DATA)"
  python3 - "$data" "$n" <<'PY'
import gzip, json, sys
path, n = sys.argv[1], int(sys.argv[2])
with gzip.open(path, "rt", encoding="utf-8") as f:
    texts = [line.strip() for line in f if line.strip()][:n]
# No "shape": perf_analyzer takes it from the model (ModelMetadata's shape less the batch dimension
# when ModelConfig has max_batch_size > 0, else --shape TEXT:1); one string per request.
print(json.dumps({"data": [{"TEXT": {"content": [t]}} for t in texts]}, ensure_ascii=False))
PY
}

run() {
  local address=127.0.0.1:50051 model=de-en extra=()
  if [[ $# -gt 0 && $1 != -- ]]; then address=$1; shift; fi
  if [[ $# -gt 0 && $1 != -- ]]; then model=$1; shift; fi
  if [[ $# -gt 0 && $1 == -- ]]; then shift; extra=("$@"); fi
  setup
  local work
  work=$(mktemp -d "$PA_ROOT/tmp/mtserve-pa.XXXXXX")
  # shellcheck disable=SC2064  # expanded now: `work` is local
  trap "rm -rf '$work'" EXIT
  input_data >"$work/input.json"
  local inside=${work#"$PA_ROOT"}
  local levels=() conc=${CONCURRENCY:-1,2,4,8}
  if [[ $conc == *:* ]]; then levels=("$conc"); else IFS=, read -ra levels <<<"$conc"; fi
  local rc=0 level tag
  for level in "${levels[@]}"; do
    [[ $level == *:* ]] || level=$level:$level
    tag=${level//:/-}
    log "concurrency $level against $address, model $model"
    set +e
    in_root "$PA_ROOT" "$BIN" -i grpc -u "$address" -m "$model" --shape TEXT:1 \
      --input-data "$inside/input.json" --concurrency-range "$level" \
      --measurement-mode time_windows --measurement-interval "${PA_WINDOW_MS:-5000}" \
      --stability-percentage "${PA_STABILITY:-25}" --max-trials "${PA_MAX_TRIALS:-10}" \
      -f "$inside/c$tag.csv" "${extra[@]}" 2>&1 | tee "$work/c$tag.log" >&2
    local status=${PIPESTATUS[0]}
    set -e
    if ((status != 0)); then
      log "perf_analyzer exited $status at concurrency $level"
      rc=$status
    fi
  done
  if [[ -n ${PA_LOG_DIR:-} ]]; then
    mkdir -p "$PA_LOG_DIR"
    cp "$work"/c*.log "$work"/c*.csv "$PA_LOG_DIR"/ 2>/dev/null || true
  fi
  # One CSV: the first file's header, then every file's rows (perf_analyzer writes the
  # per-level table first, then, after a blank line, the server-side metrics if any).
  local merged=$work/all.csv first=1 f
  : >"$merged"
  for f in "$work"/c*.csv; do
    [[ -e $f ]] || continue
    awk -v first=$first 'NR == 1 { if (first) print; next } /^$/ { exit } { print }' "$f" >>"$merged"
    first=0
  done
  [[ -n ${PA_CSV:-} ]] && cp "$merged" "$PA_CSV"
  cat "$merged"
  return "$rc"
}

# `mtserve serve` on a free loopback port; at each level perf_analyzer, then benchmarks/online.py.
bench() {
  local model_dir=${1:-$REPO/models/de-en/1}
  [[ $# -gt 0 ]] && shift
  local py=${PY:-$REPO/.venv/bin/python}
  [[ -x $py ]] || die "no Python at $py (make install, or set PY)"
  [[ $py == */* ]] && py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # absolute (the server runs in REPO)
  setup
  local out=${PA_OUT:-}
  [[ -n $out ]] || out=$(mktemp -d /tmp/mtserve-perf-analyzer.XXXXXX)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  rm -rf "$out/levels" "$out"/online-c*.json "$out"/perf_analyzer*.csv
  local data=${PA_DATA:-${MTSERVE_DATA_DIR:-$REPO/../shared/data/multi30k}/test_2016_flickr.de.gz}
  local model port address
  model=$(cd "$REPO" && "$py" -c 'import sys; from contract.manifest import load_manifest; print(load_manifest(sys.argv[1], verify_checksums=False).name)' "$model_dir/onnx") \
    || die "$model_dir/onnx holds no export this version can serve (make export MODEL=$model_dir)"
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  address=127.0.0.1:$port
  log "mtserve serve $model_dir on $address (log: $out/server.log)"
  (cd "$REPO" && exec "$py" -m mtserve serve --model-dir "$model_dir" --address "$address" --metrics-port 0 \
    --log-level warning "$@") >"$out/server.log" 2>&1 &
  local server=$!
  # shellcheck disable=SC2064  # the pid is known now
  trap "kill -TERM $server 2>/dev/null; wait $server 2>/dev/null" EXIT
  local waited=0
  until (cd "$REPO" && "$py" -m service.client.healthcheck "$address") >/dev/null 2>&1; do
    kill -0 $server 2>/dev/null || { tail -20 "$out/server.log" >&2; die "the server exited before SERVING"; }
    ((waited++ < 600)) || die "the server is not SERVING after 120 s"
    sleep 0.2
  done
  local levels=() conc=${CONCURRENCY:-1,2,4,8} c rc=0
  [[ $conc != *:* ]] || die "bench takes a list of levels (CONCURRENCY=1,2,4,8), not a range"
  IFS=, read -ra levels <<<"$conc"
  # Level by level, one tool right after the other, so that both see the same machine (other work
  # on it shifts the figures over minutes).
  for c in "${levels[@]}"; do
    # `run` sets its own EXIT trap (its work directory): a subshell keeps ours.
    (CONCURRENCY=$c PA_CSV=$out/perf_analyzer-c$c.csv PA_LOG_DIR=$out/levels run "$address" "$model" >/dev/null) || rc=$?
    log "benchmarks/online.py run_level at concurrency $c for ${PA_ONLINE_S:-15} s"
    (cd "$REPO" && "$py" - "$address" "$c" "${PA_SENTENCES:-100}" "${PA_ONLINE_S:-15}" "$data" "$out/online-c$c.json") <<'PY' || rc=$?
import gzip, json, sys
from pathlib import Path

from benchmarks.online import run_level

address, c, n, seconds, data, out = sys.argv[1:]
def lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][: int(n)]
# The same sentences as perf_analyzer's input data; beam 0: the server's default, as perf_analyzer's
# requests carry no parameters.
row = run_level(address, lines(data), lines(data.replace(".de.gz", ".en.gz")), int(c), 10**6, 0, duration=float(seconds))
Path(out).write_text(json.dumps(row) + "\n")
print(f"  online c={c}: {row['sentences_per_s']} sent/s, p50 {row['p50_ms']} ms, errors {row['errors'] or 0}", file=sys.stderr)
PY
  done
  kill -TERM $server 2>/dev/null || true
  wait $server 2>/dev/null || true
  trap - EXIT
  (cd "$REPO" && "$py" - "$out" "${levels[@]}") <<'PY' || rc=$?
import csv, json, sys
from pathlib import Path

out, levels = Path(sys.argv[1]), [int(c) for c in sys.argv[2:]]
ms = lambda us: f"{int(us) / 1000:.1f}"
# perf_analyzer's CSV splits the mean latency into parts (client send, network + server send/recv,
# server queue and compute, client receive): their sum is the mean.
PARTS = ["Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
         "Server Compute Output", "Client Recv"]
COMPUTE = PARTS[3:6]
pa = ["perf_analyzer (KServe `ModelInfer`, one sentence per request, sync mode):", "",
      "| concurrency | infer/s | p50 ms | p90 ms | p95 ms | p99 ms | mean ms | server queue ms | server compute ms |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
on = ["benchmarks/online.py (`Translate`, one sentence per request, beam 0 = server default):", "",
      "| concurrency | requests | errors | sent/s | p50 ms | p95 ms | p99 ms | mean ms | BLEU |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
merged = []
for c in levels:
    f = out / f"perf_analyzer-c{c}.csv"
    rows = list(csv.DictReader(f.open())) if f.exists() else []
    if not rows:
        pa.append(f"| {c} | no result: unstable or failed (levels/c{c}-{c}.log) | | | | | | | |")
    for r in rows:
        merged.append(r)
        server = all(r.get(k) not in (None, "") for k in PARTS)
        mean = ms(sum(int(r[k]) for k in PARTS)) if server else ""
        queue = ms(r["Server Queue"]) if server else ""
        compute = ms(sum(int(r[k]) for k in COMPUTE)) if server else ""
        pa.append(f"| {r['Concurrency']} | {float(r['Inferences/Second']):.1f} | {ms(r['p50 latency'])} | {ms(r['p90 latency'])} "
                  f"| {ms(r['p95 latency'])} | {ms(r['p99 latency'])} | {mean} | {queue} | {compute} |")
    f = out / f"online-c{c}.json"
    if f.exists():
        r = json.loads(f.read_text())
        on.append(f"| {c} | {r['requests']} | {sum(r['errors'].values())} | {r['sentences_per_s']} | {r['p50_ms']} "
                  f"| {r['p95_ms']} | {r['p99_ms']} | {r['mean_ms']} | {r['bleu']} |")
    else:
        on.append(f"| {c} | failed | | | | | | | |")
if merged:
    with (out / "perf_analyzer.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(merged[0]))
        w.writeheader()
        w.writerows(merged)
md = "\n".join(pa + [""] + on) + "\n"
(out / "tables.md").write_text(md)
print(md)
PY
  log "results in $out"
  return "$rc"
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  setup)
    setup
    echo "$PA_ROOT: perf_analyzer $(cat "$PA_ROOT/$STAMP") (Debian $(cat "$PA_ROOT/etc/debian_version"))"
    ;;
  run) run "$@" ;;
  bench) bench "$@" ;;
  exec)
    setup
    in_root "$PA_ROOT" "$BIN" "$@"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
