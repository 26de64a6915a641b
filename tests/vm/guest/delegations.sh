#!/bin/sh
# Guest side of tests/interop/test_linux_delegations.py: what read
# delegations do for the Linux kernel NFS client mounted (NFS minor version
# $VERS) from the server on $SERVER:$PORT. Runs under busybox sh inside
# tests/vm/linux-client and needs /usr/bin/perl there (--bin), for open()'s
# errno.
#
# Calls per file: the host made calls/f000 .. calls/fNNN ($NFILES files,
# content "calls/fNNN\n") before the boot. Pass 1 opens, reads and closes
# each (one cat), then pass 2 does it again; the per-op counts of the
# mount (/proc/self/mountstats) before and after each pass give one line
#   CALLS pass=N files=F OPEN=.. OPEN_NOATTR=.. CLOSE=.. DELEGRETURN=.. ... ALL=..
# per pass (the calls the pass made), for the host to compare. After each
# pass the guest sends "mark pass1" / "mark pass2" on $CTL_PORT (the host
# takes the server's metrics then and answers "ok").
#
# With STALE=1, no stale data: the host made stale/KEY (content
# "stale/KEY version 1\n", KEY w, o, t, r, n, v) and stale/src (content
# "stale/v version 2\n"). For each, this guest reads the file (and so holds
# a read delegation on it), then sends "change KIND PATH [PATH2]"; the host
# makes that change through another client (over raw RPC: the server
# recalls the delegation and answers NFS4ERR_DELAY until the guest returned
# it), checks the recall in its metrics, and answers "ok". The guest must
# then see the change:
#   write stale/w           WRITE (anonymous stateid): "stale/w version 2"
#   open-write stale/o      OPEN for writing, WRITE, CLOSE: "stale/o version 2"
#   truncate stale/t 7      SETATTR of the size to 7: "stale/t"
#   remove stale/r          open() fails with ENOENT; not found nor listed
#                           once the caches are dropped
#   rename stale/n stale/n2 stale/n2 has its content; stale/n is not found
#                           nor listed once the caches are dropped
#   rename stale/src stale/v  renamed over the file: "stale/v version 2"
#
# With WRITE=1, write delegations (the server runs with --delegations all)
# and the guest's dirty data. The host made wd/a and wd/c (content
# "wd/KEY version 1\n", 15 bytes). Dirty pages expire after an hour, so
# what the guest writes stays in its page cache until it closes, syncs or
# is asked.
#   wd/a  opened read-write (a write delegation) and written, kept open:
#         "dirty wd/a 15": the host checks the server's file still has its
#         15 bytes (the data is only in the guest), "getattr wd/a 26":
#         another client's GETATTR reports the guest's size (CB_GETATTR)
#         without a recall, "change read wd/a": another client's OPEN and
#         READ recall the delegation (the Linux client returns it at once,
#         keeping what it wrote under its open), then the guest closes the
#         file and "written wd/a": another client reads what it wrote.
#   wd/c  opened read-write and written, kept open, then "restart-dirty
#         wd/c 15": the host checks the data is only in the guest and
#         restarts the server (SIGKILL). The guest closes and syncs (its
#         client reclaims the open and the write delegation during grace,
#         then writes), and "reclaimed wd/c": the host finds the guest's
#         data on the server, through another client whose READ recalls
#         the reclaimed delegation.
#
# Every check that fails stops the script with a non-zero status and says
# which step it was in.

set -eu
set -o pipefail

: "${SERVER:?}" "${PORT:?}" "${CTL_PORT:?}" "${VERS:?}" "${NFILES:?}" "${STALE:?}" "${WRITE:?}"
M=/mnt
OPTS="vers=$VERS,port=$PORT,addr=$SERVER,proto=tcp,sec=sys"
STEP=setup
. /etc/sluice-vm/lib/common.sh

on_exit() {
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "GUEST DELEGATIONS FAILED in step '$STEP' (exit status $rc)"
    grep " $M " /proc/mounts || true
    echo "---- per-op counts of the mount now ----"
    opcounts | awk '$2 != 0' | tr '\n' ' '
    echo
  fi
}
trap on_exit EXIT

uptime_s() { cut -d' ' -f1 /proc/uptime; }
# "NAME COUNT" for each op in the per-op statistics of the mount on $M
# (the first number of an op's line is how many times it was sent).
opcounts() {
  awk -v m="$M" '
    $1 == "device" { mine = ($5 == m && $8 ~ /^nfs/); ops = 0; next }
    mine && /per-op statistics/ { ops = 1; next }
    mine && ops && $1 ~ /:$/ && NF >= 2 { sub(/:$/, "", $1); print $1, $2 }
  ' /proc/self/mountstats
}
# The CALLS line of pass $1 from the counts before ($2) and after ($3).
calls() {
  awk -v label="$1" -v files="$NFILES" '
    NR == FNR { before[$1] = $2; next }
    { d[$1] = $2 - before[$1]; all += d[$1] }
    END {
      printf "CALLS pass=%s files=%d", label, files
      n = split("OPEN OPEN_NOATTR CLOSE DELEGRETURN READ READ_PLUS GETATTR LOOKUP ACCESS SEQUENCE", k, " ")
      for (i = 1; i <= n; i++) printf " %s=%d", k[i], d[k[i]]
      printf " ALL=%d\n", all
    }' "$2" "$3"
}
# open(PATH, O_RDONLY): exit 0 if it opened, else its errno.
open_rc() {
  set +e
  perl -e 'open(F, "<", $ARGV[0]) and exit 0; exit($! + 0);' "$1"
  rc=$?
  set -e
  echo "$rc"
}
# content PATH WANT WHAT: cat PATH must give WANT. When it does not, the
# file is read again after dropping the caches, to tell stale data in the
# client from a change that did not happen on the server.
content() {
  got=$(cat "$1") || fail "$3: cat $1 failed"
  if [ "$got" != "$2" ]; then
    sync
    echo 3 > /proc/sys/vm/drop_caches
    again=$(cat "$1" 2>&1) || true
    fail "$3: expected '$2', got '$got' (after dropping the caches: '$again')"
  fi
}
revalidated_gone() { # PATH WHAT: with nothing cached (caches dropped)
  # the server has no such name: not found, not listed.
  sync
  echo 3 > /proc/sys/vm/drop_caches
  [ ! -e "$1" ] || fail "$2: $1 exists after dropping the caches"
  if ls "${1%/*}" | grep -qx "${1##*/}"; then
    fail "$2: ${1##*/} is still listed in ${1%/*} after dropping the caches"
  fi
}
gone() { # PATH WHAT: the file was removed: open() fails with ENOENT at
  # once (close-to-open: the client opens its cached name by filehandle,
  # which the server must refuse), and revalidated_gone.
  eq "$(open_rc "$1")" 2 "$2: errno of open($1)"
  revalidated_gone "$@"
}

# hold_written PATH TEXT: a process that opens PATH read-write, writes TEXT
# at its start and keeps it open, closing nothing, until it is killed
# (every close() of a descriptor of an NFS file, even of a copy, makes the
# Linux client start writing back); its pid in $HOLD once TEXT is written.
hold_written() {
  rm -f /tmp/hold
  mkfifo /tmp/hold || fail "mkfifo /tmp/hold"
  perl -e '$| = 1; open(my $f, "+<", $ARGV[0]) or die "open $ARGV[0]: $!\n";
    syswrite($f, $ARGV[1]) == length($ARGV[1]) or die "write $ARGV[0]: $!\n";
    print "written\n"; sleep 3600;' "$1" "$2" > /tmp/hold &
  HOLD=$!
  read -r said < /tmp/hold || true
  eq "$said" written "the writer of $1"
}
# release_written: ends the process of hold_written (its descriptor closes).
release_written() {
  kill "$HOLD"
  wait "$HOLD" || true
}

command -v perl > /dev/null || fail "perl is missing in the guest (--bin /usr/bin/perl)"

step "mount (NFS $VERS, kernel $(uname -r))"
mount -t nfs4 -o "$OPTS" "$SERVER:/" "$M" || fail "mount -t nfs4 -o $OPTS $SERVER:/ $M"
grep " $M nfs4 " /proc/mounts > /tmp/mountline || fail "no nfs4 mount on $M after mount"
grep -q "vers=$VERS" /tmp/mountline || fail "mounted, but not as NFS $VERS: $(cat /tmp/mountline)"
cat /tmp/mountline
[ -d "$M/calls" ] || fail "calls/ (made by the host before the boot) is missing"
awk -v n="$NFILES" -v d="$M/calls" 'BEGIN { for (i = 0; i < n; i++) printf "%s/f%03d\n", d, i }' > /tmp/names
awk -v n="$NFILES" 'BEGIN { for (i = 0; i < n; i++) printf "calls/f%03d\n", i }' > /tmp/expect
# The names are looked up once before counting, so that both passes find
# them in the dentry cache alike and count opens, not first lookups.
xargs stat -c %s < /tmp/names > /dev/null || fail "stat of the calls/ files"

for pass in 1 2; do
  step "pass $pass: open, read and close each of the $NFILES files"
  opcounts > "/tmp/ops-before-$pass"
  t0=$(uptime_s)
  # One cat opens, reads to the end and closes each file in turn.
  xargs cat < /tmp/names > "/tmp/read-$pass" || fail "pass $pass: cat failed"
  t1=$(uptime_s)
  opcounts > "/tmp/ops-after-$pass"
  cmp -s "/tmp/read-$pass" /tmp/expect || fail "pass $pass: the files' content differs from what the host wrote"
  calls "$pass" "/tmp/ops-before-$pass" "/tmp/ops-after-$pass"
  echo "pass $pass took $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s (guest uptime $t0 .. $t1)"
  ctl mark "pass$pass"
done

if [ "$STALE" = 1 ]; then
  [ -d "$M/stale" ] || fail "stale/ (made by the host before the boot) is missing"

  step "stale data: WRITE by another client (anonymous stateid)"
  content "$M/stale/w" "stale/w version 1" "stale/w before the change"
  ctl change write stale/w
  content "$M/stale/w" "stale/w version 2" "stale/w after another client's WRITE"

  step "stale data: a local process on the server writes the file"
  content "$M/stale/l" "stale/l version 1" "stale/l before the change"
  ctl change local-write stale/l
  content "$M/stale/l" "stale/l version 2" "stale/l after a local process on the server wrote it"

  step "stale data: OPEN for writing, WRITE and CLOSE by another client"
  content "$M/stale/o" "stale/o version 1" "stale/o before the change"
  ctl change open-write stale/o
  content "$M/stale/o" "stale/o version 2" "stale/o after another client's OPEN and WRITE"

  step "stale data: SETATTR of the size by another client"
  content "$M/stale/t" "stale/t version 1" "stale/t before the change"
  ctl change truncate stale/t 7
  content "$M/stale/t" "stale/t" "stale/t after another client truncated it to 7 bytes"
  eq "$(stat -c %s "$M/stale/t")" 7 "size of stale/t after the truncation"

  step "stale data: REMOVE by another client"
  content "$M/stale/r" "stale/r version 1" "stale/r before the change"
  ctl change remove stale/r
  gone "$M/stale/r" "stale/r after another client's REMOVE"

  step "stale data: RENAME of the file by another client"
  content "$M/stale/n" "stale/n version 1" "stale/n before the change"
  ctl change rename stale/n stale/n2
  content "$M/stale/n2" "stale/n version 1" "stale/n2 (stale/n renamed by another client)"
  # The old name may still open until the client revalidates the
  # directory (its cached name leads to the file, which still exists:
  # Linux opens it by filehandle), so it must be gone after that.
  echo "errno of open(stale/n) before the directory is revalidated: $(open_rc "$M/stale/n")"
  revalidated_gone "$M/stale/n" "stale/n after another client renamed it"

  step "stale data: RENAME over the file by another client"
  content "$M/stale/v" "stale/v version 1" "stale/v before the change"
  ctl change rename stale/src stale/v
  content "$M/stale/v" "stale/v version 2" "stale/v after another client renamed stale/src over it"
  # stale/src is the file now called stale/v (the client may still have the
  # old name cached, from a listing: see the rename above).
  revalidated_gone "$M/stale/src" "stale/src after another client renamed it over stale/v"
fi

if [ "$WRITE" = 1 ]; then
  [ -d "$M/wd" ] || fail "wd/ (made by the host before the boot) is missing"
  # Dirty data stays in the guest until it is written back on purpose:
  # periodic writeback takes only what was dirtied an hour ago.
  echo 360000 > /proc/sys/vm/dirty_expire_centisecs

  step "write delegation: another client reads the guest's dirty data after the recall"
  hold_written "$M/wd/a" 'wd/a written by the guest
'
  ctl dirty wd/a 15
  ctl getattr wd/a 26
  ctl change read wd/a
  release_written
  ctl written wd/a
  content "$M/wd/a" "wd/a written by the guest" "wd/a after another client read it"

  step "write delegation: the server restarts while the guest holds dirty data"
  hold_written "$M/wd/c" 'wd/c written before the restart
'
  ctl restart-dirty wd/c 15
  release_written
  sync
  content "$M/wd/c" "wd/c written before the restart" "wd/c after the restart"
  ctl reclaimed wd/c
fi

step "unmount"
cd /
opcounts > /tmp/ops-end
calls end /tmp/ops-after-2 /tmp/ops-end
umount "$M" || fail "final umount"
echo "ALL STEPS PASSED (NFS $VERS, kernel $(uname -r), STALE=$STALE, WRITE=$WRITE)"
