#!/bin/sh
# Guest side of tests/interop/test_linux_nlm.py: fcntl locks of the Linux
# kernel's NFSv3 client (NLM, with rpcbind and rpc.statd in the guest)
# against the server on $SERVER:$PORT, and their reclaim after a server
# crash. Needs a boot with --nsm, --bin /usr/bin/perl, and STATD_PORT and
# LOCKD_PORT forwarded from the host. The host answers on $CTL_PORT
# ("ok" when its checks pass; see NlmControl in the test):
#   "nlm-held PATH START LEN"  another host's NLM TEST and an NFSv4 LOCKT
#                              are denied by the guest's lock on exactly it
#   "v4-lock PATH START LEN"   an NFSv4 client takes a write lock there
#   "v4-unlock"                once the guest's blocking LOCK waits on the
#                              server, that client unlocks and goes
#   "nlm-restart PATH START LEN"  SIGKILL and start the server; another
#                              host is refused in grace, the guest's lock
#                              comes back by reclaim (after SM_NOTIFY)
#   "nlm-free PATH START LEN"  another host's NLM TEST is granted

set -eu
set -o pipefail

: "${SERVER:?}" "${PORT:?}" "${CTL_PORT:?}" "${STATD_PORT:?}" "${LOCKD_PORT:?}"
M=/mnt
STEP=setup
. /etc/sluice-vm/lib/common.sh
. /etc/sluice-vm/lib/nsm.sh
trap 'rc=$?; [ "$rc" -eq 0 ] || echo "NLM GUEST FAILED in step $STEP (exit status $rc)"' EXIT

command -v perl > /dev/null || fail "perl is missing in the guest (--bin /usr/bin/perl)"
rm -f /tmp/ready /tmp/release /tmp/hcmd /tmp/hreply
mkfifo /tmp/ready /tmp/release /tmp/hcmd /tmp/hreply

step "rpcbind and rpc.statd"
start_nsm "guest-$(uname -r | cut -d. -f1-2)" "$STATD_PORT" "$LOCKD_PORT" || fail "start_nsm"

step "mount NFSv3 with locking (kernel $(uname -r))"
mkdir -p "$M"
mount -t nfs -o "vers=3,proto=tcp,port=$PORT,mountport=$PORT,mountproto=tcp,sec=sys" "$SERVER:/" "$M" ||
  fail "mount"
grep " $M nfs " /proc/mounts | grep -q 'vers=3' || fail "not an NFSv3 mount: $(grep " $M " /proc/mounts)"
grep " $M nfs " /proc/mounts | grep -q nolock && fail "mounted with nolock"
mkdir "$M/locks"
head -c 8192 /dev/zero > "$M/locks/f"

step "a guest lock is on the server: another host and an NFSv4 client are denied"
hold_lock "$M/locks/f" 1 0 100 /tmp/ready /tmp/release &
holder=$!
read -r r < /tmp/ready
eq "$r" held "background write lock on bytes 0-99"
ctl nlm-held locks/f 0 100
expect_rc 3 try_lock "$M/locks/f" 1 50 10       # another process of the guest
echo go > /tmp/release
wait "$holder"
ctl nlm-free locks/f 0 100

step "an NFSv4 client's lock holds back the guest's; a blocked LOCK is granted by callback"
ctl v4-lock locks/f 200 100
expect_rc 3 try_lock "$M/locks/f" 1 250 10
expect_rc 3 try_lock "$M/locks/f" 0 0 0
# F_SETLKW waits in the kernel, which waits on the server (NLM4_BLOCKED).
hold_lock "$M/locks/f" 1 250 10 /tmp/ready /tmp/release &
holder=$!
t0=$(date +%s)
ctl v4-unlock                                   # returns once it unlocked
read -r r < /tmp/ready
t1=$(date +%s)
eq "$r" held "the blocked write lock on bytes 250-259"
# The Linux client asks again only every 30 s: sooner means the server's
# NLM4_GRANTED reached the guest's lock manager.
[ $((t1 - t0)) -lt 20 ] || fail "the blocked lock took $((t1 - t0)) s after the unlock (no NLM4_GRANTED?)"
echo "blocked lock granted $((t1 - t0)) s after the NFSv4 unlock"
ctl nlm-held locks/f 250 10
echo go > /tmp/release
wait "$holder"

step "server crash: the lock is reclaimed, the file stays open and exact"
printf 'first line\n' > /tmp/init
lock_holder "$M/locks/recl" 1000 100 /tmp/init &
lholder=$!
read -r hr < /tmp/hreply
eq "$hr" held "the lock holder (locks/recl written, fsynced and locked)"
ctl nlm-restart locks/recl 1000 100
holder_do "write after the restart"
eq "$hr" ok "write through the descriptor held across the crash"
holder_do check
eq "$hr" ok "content of locks/recl after the crash"
expect_rc 3 try_lock "$M/locks/recl" 1 1050 10  # the guest's other processes still wait
ctl nlm-held locks/recl 1000 100
holder_do quit
eq "$hr" closed "close"
wait "$lholder"
ctl nlm-free locks/recl 1000 100
expect_rc 0 try_lock "$M/locks/recl" 1 0 0
sync
echo "MD5 locks/recl $(md5sum "$M/locks/recl" | cut -d' ' -f1)"

step "unmount"
umount "$M" || fail "umount"
echo "ALL NLM STEPS PASSED (kernel $(uname -r))"
