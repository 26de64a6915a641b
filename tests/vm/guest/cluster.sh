#!/bin/sh
# Guest side of tests/interop/test_linux_cluster.py: an NFSv4.1 mount of a
# cluster's floating address ($SERVER:$PORT, a proxy on the host in front
# of node 1) with an open file, an fcntl lock and a large file, while the
# host kills node 1 and moves the address to node 2. Needs --bin
# /usr/bin/perl. The host answers on $CTL_PORT ("ok" when its checks pass;
# see ClusterControl in the test):
#   "held PATH START LEN"      node 1 denies another client's LOCKT by a
#                              write lock on exactly that range
#   "failover"                 node 1 is killed; once the other nodes are in
#                              grace the address moves to node 2, and node
#                              3 refuses a new lock (NFS4ERR_GRACE)
#   "reclaimed PATH START LEN" node 2 counted the guest's reclaims; after
#                              grace it denies another client's LOCKT by
#                              exactly the guest's lock
#   "free PATH START LEN"      node 2 grants another client's LOCKT there

set -eu
set -o pipefail

: "${SERVER:?}" "${PORT:?}" "${CTL_PORT:?}"
M=/mnt
STEP=setup
. /etc/sluice-vm/lib/common.sh
trap 'rc=$?; [ "$rc" -eq 0 ] || echo "CLUSTER GUEST FAILED in step $STEP (exit status $rc)"' EXIT

command -v perl > /dev/null || fail "perl is missing in the guest (--bin /usr/bin/perl)"
rm -f /tmp/hcmd /tmp/hreply
mkfifo /tmp/hcmd /tmp/hreply

step "mount the floating address (kernel $(uname -r))"
mkdir -p "$M"
mount -t nfs4 -o "vers=4.1,port=$PORT,timeo=50" "$SERVER:/" "$M" || fail "mount"
mkdir -p "$M/fo"

step "before the failover: a large file, an open file and a lock on node 1"
random_bytes $((16 << 20)) "$(random_offset)" > /tmp/big
cp /tmp/big "$M/fo/big"
sync
echo "MD5 fo/big $(md5sum /tmp/big | cut -d' ' -f1)"
printf 'before the failover\n' > /tmp/init
lock_holder "$M/fo/file" 0 100 /tmp/init &
lholder=$!
read -r hr < /tmp/hreply
eq "$hr" held "the lock holder (fo/file written, fsynced and locked)"
ctl held fo/file 0 100

step "node 1 dies, its address moves to node 2"
ctl failover
t0=$(cut -d' ' -f1 /proc/uptime)
holder_do "write after the failover"   # the client reclaims on node 2 first
eq "$hr" ok "write through the descriptor held across the failover"
t1=$(cut -d' ' -f1 /proc/uptime)
echo "first write after the failover took $(awk "BEGIN { print $t1 - $t0 }") s"
holder_do check
eq "$hr" ok "content of fo/file after the failover"
cmp /tmp/big "$M/fo/big" || fail "fo/big differs after the failover"
expect_rc 3 try_lock "$M/fo/file" 1 50 10     # the guest's other processes still wait
ctl reclaimed fo/file 0 100

step "I/O goes on on node 2"
cp /tmp/big "$M/fo/big2"
sync
cmp /tmp/big "$M/fo/big2" || fail "fo/big2 differs"
holder_do quit
eq "$hr" closed "close"
wait "$lholder"
ctl free fo/file 0 100
expect_rc 0 try_lock "$M/fo/file" 1 0 0
echo "MD5 fo/file $(md5sum "$M/fo/file" | cut -d' ' -f1)"

step "unmount"
umount "$M" || fail "umount"
echo "ALL CLUSTER STEPS PASSED (kernel $(uname -r))"
