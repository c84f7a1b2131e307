#!/usr/bin/env bash
# A multi-node cluster on one machine: N network namespaces ("nodes") joined
# by a bridge, each node's link shaped with tc (tbf, plus netem delay), so
# Open MPI's TCP transport between nodes moves real bytes over rate-limited
# links. Root only; iproute2 (`ip`, `tc`).
#
#   up    --nodes N --rate RATE [--delay-ms D] [--prefix P] [--subnet 10.88.K]
#   down  [--prefix P]
#   run   [--prefix P] --ranks-per-node K [--cpus-per-node C] [--timeout S] -- PROG ARGS...
#   stats [--prefix P] [--json]
#   cut   NODE [down|loss] [--prefix P]
#   heal  NODE [--prefix P]
#   show  [--prefix P]
#
# Layout for prefix P (default `qsn`) and subnet S (default 10.88.0):
#   bridge  Pbr in the root namespace, address S.1/24 (mpirun and PMIx listen there)
#   node i  namespace Pi, interface Pn<i> with address S.(i+2)/24 and `lo` up;
#           its peer Ph<i> on the bridge.
# Both ends of each node's link are shaped (the node's egress inside its
# namespace, the bridge-side veth's egress towards the node), so a node's
# upload and download are each limited to RATE, with D ms added each way.
# Under the rate, packets under 256 bytes (ACKs, control messages) leave
# before queued bulk data, as a host's fair queueing lets them
# (NETCLUSTER_FIFO=1 at `up`: one FIFO, as before 2026-11-30).
# Ranks of one node talk over the namespace's loopback (never the link);
# ranks of different nodes only over the shaped links. `run --cpus-per-node
# C` pins node i's ranks to CPUs [i·C, (i+1)·C) (taskset), so each emulated
# node computes on cores of its own, as a real node does; without it every
# rank may run on every core.
#
# State lives in /run/qsync-netcluster/P.env; `down` also finds leftovers by
# name, so it is idempotent and safe after a crash. `up` tears down what it
# built if any step fails. Exit status: 0 ok, 1 a command failed, 2 usage or
# environment (not root, iproute2 missing, network namespaces unavailable).
set -Eeuo pipefail

STATE_DIR=/run/qsync-netcluster
PREFIX=qsn
SUBNET=10.88.0

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() { # die CODE MESSAGE
  echo "netcluster: $2" >&2
  exit "$1"
}

need_env() {
  [ "$(id -u)" -eq 0 ] || die 2 "must run as root (network namespaces, veths and tc need CAP_NET_ADMIN)"
  command -v ip >/dev/null || die 2 "iproute2's \`ip\` is not installed (scripts/setup.sh installs iproute2)"
  command -v tc >/dev/null || die 2 "iproute2's \`tc\` is not installed (scripts/setup.sh installs iproute2)"
}

check_prefix() {
  [[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,7}$ ]] \
    || die 2 "--prefix '$PREFIX': 1-8 lowercase letters/digits starting with a letter (interface names are at most 15 characters)"
}

check_subnet() {
  [[ "$SUBNET" =~ ^10\.([0-9]{1,3})\.([0-9]{1,3})$ ]] && ((BASH_REMATCH[1] < 256 && BASH_REMATCH[2] < 256)) \
    || die 2 "--subnet '$SUBNET': the first three octets of a private 10.x.y.0/24 network, e.g. 10.88.0"
}

state_file() { echo "$STATE_DIR/$PREFIX.env"; }

load_state() {
  local f
  f=$(state_file)
  [ -r "$f" ] || die 1 "no cluster with prefix '$PREFIX' (no $f): run \`$0 up\` first"
  # shellcheck disable=SC1090
  source "$f"
}

ns() { echo "$PREFIX$1"; }
node_if() { echo "${PREFIX}n$1"; }
host_if() { echo "${PREFIX}h$1"; }
bridge() { echo "${PREFIX}br"; }

# Rate in bits per second from tc's notation (1gbit, 200mbit, 500kbit, 1000000bit).
rate_bps() {
  local r=${1,,}
  [[ "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die 2 "--rate '$1': expected e.g. 200mbit, 1gbit, 10gbit"
  local n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in
    bit) echo "$n" ;;
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
  esac
}

# shape DEV [netns]: the link's qdisc (tbf alone, or netem delay with tbf below).
shape() {
  local dev=$1 where=()
  [ $# -ge 2 ] && where=(ip netns exec "$2")
  local bps burst peak=()
  bps=$(rate_bps "$RATE")
  # A bucket of 1 ms at the rate, at least 256 KiB: GSO hands veths 64 KiB
  # super-packets, and a bucket smaller than a few of them throttles below
  # the rate.
  burst=$((bps / 8 / 1000))
  ((burst < 262144)) && burst=262144
  "${where[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
  if ((bps <= 2500000000)); then
    # A NIC never sends faster than its rate, but a full bucket leaves at
    # the veth's speed: after an idle moment, 256 KiB crossed a 200 Mbit/s
    # link in 1.2 ms instead of 10.5, and a synchronization of a few
    # hundred KiB moves about that much. A second bucket, filled 5% above
    # the rate (tbf's peak rate), lets at most its size through at once:
    # about 0.3 ms of the link (a power of two from 8 to 64 KiB: 8 KiB at
    # 200 Mbit/s, 32 KiB at 1 Gbit/s, 64 KiB from 2 Gbit/s). With 64 KiB
    # at every rate, 64 KiB crossed a 200 Mbit/s link after an idle moment
    # in 0.29 of its link time and 128 KiB in 0.57; with 8 KiB, 0.89 and
    # 0.93 (`scripts/validate/link_burst.py`). It needs super-packets of at
    # most half of it (the veth's GSO size): a bucket of one 64 KiB
    # super-packet throttled two streams each way on 1 Gbit/s to 0.66 of
    # the rate, and super-packets of 4 KiB a 1 Gbit/s link to 0.65 of it
    # (16 KiB carry it). Above 2.5 Gbit/s the peak bucket cost 10-15% of
    # what this machine's TCP reaches, and the 1 ms bucket stays. Where the
    # veth's GSO size cannot be set, a peak bucket of two 64 KiB
    # super-packets (128 KiB at once after idle) still carries the rate.
    # The price is CPU, charged to the process whose sockets move the
    # bytes: a stream both ways cost its core 2.2 ns a byte at 1 Gbit/s
    # (16 KiB segments) and 12-15 at 200 Mbit/s (4 KiB), against 0.4-0.5
    # at 10 and 40 Gbit/s (scripts/validate/link_cpu.py); a plain tbf at
    # 1 Gbit/s cost 1.5 with 64 KiB segments and 3.1 with 16 KiB.
    local want=$((bps / 8 * 3 / 10000)) peak_bytes=8192 peak_mtu=131072
    while ((peak_bytes * 2 <= want && peak_bytes < 65536)); do peak_bytes=$((peak_bytes * 2)); done
    "${where[@]}" ip link set dev "$dev" gso_max_size "$((peak_bytes / 2))" 2>/dev/null && peak_mtu=$peak_bytes
    peak=(peakrate "$((bps / 100 * 105))bit" mtu "$peak_mtu")
  fi
  local tbf=1:
  if [ "${DELAY_MS:-0}" != 0 ]; then
    # netem holds packets for the delay; tbf below it sets the rate. The
    # netem queue must hold a full bandwidth-delay product.
    local limit=$(((bps / 8 * DELAY_MS / 1000) / 1500 + 1000))
    "${where[@]}" tc qdisc add dev "$dev" root handle 1: netem delay "${DELAY_MS}ms" limit "$limit"
    "${where[@]}" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$RATE" burst "$burst" "${peak[@]}" latency 50ms
    tbf=10:
  else
    "${where[@]}" tc qdisc add dev "$dev" root handle 1: tbf rate "$RATE" burst "$burst" "${peak[@]}" latency 50ms
  fi
  [ "${NETCLUSTER_FIFO:-0}" = 1 ] || small_first "$dev" "$tbf" "$bps" "$burst" "${where[@]}"
}

# small_first DEV TBF BPS BURST [netns command...]: the queue under the
# rate limiter TBF serves packets under 256 bytes (ACKs, gloo's and Open
# MPI's control messages) before bulk data. tbf alone is one FIFO of up to
# 50 ms: an ACK (or a "ready to receive") waits behind every other flow's
# data, so a flow's round trip grows to the queue's depth (15-18 ms
# measured with `ss` at 200 Mbit/s, 4 flows each way) and a flow left alone
# at the end of an exchange, its window sized while it shared the link,
# sends at 0.3-0.45 of the rate. A host's default queue (fq_codel) serves a
# sparse flow's packets first and keeps a standing queue near 5 ms; this
# kernel has neither fq_codel nor sfq, only htb, fifos and the u32
# classifier. Measured (8 MiB a rank, 4 ranks, receives posted first, 8
# runs): 345 ms median against 359 with one FIFO; the rate allows 351 at
# the TCP payload share.
small_first() {
  local dev=$1 tbf=$2 bps=$3 burst=$4
  shift 4
  local where=("$@") fast=$((bps * 4))
  "${where[@]}" tc qdisc add dev "$dev" parent "${tbf%:}:1" handle 2: htb default 20
  "${where[@]}" tc class add dev "$dev" parent 2: classid 2:10 htb rate "${fast}bit" prio 0 quantum 60000
  "${where[@]}" tc class add dev "$dev" parent 2: classid 2:20 htb rate "${fast}bit" prio 1 quantum 60000
  "${where[@]}" tc qdisc add dev "$dev" parent 2:10 handle 210: pfifo limit 1000
  "${where[@]}" tc qdisc add dev "$dev" parent 2:20 handle 220: bfifo limit $((bps / 8 / 20 + burst))
  "${where[@]}" tc filter add dev "$dev" parent 2: protocol ip prio 1 u32 \
    match u16 0x0000 0xff00 at 2 flowid 2:10
}

# Whether this kernel has the netem qdisc (some minimal kernels do not).
have_netem() {
  local probe="qnx$$" ok=1
  ip link add "$probe" type veth peer name "${probe}p" 2>/dev/null || return 1
  tc qdisc add dev "$probe" root netem delay 1ms 2>/dev/null && ok=0
  ip link del "$probe" 2>/dev/null || true
  return $ok
}

cmd_down() {
  need_env
  check_prefix
  local n removed=0
  # Namespaces named P<digits>; deleting one deletes the veth inside it and its peer.
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" || true); do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -TERM 2>/dev/null || true
    ip netns del "$n" 2>/dev/null && removed=$((removed + 1)) || true
  done
  # Bridge-side veths whose namespace is already gone, then the bridge.
  for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${PREFIX}h[0-9]+\$" || true); do
    ip link del "$n" 2>/dev/null || true
  done
  if ip link show "$(bridge)" >/dev/null 2>&1; then
    ip link del "$(bridge)"
  fi
  rm -f "$(state_file)"
  echo "netcluster: '$PREFIX' down ($removed namespaces removed)" >&2
}

cmd_up() {
  NODES='' RATE='' DELAY_MS=0
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) NODES=${2:?}; shift 2 ;;
      --rate) RATE=${2:?}; shift 2 ;;
      --delay-ms) DELAY_MS=${2:?}; shift 2 ;;
      --prefix) PREFIX=${2:?}; shift 2 ;;
      --subnet) SUBNET=${2:?}; shift 2 ;;
      *) echo "netcluster up: unknown argument '$1'" >&2; usage ;;
    esac
  done
  need_env
  check_prefix
  check_subnet
  [[ "$NODES" =~ ^[0-9]+$ ]] && ((NODES >= 1 && NODES <= 250)) || die 2 "--nodes: a number from 1 to 250"
  [ -n "$RATE" ] || die 2 "--rate is required (e.g. 1gbit)"
  rate_bps "$RATE" >/dev/null
  [[ "$DELAY_MS" =~ ^[0-9]+$ ]] || die 2 "--delay-ms: a whole number of milliseconds"
  if [ -e "$(state_file)" ] || ip link show "$(bridge)" >/dev/null 2>&1 || ip netns list | grep -qE "^${PREFIX}[0-9]+( |\$)"; then
    die 1 "a cluster with prefix '$PREFIX' exists: \`$0 down --prefix $PREFIX\` first"
  fi
  if ip -4 -o addr show | awk '{print $4}' | grep -q "^${SUBNET//./\\.}\."; then
    die 1 "subnet $SUBNET.0/24 is already in use by an interface of this machine: pick another --subnet"
  fi
  if [ "$DELAY_MS" != 0 ] && ! have_netem; then
    die 2 "--delay-ms needs tc's netem qdisc, which this kernel does not have (\`tc qdisc add ... netem\`: unknown qdisc kind); run without --delay-ms"
  fi
  if ! ip netns add "${PREFIX}probe" 2>/tmp/netcluster-probe.$$; then
    local why
    why=$(cat /tmp/netcluster-probe.$$); rm -f /tmp/netcluster-probe.$$
    die 2 "network namespaces are unavailable here (ip netns add: $why)"
  fi
  rm -f /tmp/netcluster-probe.$$
  ip netns del "${PREFIX}probe"

  # From here on, any failure removes what was built.
  trap 'rc=$?; echo "netcluster: up failed (status $rc); removing what was built" >&2; cmd_down >/dev/null 2>&1 || true; exit 1' ERR
  local br i
  br=$(bridge)
  ip link add "$br" type bridge
  sysctl -qw "net.ipv6.conf.$br.disable_ipv6=1" 2>/dev/null || true
  ip addr add "$SUBNET.1/24" dev "$br"
  ip link set "$br" up
  for ((i = 0; i < NODES; i++)); do
    local n h v
    n=$(ns "$i") h=$(host_if "$i") v=$(node_if "$i")
    ip netns add "$n"
    ip link add "$h" type veth peer name "$v"
    ip link set "$v" netns "$n"
    ip link set "$h" master "$br"
    ip link set "$h" up
    ip netns exec "$n" ip link set lo up
    # No IPv6 on the links: its neighbour discovery would add traffic the
    # counters then report.
    ip netns exec "$n" sysctl -qw "net.ipv6.conf.$v.disable_ipv6=1" 2>/dev/null || true
    sysctl -qw "net.ipv6.conf.$h.disable_ipv6=1" 2>/dev/null || true
    ip netns exec "$n" ip addr add "$SUBNET.$((i + 2))/24" dev "$v"
    ip netns exec "$n" ip link set "$v" up
    shape "$v" "$n"
    shape "$h"
  done
  mkdir -p "$STATE_DIR"
  cat > "$(state_file)" <<EOF
NODES=$NODES
RATE=$RATE
DELAY_MS=$DELAY_MS
SUBNET=$SUBNET
EOF
  trap - ERR
  echo "netcluster: '$PREFIX' up: $NODES nodes ($(ns 0)..$(ns $((NODES - 1)))) on $SUBNET.0/24, $RATE each way, ${DELAY_MS} ms delay each way" >&2
}

cmd_run() {
  local k='' limit='' cpus=''
  while [ $# -gt 0 ]; do
    case $1 in
      --ranks-per-node) k=${2:?}; shift 2 ;;
      --cpus-per-node) cpus=${2:?}; shift 2 ;;
      --prefix) PREFIX=${2:?}; shift 2 ;;
      --timeout) limit=${2:?}; shift 2 ;;
      --) shift; break ;;
      *) echo "netcluster run: unknown argument '$1' (the program follows --)" >&2; usage ;;
    esac
  done
  [ $# -ge 1 ] || die 2 "run: the program to launch follows \`--\`"
  [[ "$k" =~ ^[0-9]+$ ]] && ((k >= 1)) || die 2 "--ranks-per-node: a positive number"
  need_env
  check_prefix
  load_state
  command -v mpirun >/dev/null || die 2 "mpirun is not installed (scripts/setup.sh installs Open MPI)"
  local net="$SUBNET.0/24" apps=() i pin=()
  if [ -n "$cpus" ]; then
    [[ "$cpus" =~ ^[0-9]+$ ]] && ((cpus >= 1)) || die 2 "--cpus-per-node: a positive number"
    command -v taskset >/dev/null || die 2 "--cpus-per-node needs taskset (util-linux)"
    local have
    have=$(nproc)
    ((NODES * cpus <= have)) || die 2 "--cpus-per-node $cpus: $NODES nodes need $((NODES * cpus)) CPUs, this machine has $have"
  fi
  for ((i = 0; i < NODES; i++)); do
    ((i > 0)) && apps+=(:)
    pin=()
    [ -n "$cpus" ] && pin=(taskset -c "$((i * cpus))-$((i * cpus + cpus - 1))")
    apps+=(-n "$k" ip netns exec "$(ns "$i")" "${pin[@]}" "$@")
  done
  local pre=()
  [ -n "$limit" ] && pre=(timeout -k 5 "$limit")
  # PMIx's server listens on loopback unless told otherwise, which no
  # namespace can reach; TCP only between ranks (shared memory would bypass
  # the links), on the cluster's subnet.
  PMIX_MCA_ptl_tcp_remote_connections=1 \
    PMIX_MCA_ptl_tcp_if_include="$net" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    exec "${pre[@]}" mpirun --oversubscribe --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net" \
    "${apps[@]}"
}

cmd_stats() {
  local json=0
  while [ $# -gt 0 ]; do
    case $1 in
      --json) json=1; shift ;;
      --prefix) PREFIX=${2:?}; shift 2 ;;
      *) echo "netcluster stats: unknown argument '$1'" >&2; usage ;;
    esac
  done
  need_env
  check_prefix
  load_state
  local i sep='' line
  ((json)) && printf '{"prefix":"%s","rate":"%s","delay_ms":%s,"nodes":[' "$PREFIX" "$RATE" "$DELAY_MS"
  for ((i = 0; i < NODES; i++)); do
    # /proc/net/dev: "iface: rx_bytes rx_packets ... (8 rx fields) tx_bytes tx_packets ..."
    line=$(ip netns exec "$(ns "$i")" cat /proc/net/dev | awk -v d="$(node_if "$i"):" '$1 == d {print $2, $3, $10, $11}')
    [ -n "$line" ] || die 1 "node $i: interface $(node_if "$i") not found in namespace $(ns "$i")"
    read -r rxb rxp txb txp <<<"$line"
    if ((json)); then
      printf '%s{"node":%d,"netns":"%s","iface":"%s","rx_bytes":%s,"rx_packets":%s,"tx_bytes":%s,"tx_packets":%s}' \
        "$sep" "$i" "$(ns "$i")" "$(node_if "$i")" "$rxb" "$rxp" "$txb" "$txp"
      sep=,
    else
      echo "node $i netns $(ns "$i") iface $(node_if "$i") rx_bytes $rxb rx_packets $rxp tx_bytes $txb tx_packets $txp"
    fi
  done
  ((json)) && printf ']}\n'
  return 0
}

cmd_cut() {
  local node=${1:-} how=down
  [ $# -ge 1 ] && shift
  if [ $# -ge 1 ] && [[ "$1" != --* ]]; then how=$1; shift; fi
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) PREFIX=${2:?}; shift 2 ;;
      *) echo "netcluster cut: unknown argument '$1'" >&2; usage ;;
    esac
  done
  need_env
  check_prefix
  load_state
  [[ "$node" =~ ^[0-9]+$ ]] && ((node < NODES)) || die 2 "cut: NODE must be 0..$((NODES - 1))"
  case $how in
    down)
      # The NIC goes away: no reset reaches the peers; only deadlines notice.
      ip netns exec "$(ns "$node")" ip link set "$(node_if "$node")" down ;;
    loss)
      # The link stays up and silently drops everything, both ways (no
      # reset, no error on the senders): netem's 100% loss where the kernel
      # has netem, else a tbf whose 1-byte bucket no packet fits (tbf drops
      # a packet larger than its bucket).
      local drop=(tbf rate 1kbit burst 1 limit 1)
      have_netem && drop=(netem loss 100%)
      ip netns exec "$(ns "$node")" tc qdisc replace dev "$(node_if "$node")" root "${drop[@]}"
      tc qdisc replace dev "$(host_if "$node")" root "${drop[@]}" ;;
    *) die 2 "cut: how must be \`down\` or \`loss\`, not '$how'" ;;
  esac
  echo "netcluster: node $node link cut ($how)" >&2
}

cmd_heal() {
  local node=${1:-}
  [ $# -ge 1 ] && shift
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) PREFIX=${2:?}; shift 2 ;;
      *) echo "netcluster heal: unknown argument '$1'" >&2; usage ;;
    esac
  done
  need_env
  check_prefix
  load_state
  [[ "$node" =~ ^[0-9]+$ ]] && ((node < NODES)) || die 2 "heal: NODE must be 0..$((NODES - 1))"
  ip netns exec "$(ns "$node")" ip link set "$(node_if "$node")" up
  shape "$(node_if "$node")" "$(ns "$node")"
  shape "$(host_if "$node")"
  echo "netcluster: node $node link restored ($RATE, ${DELAY_MS} ms)" >&2
}

cmd_show() {
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) PREFIX=${2:?}; shift 2 ;;
      *) echo "netcluster show: unknown argument '$1'" >&2; usage ;;
    esac
  done
  need_env
  check_prefix
  load_state
  local i
  echo "prefix $PREFIX nodes $NODES rate $RATE delay_ms $DELAY_MS subnet $SUBNET.0/24 bridge $(bridge) $SUBNET.1"
  for ((i = 0; i < NODES; i++)); do
    echo "node $i netns $(ns "$i") iface $(node_if "$i") addr $SUBNET.$((i + 2))"
    ip netns exec "$(ns "$i")" tc qdisc show dev "$(node_if "$i")" | sed 's/^/  egress  /'
    tc qdisc show dev "$(host_if "$i")" | sed 's/^/  ingress /'
  done
}

[ $# -ge 1 ] || usage
sub=$1
shift
case $sub in
  up) cmd_up "$@" ;;
  down)
    while [ $# -gt 0 ]; do
      case $1 in
        --prefix) PREFIX=${2:?}; shift 2 ;;
        *) echo "netcluster down: unknown argument '$1'" >&2; usage ;;
      esac
    done
    cmd_down ;;
  run) cmd_run "$@" ;;
  stats) cmd_stats "$@" ;;
  cut) cmd_cut "$@" ;;
  heal) cmd_heal "$@" ;;
  show) cmd_show "$@" ;;
  -h | --help | help) usage ;;
  *) echo "netcluster: unknown command '$sub'" >&2; usage ;;
esac
