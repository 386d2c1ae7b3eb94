#!/usr/bin/env bash
# run-local.sh — N `squad serve` replicas and a balancer (HAProxy or nginx) in front of them, on one
# host, in the foreground; SIGTERM or Ctrl-C stops them all (the replicas drain, docs/server.md).
#
#   deploy/run-local.sh --replicas N --balancer haproxy|nginx --model DIR --port P
#                       [--device D] [--mode affinity|roundrobin] [--key header|body]
#                       [--host ADDR] [--squad BIN] [--upstreams HOST:PORT,...] [--check]
#                       [-- extra squad serve options]
#
# Each replica is `squad serve --port 0` (a free port, read back from its log) on loopback; the
# balancer listens on ADDR:P (default 127.0.0.1) and routes by the session key (docs/scale.md):
#   --mode affinity (default) hashes the session key with consistent hashing; roundrobin does not
#   --key header (default) hashes X-Squad-Session; body (HAProxy only) the header when present,
#     else the body's "session", "prompt_cache_key" or "user" field
#   --device D is each replica's device (cpu, cuda, cuda:N, auto); `gpus` gives replica i the GPU
#     cuda:i, and without --replicas one replica per GPU nvidia-smi lists
#   --upstreams HOST:PORT,... starts no replica: only the balancer, in front of those servers
#   --check renders the configuration, has the balancer check it, prints its path and exits
# The configuration is rendered from deploy/<balancer>.conf template into a temporary directory
# (removed at exit); the replicas' logs are there too while it runs (the script prints where).
# Lines on stdout say what started: "replica I pid PID http://HOST:PORT", "balancer NAME pid PID
# http://ADDR:P", then "ready".
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
replicas="" balancer="haproxy" model="" port="" device="" mode="affinity" key="header"
host="127.0.0.1" squad="" upstreams="" check_only=0
extra=()
die() { echo "run-local: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="${2:?}"; shift 2 ;;
    --balancer) balancer="${2:?}"; shift 2 ;;
    --model) model="${2:?}"; shift 2 ;;
    --port) port="${2:?}"; shift 2 ;;
    --device) device="${2:?}"; shift 2 ;;
    --mode) mode="${2:?}"; shift 2 ;;
    --key) key="${2:?}"; shift 2 ;;
    --host) host="${2:?}"; shift 2 ;;
    --squad) squad="${2:?}"; shift 2 ;;
    --upstreams) upstreams="${2:?}"; shift 2 ;;
    --check) check_only=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (--help lists them)" ;;
  esac
done
case "$balancer" in haproxy|nginx) ;; *) die "--balancer is haproxy or nginx" ;; esac
case "$mode" in affinity|roundrobin) ;; *) die "--mode is affinity or roundrobin" ;; esac
case "$key" in header) ;; body) [ "$balancer" = haproxy ] || die "--key body needs --balancer haproxy (nginx hashes the header only)" ;;
  *) die "--key is header or body" ;; esac
[[ "$port" =~ ^[0-9]+$ ]] || die "--port P is required"
command -v "$balancer" >/dev/null 2>&1 || die "$balancer is not installed (make deps installs it)"

if [ -z "$upstreams" ] && [ "$check_only" = 0 ]; then
  [ -n "$model" ] || die "--model DIR is required (or --upstreams)"
  if [ -z "$squad" ]; then
    if command -v squad >/dev/null 2>&1; then squad="$(command -v squad)"
    elif [ -x "$here/../build/squad" ]; then squad="$here/../build/squad"
    else die "no squad binary: pass --squad BIN"; fi
  fi
  if [ "$device" = gpus ] && [ -z "$replicas" ]; then
    replicas="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
    [ "$replicas" -gt 0 ] 2>/dev/null || die "--device gpus: nvidia-smi lists no GPU"
  fi
  [[ "$replicas" =~ ^[1-9][0-9]*$ ]] || die "--replicas N (N >= 1) is required"
fi

dir="$(mktemp -d "${TMPDIR:-/tmp}/squad-run-local.XXXXXX")" || die "no temporary directory"
pids=()
balancer_pid=""
stopped=0
stop() {
  [ "$stopped" = 1 ] && return
  stopped=1
  trap '' TERM INT
  [ -n "$balancer_pid" ] && kill -TERM "$balancer_pid" 2>/dev/null
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [ -n "$balancer_pid" ] && wait "$balancer_pid" 2>/dev/null
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap 'stop; exit 0' TERM INT
trap 'stop' EXIT

# the replicas: squad picks a free port itself (--port 0) and logs it
if [ -z "$upstreams" ] && [ "$check_only" = 0 ]; then
  for ((i = 0; i < replicas; i++)); do
    dev=()
    if [ "$device" = gpus ]; then dev=(--device "cuda:$i")
    elif [ -n "$device" ]; then dev=(--device "$device"); fi
    "$squad" serve --model "$model" --host 127.0.0.1 --port 0 "${dev[@]}" "${extra[@]}" >"$dir/replica$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < replicas; i++)); do
    addr=""
    for ((t = 0; t < 600; t++)); do  # up to 60 s for the model to load
      addr="$(grep -o -m1 'listening on http://[^ ]*' "$dir/replica$i.log" 2>/dev/null | sed 's|.*http://||')"
      [ -n "$addr" ] && break
      kill -0 "${pids[$i]}" 2>/dev/null || { cat "$dir/replica$i.log" >&2; die "replica $i exited"; }
      sleep 0.1
    done
    [ -n "$addr" ] || die "replica $i did not start listening (log: $dir/replica$i.log)"
    upstreams="${upstreams:+$upstreams,}$addr"
    echo "replica $i pid ${pids[$i]} http://$addr log $dir/replica$i.log"
  done
fi
[ -n "$upstreams" ] || upstreams="127.0.0.1:1"  # --check without servers: a placeholder to check

# the configuration: the template with its placeholders replaced
servers="" rules="" n=0
IFS=',' read -r -a ups <<<"$upstreams"
for u in "${ups[@]}"; do
  if [ "$balancer" = haproxy ]; then servers+="    server $u $u"$'\n'
  else servers+="        server $u max_fails=1 fail_timeout=@FAIL_TIMEOUT@;"$'\n'; fi
  n=$((n + 1))
done
if [ "$balancer" = haproxy ]; then
  if [ "$mode" = roundrobin ]; then rules="    balance roundrobin"
  elif [ "$key" = header ]; then rules="    balance hash req.hdr(X-Squad-Session)"
  else
    rules="    http-request set-var(txn.squad_session) req.hdr(X-Squad-Session)
    http-request set-var(txn.squad_session) req.body,json_query('\$.session') if !{ var(txn.squad_session) -m found }
    http-request set-var(txn.squad_session) req.body,json_query('\$.prompt_cache_key') if !{ var(txn.squad_session) -m found }
    http-request set-var(txn.squad_session) req.body,json_query('\$.user') if !{ var(txn.squad_session) -m found }
    balance hash var(txn.squad_session)"
  fi
  conf="$dir/haproxy.cfg"
else
  if [ "$mode" = roundrobin ]; then rules="        # round robin (nginx's default)"
  else rules="        hash \$http_x_squad_session consistent;"; fi
  conf="$dir/nginx.conf"
  mkdir -p "$dir/client_body" "$dir/proxy" "$dir/fastcgi" "$dir/uwsgi" "$dir/scgi"
fi
case "$host" in *:*) bind="[$host]:$port" ;; *) bind="$host:$port" ;; esac
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    @SERVERS@) printf '%s' "$servers" ;;
    @BALANCE_RULES@) printf '%s\n' "$rules" ;;
    *) printf '%s\n' "$line" ;;
  esac
done <"$here/$balancer.$([ "$balancer" = haproxy ] && echo cfg || echo conf).in" |
  sed -e "s|@BIND@|$bind|g" -e "s|@DIR@|$dir|g" -e "s|@CHECK_INTER@|1s|g" -e "s|@FAIL_TIMEOUT@|5s|g" >"$conf"

if [ "$balancer" = haproxy ]; then check=(haproxy -c -q -f "$conf"); run=(haproxy -db -f "$conf")
else check=(nginx -t -q -p "$dir" -c "$conf"); run=(nginx -p "$dir" -c "$conf"); fi
"${check[@]}" >"$dir/check.log" 2>&1 || { cat "$dir/check.log" >&2; die "$balancer rejected $conf"; }
if [ "$check_only" = 1 ]; then
  cp "$conf" "${TMPDIR:-/tmp}/squad-$balancer-checked.conf"
  echo "config ${TMPDIR:-/tmp}/squad-$balancer-checked.conf"
  exit 0
fi

# wait for every replica's /ready (the balancer's health checks would hold traffic back anyway,
# but "ready" should mean the whole set serves)
if [ "${#pids[@]}" -gt 0 ]; then
  for u in "${ups[@]}"; do
    for ((t = 0; t < 1200; t++)); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$u/ready")" = 200 ] && break
      sleep 0.1
    done
  done
fi
"${run[@]}" >"$dir/$balancer.log" 2>&1 &
balancer_pid=$!
for ((t = 0; t < 100; t++)); do
  curl -s -o /dev/null "http://$bind/health" && break
  kill -0 "$balancer_pid" 2>/dev/null || { cat "$dir/$balancer.log" >&2; die "$balancer exited"; }
  sleep 0.1
done
echo "balancer $balancer pid $balancer_pid http://$bind log $dir/$balancer.log"
echo "ready"
wait "$balancer_pid"
echo "run-local: $balancer exited ($?)" >&2
