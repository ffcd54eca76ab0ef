#!/usr/bin/env bash
# Several test nodes on one machine: one network namespace per node, joined by veth pairs to a
# bridge that lives in a namespace of its own, so nothing is added to the host's network. Each
# node has its own address, and every command run on it gets its own hostname (`unshare --uts`:
# Open MPI's shared-memory transport collides across "nodes" that share one) and, optionally, its
# own directory behind one path (`unshare --mount` plus a bind mount).
#
# Usage (as a command; every subcommand reads the same MN_PREFIX / MN_SUBNET / MN_STATE):
#   netns.sh check                  exit 0 when namespaces can be made here; else one line, exit 77
#   netns.sh up LAYOUT [NODE_DIR]   LAYOUT is the ranks per node, "2,2" or "1,2,1", or NxR (N nodes
#                                   of R ranks: "1x4"), or a count N (N nodes of 1 rank): nodes 0..N-1 at SUBNET.1..SUBNET.N, each with
#                                   that many slots in STATE/hosts (mpirun fills them in order, so
#                                   node 0 has ranks 0..s0-1), and a launcher node "head" at
#                                   SUBNET.254; with NODE_DIR (an existing directory), each node
#                                   sees its own STATE/node-dir/nodeI there
#   netns.sh exec I CMD...          run CMD on node I (I = head for the launcher)
#   netns.sh kill I                 SIGKILL every process on node I
#   netns.sh link I down|up         take node I's link down (or up again)
#   netns.sh down                   remove every namespace of MN_PREFIX and the state directory
#   netns.sh mpirun ARGS...         mpirun from the head node, ranks on the nodes of the hostfile
#                                   STATE/hosts, over TCP on the subnet (agent: STATE/rsh-agent)
# An executable STATE/node-setup, when there is one, runs (as root, in the node's own mount
# namespace, after the NODE_DIR bind mount) before every command on a node, with the node's index
# as its argument: a test mounts a small tmpfs on one node there, for example.
# Environment: MN_PREFIX (default zoemn; at most 8 characters), MN_SUBNET (first three octets,
# default 10.77.0), MN_STATE (default /tmp/zoe-netns-$MN_PREFIX). Two users of this script at once
# must use different prefixes and subnets. `up` first removes namespaces of its prefix left behind
# by an earlier run; use `down` in a trap so a failing test leaves none.
#
# Or source it: the functions mn_check, mn_up, mn_exec, mn_kill, mn_link, mn_down, mn_mpirun do
# the same as the subcommands.
set -uo pipefail

MN_PREFIX=${MN_PREFIX:-zoemn}
MN_SUBNET=${MN_SUBNET:-10.77.0}
MN_STATE=${MN_STATE:-/tmp/zoe-netns-$MN_PREFIX}
MN_SELF=$(readlink -f "${BASH_SOURCE[0]}")

mn_ns() { # node index (or head) -> namespace name
  if [ "$1" = head ]; then echo "${MN_PREFIX}hd"; else echo "${MN_PREFIX}n$1"; fi
}

mn_addr() { # node index (or head) -> its address
  if [ "$1" = head ]; then echo "$MN_SUBNET.254"; else echo "$MN_SUBNET.$(($1 + 1))"; fi
}

# Exit 77 with one line when this machine does not let us make namespaces.
mn_check() {
  local why=""
  if [ "$(id -u)" != 0 ]; then
    why="not root"
  elif ! command -v ip > /dev/null || ! command -v unshare > /dev/null; then
    why="ip (iproute2) or unshare (util-linux) is missing"
  elif ! command -v mpirun > /dev/null; then
    why="mpirun is missing"
  else
    local probe="${MN_PREFIX}pr$$"
    if ! ip netns add "$probe" 2> /dev/null; then
      why="ip netns add fails (no CAP_NET_ADMIN)"
    else
      if ! ip -n "$probe" link add "${MN_PREFIX}pa" type veth peer name "${MN_PREFIX}pb" 2> /dev/null; then
        why="veth pairs cannot be made"
      elif ! ip netns exec "$probe" unshare --uts --mount true 2> /dev/null; then
        why="unshare --uts --mount fails"
      fi
      ip netns del "$probe" 2> /dev/null
    fi
  fi
  if [ -n "$why" ]; then
    echo "multi-node tests skipped: network namespaces are not allowed here ($why)"
    return 77
  fi
  return 0
}

# Every namespace whose name starts with the prefix (stale ones included).
mn_list() {
  ip netns list 2> /dev/null | awk '{print $1}' | grep "^${MN_PREFIX}" || true
}

mn_down() {
  local ns pids
  for ns in $(mn_list); do
    pids=$(ip netns pids "$ns" 2> /dev/null)
    [ -n "$pids" ] && kill -9 $pids 2> /dev/null
  done
  for ns in $(mn_list); do
    # A process killed just now may still hold the namespace for a moment; deleting unlinks it
    # anyway and the kernel frees it with the last process.
    ip netns del "$ns" 2> /dev/null || true
  done
  [ -n "$MN_STATE" ] && [ -d "$MN_STATE" ] && rm -rf "$MN_STATE"
  local left
  left=$(mn_list)
  if [ -n "$left" ]; then
    echo "netns.sh: could not remove namespaces: $left" >&2
    return 1
  fi
  return 0
}

# Writes the rsh agent: `rsh-agent [ssh-style options] HOST CMD...` runs CMD on the node whose
# address is HOST.
mn_write_agent() {
  cat > "$MN_STATE/rsh-agent" << EOF
#!/usr/bin/env bash
# Open MPI's plm_rsh_agent for the test nodes: runs a command on the node with the given address.
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
export MN_PREFIX='$MN_PREFIX' MN_SUBNET='$MN_SUBNET' MN_STATE='$MN_STATE'
node=\$(awk -v h="\$host" '\$1 == h {print \$2}' '$MN_STATE/nodes')
if [ -z "\$node" ]; then
  echo "rsh-agent: no test node has address \$host" >&2
  exit 1
fi
exec bash '$MN_SELF' exec "\$node" sh -c "\$*"
EOF
  chmod +x "$MN_STATE/rsh-agent"
}

mn_up() {
  local layout=$1 node_dir=${2:-} slots i
  if [[ "$layout" =~ ^([0-9]+)x([0-9]+)$ ]]; then
    slots=()
    for ((i = 0; i < BASH_REMATCH[1]; i++)); do slots+=("${BASH_REMATCH[2]}"); done
  elif [[ "$layout" =~ ^[0-9]+$ ]]; then
    slots=()
    for ((i = 0; i < layout; i++)); do slots+=(1); done
  elif [[ "$layout" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    IFS=, read -r -a slots <<< "$layout"
  else
    echo "netns.sh up: layout '$layout' is neither a count nor ranks per node like 2,1" >&2
    return 2
  fi
  local n=${#slots[@]}
  if [ -n "$node_dir" ] && [ ! -d "$node_dir" ]; then
    echo "netns.sh up: $node_dir is not a directory" >&2
    return 2
  fi
  mn_down > /dev/null 2>&1 || true
  mkdir -p "$MN_STATE" || return 1
  : > "$MN_STATE/nodes"
  : > "$MN_STATE/hosts"
  echo "$node_dir" > "$MN_STATE/node_dir"
  local sw="${MN_PREFIX}sw" br="${MN_PREFIX}br"
  ip netns add "$sw" || return 1
  ip -n "$sw" link add "$br" type bridge || return 1
  ip -n "$sw" link set "$br" up || return 1
  local i ns nodes=(head)
  for ((i = 0; i < n; i++)); do nodes+=("$i"); done
  for i in "${nodes[@]}"; do
    ns=$(mn_ns "$i")
    ip netns add "$ns" || return 1
    ip -n "$sw" link add "${MN_PREFIX}v$i" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$sw" link set "${MN_PREFIX}v$i" master "$br" up || return 1
    ip -n "$ns" addr add "$(mn_addr "$i")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    echo "$(mn_addr "$i") $i" >> "$MN_STATE/nodes"
    if [ "$i" != head ]; then
      echo "$(mn_addr "$i") slots=${slots[$i]} max_slots=${slots[$i]}" >> "$MN_STATE/hosts"
      [ -n "$node_dir" ] && mkdir -p "$MN_STATE/node-dir/node$i"
    fi
  done
  mn_write_agent
  # The bridge ports come up asynchronously: wait until every one forwards.
  local tries=0
  while bridge -n "$sw" link show | grep -qv "state forwarding"; do
    tries=$((tries + 1))
    if [ $tries -ge 50 ]; then
      echo "netns.sh up: the bridge's ports do not forward: $(bridge -n "$sw" link show)" >&2
      return 1
    fi
    sleep 0.1
  done
  return 0
}

# Runs CMD on node I with hostname nodeI (head for the launcher), and NODE_DIR bound to the node's
# own directory when `up` was given one.
mn_exec() {
  local i=$1
  shift
  local ns node_dir=""
  ns=$(mn_ns "$i")
  [ -f "$MN_STATE/node_dir" ] && node_dir=$(cat "$MN_STATE/node_dir")
  local setup="hostname node$i"
  [ "$i" = head ] && setup="hostname head"
  if [ -n "$node_dir" ] && [ "$i" != head ]; then
    setup="$setup && mount --bind '$MN_STATE/node-dir/node$i' '$node_dir'"
  fi
  if [ "$i" != head ]; then
    setup="$setup && { [ ! -x '$MN_STATE/node-setup' ] || '$MN_STATE/node-setup' $i; }"
  fi
  # As a command, the script becomes the node's command (exec): a signal to it reaches that command.
  ${MN_EXEC_SELF:-} ip netns exec "$ns" unshare --uts --mount sh -c "$setup && exec \"\$@\"" sh "$@"
}

mn_kill() {
  local pids
  pids=$(ip netns pids "$(mn_ns "$1")" 2> /dev/null)
  [ -n "$pids" ] && kill -9 $pids 2> /dev/null
  return 0
}

mn_link() {
  ip -n "$(mn_ns "$1")" link set eth0 "$2"
}

# mpirun watches its daemons as docs/multinode.md advises for a node that may stop answering: TCP
# keepalive on their idle connections (after 10 s idle, 3 probes 2 s apart), so that mpirun finds an
# unreachable node itself, within about 16 s, and ends the job. Without it, once the ranks that
# found the loss exit, mpirun's abort waits for that node's daemon on TCP's retransmission timeout.
mn_mpirun() {
  mn_exec head mpirun --allow-run-as-root --hostfile "$MN_STATE/hosts" \
    --mca plm_rsh_agent "$MN_STATE/rsh-agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$MN_SUBNET.0/24" --mca btl tcp,vader,self \
    --mca btl_tcp_if_include "$MN_SUBNET.0/24" --bind-to none \
    --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  MN_EXEC_SELF=exec
  cmd=${1:-}
  shift || true
  case "$cmd" in
    check) mn_check ;;
    up) mn_up "$@" ;;
    exec) mn_exec "$@" ;;
    kill) mn_kill "$@" ;;
    link) mn_link "$@" ;;
    down) mn_down ;;
    mpirun) mn_mpirun "$@" ;;
    *)
      echo "usage: netns.sh check|up LAYOUT [NODE_DIR]|exec I CMD...|kill I|link I down|up|down|mpirun ARGS..." >&2
      exit 2
      ;;
  esac
fi
