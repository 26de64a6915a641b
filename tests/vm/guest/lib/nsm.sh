# Sourced by guest scripts (busybox sh) that mount NFSv3 with locking.
# Needs a guest booted with --nsm (rpcbind, rpcinfo, rpc.statd).
#
# start_nsm NAME STATD_PORT LOCKD_PORT
#   Names the guest NAME (its lock manager's caller_name), writes the few
#   files rpcbind and rpc.statd read (users, services, netconfig), pins
#   the kernel lock manager's TCP and UDP port to LOCKD_PORT and rpc.statd
#   to STATD_PORT (so that the host can forward them to the guest), and
#   starts rpcbind and rpc.statd. Returns once statd is registered with
#   rpcbind; 1 (with the reason on stdout) if that does not happen.

start_nsm() {
  nsm_name=$1 nsm_statd=$2 nsm_lockd=$3
  hostname "$nsm_name"
  mkdir -p /etc /run/rpcbind /var/lib/nfs/sm /var/lib/nfs/sm.bak /var/run
  # rpcbind runs as _rpc; statd stays root (it takes the owner of sm/).
  printf 'root:x:0:0:root:/root:/bin/sh\n_rpc:x:102:65534::/run/rpcbind:/bin/false\n' > /etc/passwd
  printf 'root:x:0:\nnogroup:x:65534:\n' > /etc/group
  chown 102 /run/rpcbind
  printf 'sunrpc 111/tcp portmapper\nsunrpc 111/udp portmapper\n' > /etc/services
  printf 'ip 0 IP\ntcp 6 TCP\nudp 17 UDP\n' > /etc/protocols
  printf '127.0.0.1 localhost\n' > /etc/hosts
  # libtirpc's transports: IPv4 UDP and TCP, and the local socket.
  {
    echo 'udp   tpi_clts     v inet     udp - -'
    echo 'tcp   tpi_cots_ord v inet     tcp - -'
    echo 'local tpi_cots_ord - loopback -   - -'
  } > /etc/netconfig
  # The kernel lock manager's ports: set before it starts (at the mount).
  echo "$nsm_lockd" > /proc/sys/fs/nfs/nlm_tcpport || { echo "cannot set nlm_tcpport"; return 1; }
  echo "$nsm_lockd" > /proc/sys/fs/nfs/nlm_udpport || { echo "cannot set nlm_udpport"; return 1; }
  /sbin/rpcbind -w > /tmp/rpcbind.log 2>&1 || { echo "rpcbind failed: $(cat /tmp/rpcbind.log)"; return 1; }
  /sbin/rpc.statd --no-notify --port "$nsm_statd" \
    > /tmp/statd.log 2>&1 || { echo "rpc.statd failed: $(cat /tmp/statd.log)"; return 1; }
  # rpc.statd registers with rpcbind once it is ready; wait for that (up to
  # 30 s, polling: there is nothing to block on).
  i=0
  until /usr/bin/rpcinfo -p 127.0.0.1 2> /dev/null | grep -Eq "^ *100024 +1 +udp +$nsm_statd( |\$)"; do
    i=$((i + 1))
    if [ "$i" -gt 300 ]; then
      echo "rpc.statd is not registered with rpcbind after 30 s:"
      /usr/bin/rpcinfo -p 127.0.0.1
      cat /tmp/statd.log
      return 1
    fi
    sleep 0.1
  done
}
