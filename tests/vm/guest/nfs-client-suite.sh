#!/bin/sh
# Guest side of tests/interop/test_linux_client.py: drive the Linux kernel NFS
# client against the server on $SERVER:$PORT (mounted with NFS minor version
# $VERS) and check what it sees. Runs under busybox sh inside
# tests/vm/linux-client and needs /usr/bin/flock, /usr/bin/perl,
# /usr/bin/setfattr and /usr/bin/getfattr there (--bin). The host side must have created big/f00000..big/f19999 (content:
# the name and a newline) in the export, and must answer on $CTL_PORT:
#   "restart"     -> restart the server, reply "ok" once it listens again
#   "mkfile PATH" -> create PATH (relative to the export) containing "host\n"
#   "xattr PATH NAME VALUE" -> check that the server's file PATH has the
#                    extended attribute user.NAME with VALUE, and give it
#                    user.host = "from the host"; reply "ok"
#   "no-xattr PATH NAME" -> check that the server's PATH has no user.NAME
#   "period" and "md5 COUNT OFFSET" -> the test data (RB_HOST in
#                    lib/common.sh)
# (with CTL_PREFIX, the host's paths start with it)
# and, with RECLAIM=1 (crash recovery steps), "reclaim-restart",
# "reclaimed-denied", "restart-twice", "denied", "restart-past-grace" and
# "refused-free" (see ControlServer in tests/interop/test_linux_client.py):
# each restarts the server or checks it from the host, replying "ok".
#
# Every check that fails stops the script with a non-zero status and says
# which step it was in. Lines "MANIFEST <path> <md5> <size>" at the end list
# the files written here, for the host to compare with the export.
#
# VERS=3 mounts with NFSv3 (MOUNT on the NFS port) the export's directory
# $MNTPATH on $M: with nolock (fcntl and flock locks are then the guest's
# own), or with LOCK=1 with locks on the server (NLM): the guest then runs
# rpcbind and rpc.statd (booted with --nsm; ports STATD_PORT and
# LOCKD_PORT, which the host forwards) and the host must also answer
# "nlm-held PATH START LEN" (another host's NLM TEST of that range is
# denied by a write lock on exactly it: "ok"). With THEN_V3=1 an NFSv4
# run ends by running this script again that way (LOCK=$V3_LOCK): NFS 3
# on /mnt3, the export's v3/ (made by the host, with its own big/), files
# of $V3_SIZES, paths on the control port and in the manifest under v3/.

set -eu
set -o pipefail

: "${SERVER:?}" "${PORT:?}" "${CTL_PORT:?}" "${VERS:?}"
M=${M:-/mnt}
MNTPATH=${MNTPATH:-/}
CTL_PREFIX=${CTL_PREFIX:-}
OPTS="vers=$VERS,port=$PORT,addr=$SERVER,proto=tcp,sec=sys"
if [ "$VERS" = 3 ]; then
  OPTS="$OPTS,mountport=$PORT,mountproto=tcp,mountaddr=$SERVER"
  [ "${LOCK:-0}" = 1 ] || OPTS="$OPTS,nolock"
  FSTYPE=nfs
else
  FSTYPE=nfs4
fi
SUMS=/tmp/sums$VERS       # "md5  path" of everything written, for md5sum -c
STEP=setup
: > "$SUMS"
umask 022

. /etc/sluice-vm/lib/common.sh
RB_HOST=1

on_exit() {
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "GUEST SUITE FAILED in step '$STEP' (exit status $rc)"
    grep " $M " /proc/mounts || true
  fi
}
trap on_exit EXIT

md5() { md5sum "$1" | cut -d' ' -f1; }
zeros_md5() { head -c "$1" /dev/zero | md5sum | cut -d' ' -f1; }
fsize() { stat -c %s "$1"; }
drop_caches() {
  sync
  echo 3 > /proc/sys/vm/drop_caches
}
do_mount() {
  mkdir -p "$M"
  mount -t $FSTYPE -o "$OPTS" "$SERVER:$MNTPATH" "$M" || fail "mount -t $FSTYPE -o $OPTS $SERVER:$MNTPATH $M"
  grep " $M $FSTYPE " /proc/mounts > /tmp/mountline || fail "no $FSTYPE mount on $M after mount"
  grep -q "vers=$VERS" /tmp/mountline || fail "mounted, but not as NFS $VERS: $(cat /tmp/mountline)"
}
remount() {
  cd /
  umount "$M" || fail "umount $M"
  do_mount
}
new_random() { # path size: write random bytes, remember their md5
  s=$(new_random_file "$1" "$2")
  echo "$s  $1" >> "$SUMS"
}
verify_all() { # what [size]: the files of at most size bytes, or all
  drop_caches
  : > /tmp/sums-checked
  while read -r sum path; do
    # A file that is gone counts as small: md5sum -c then reports it.
    if [ -z "${2:-}" ] || [ "$(fsize "$path" 2> /dev/null || echo 0)" -le "$2" ]; then
      echo "$sum  $path" >> /tmp/sums-checked
    fi
  done < "$SUMS"
  md5sum -c /tmp/sums-checked > /tmp/md5check 2>&1 || {
    grep -v ': OK$' /tmp/md5check
    fail "$1: file contents differ from what was written"
  }
}
dirents() { # dir: "file-id type name" per entry, from getdents64 alone
  perl -e '
    sysopen(D, $ARGV[0], 0200000) or die "$ARGV[0]: $!";  # O_RDONLY|O_DIRECTORY
    while (1) {
      $buf = "\0" x 65536;
      $n = syscall(217, fileno(D), $buf, 65536);  # getdents64
      $n >= 0 or die "getdents64 $ARGV[0]: $!";
      last if $n == 0;
      for ($at = 0; $at < $n; $at += $len) {
        ($ino, $len, $type) = unpack("Q x8 S C", substr($buf, $at, 19));
        $len >= 20 or die "getdents64 $ARGV[0]: an entry of $len bytes";
        $name = unpack("Z*", substr($buf, $at + 19, $len - 19));
        print "$ino $type $name\n";
      }
    }' "$1"
}
excl_create() { # path -> 0 created, 17 EEXIST, 1 other error
  perl -e 'sysopen(F, $ARGV[0], 0301, 0644) and exit 0; exit($! + 0 == 17 ? 17 : 1);' "$1"
}

command -v perl > /dev/null || fail "perl is missing in the guest (--bin /usr/bin/perl)"
command -v flock > /dev/null || fail "flock is missing in the guest (--bin /usr/bin/flock)"
rm -f /tmp/ready /tmp/release /tmp/hcmd /tmp/hreply
mkfifo /tmp/ready /tmp/release /tmp/hcmd /tmp/hreply

if [ "${LOCK:-0}" = 1 ]; then
  step "rpcbind and rpc.statd for NLM locking"
  . /etc/sluice-vm/lib/nsm.sh
  start_nsm "guest-$(uname -r | cut -d. -f1-2)" "${STATD_PORT:?}" "${LOCKD_PORT:?}" || fail "start_nsm"
fi

step "mount (NFS $VERS, kernel $(uname -r)$([ "${LOCK:-0}" = 1 ] && echo ', NLM locking'))"
do_mount
grep " $M " /proc/mounts

SIZES=${SIZES:-tiny:1 page:4095 mib:1048583 m64:67108864 m256:268435456}
step "write random files: $SIZES"
mkdir "$M/data"
for spec in $SIZES; do
  name=${spec%%:*}
  n=${spec#*:}
  new_random "$M/data/$name" "$n"
  eq "$(fsize "$M/data/$name")" "$n" "size of data/$name"
done

step "small writes the client sends together: quick on the connection's thread"
# One process writes 128 separate 8 KiB pieces (64 KiB apart), then
# fsyncs: the client's writeback sends them several at a time on its one
# connection. Linux 6.12 sends them UNSTABLE (then COMMIT), and the server
# answers them on the connection's thread (the host counts them in its
# metrics). Linux 6.1 sends each FILE_SYNC, as it does when no write of
# the file waits for a COMMIT yet: storage work, handed over.
case $(uname -r) in
  6.1.*) QUICK_PIECES=0 ;;
  *) QUICK_PIECES=64 ;;
esac
ctl inline-mark
perl -e '
  open(F, "+>", $ARGV[0]) or die "open: $!";
  for my $i (0 .. 127) {
    sysseek(F, $i * 65536, 0) or die "seek: $!";
    syswrite(F, chr(65 + $i % 26) x 8192) == 8192 or die "write: $!";
  }
  syscall(74, fileno(F)) == 0 or die "fsync: $!";  # SYS_fsync on x86_64
  close(F) or die "close: $!";
' "$M/data/pieces" || fail "writing 8 KiB pieces"
ctl inline-since-mark $QUICK_PIECES
# Linux 6.1's 128 FILE_SYNC WRITEs share the descriptors they flush
# through (8 were opened for them; one each before).
ctl flush-descriptors-since-mark 32
drop_caches
eq "$(fsize "$M/data/pieces")" $((127 * 65536 + 8192)) "size of data/pieces"
dd if="$M/data/pieces" of=/tmp/piece bs=8192 skip=$((8 * 77)) count=1 2>/dev/null
head -c 8192 /dev/zero | tr '\0' Z > /tmp/expect
eq "$(md5 /tmp/piece)" "$(md5 /tmp/expect)" "piece 77 of data/pieces"
dd if="$M/data/pieces" of=/tmp/piece bs=8192 skip=$((8 * 77 + 1)) count=1 2>/dev/null
eq "$(md5 /tmp/piece)" "$(zeros_md5 8192)" "the hole after piece 77 of data/pieces"
echo "$(md5 "$M/data/pieces")  $M/data/pieces" >> "$SUMS"

step "read the files back after umount and mount"
remount
verify_all "after remount"
for spec in $SIZES; do
  eq "$(fsize "$M/data/${spec%%:*}")" "${spec#*:}" "size of data/${spec%%:*} after remount"
done

step "append"
mkdir "$M/app"
printf 'line1\n' > "$M/app/log"
printf 'line2\n' >> "$M/app/log"
head -c 5000 /dev/urandom > /tmp/chunk
cat /tmp/chunk >> "$M/app/log"
printf 'tail\n' >> "$M/app/log"
{ printf 'line1\nline2\n'; cat /tmp/chunk; printf 'tail\n'; } > /tmp/expect
drop_caches
eq "$(fsize "$M/app/log")" "$(fsize /tmp/expect)" "size after appends"
eq "$(md5 "$M/app/log")" "$(md5 /tmp/expect)" "content after appends"
echo "$(md5 /tmp/expect)  $M/app/log" >> "$SUMS"

step "truncate up and down"
mkdir "$M/trunc"
head -c 10000 /dev/urandom > /tmp/orig
cp /tmp/orig "$M/trunc/f"
truncate -s 20000 "$M/trunc/f"
eq "$(fsize "$M/trunc/f")" 20000 "size after truncate up"
drop_caches
eq "$(head -c 10000 "$M/trunc/f" | md5sum)" "$(md5sum < /tmp/orig)" "old data after truncate up"
eq "$(tail -c 10000 "$M/trunc/f" | md5sum | cut -d' ' -f1)" "$(zeros_md5 10000)" "extended area after truncate up"
truncate -s 3000 "$M/trunc/f"
eq "$(fsize "$M/trunc/f")" 3000 "size after truncate down"
drop_caches
eq "$(md5sum < "$M/trunc/f")" "$(head -c 3000 /tmp/orig | md5sum)" "data after truncate down"
truncate -s 5000 "$M/trunc/f"
drop_caches
eq "$(fsize "$M/trunc/f")" 5000 "size after truncate down then up"
eq "$(head -c 3000 "$M/trunc/f" | md5sum)" "$(head -c 3000 /tmp/orig | md5sum)" "data kept after down+up"
eq "$(tail -c 2000 "$M/trunc/f" | md5sum | cut -d' ' -f1)" "$(zeros_md5 2000)" \
  "bytes 3000..4999 after shrinking to 3000 and growing to 5000 (old data must not reappear)"
{ head -c 3000 /tmp/orig; head -c 2000 /dev/zero; } | md5sum | sed "s|-\$|$M/trunc/f|" >> "$SUMS"
# Write far past the end: the gap must read as zeros (a hole on the server).
dd if=/tmp/chunk of="$M/trunc/sparse" bs=4096 seek=1000 2> /dev/null
drop_caches
eq "$(fsize "$M/trunc/sparse")" $((4096 * 1000 + 5000)) "size of a file written at 4000 KiB"
eq "$(head -c 4096000 "$M/trunc/sparse" | md5sum | cut -d' ' -f1)" "$(zeros_md5 4096000)" "hole before data"
eq "$(tail -c 5000 "$M/trunc/sparse" | md5sum)" "$(md5sum < /tmp/chunk)" "data after the hole"
: > "$M/trunc/f0"
printf 'xyz' > "$M/trunc/f0"
: > "$M/trunc/f0"
eq "$(fsize "$M/trunc/f0")" 0 "size after O_TRUNC open"

step "deep tree: mkdir -p 30 levels, find"
p=$M/deep
for i in $(seq -w 1 30); do p=$p/d$i; done
mkdir -p "$p"
echo bottom > "$p/leaf"
eq "$(find "$M/deep" -type d | wc -l)" 31 "directories found under deep/"
eq "$(find "$M/deep" -name leaf)" "$p/leaf" "find -name leaf"
drop_caches
eq "$(cat "$p/leaf")" bottom "content of the deepest file"

step "list a directory of 20000 entries"
[ -d "$M/big" ] || fail "big/ (created by the host before boot) is missing"
ls "$M/big" > /tmp/biglist
eq "$(wc -l < /tmp/biglist)" 20000 "entries in big/"
eq "$(sort -u /tmp/biglist | wc -l)" 20000 "distinct entries in big/"
for f in f00000 f00001 f09999 f12345 f19998 f19999; do
  grep -qx "$f" /tmp/biglist || fail "big/$f missing from the listing"
done
eq "$(head -n 1 /tmp/biglist)" f00000 "first name"
eq "$(tail -n 1 /tmp/biglist)" f19999 "last name"
eq "$(cat "$M/big/f12345")" f12345 "content of big/f12345"
eq "$(ls -l "$M/big" | grep -c '^-')" 20000 "regular files in ls -l big/"

step "list big/ on a nordirplus mount (names, types and file ids only)"
mkdir -p /mnt-nrp
mount -t "$FSTYPE" -o "$OPTS,nordirplus,nosharecache" "$SERVER:$MNTPATH" /mnt-nrp
# What getdents gives, as "file-id type name" lines: busybox's ls and
# find would stat every entry (20,000 LOOKUPs, most of a minute here).
dirents /mnt-nrp/big > /tmp/biglist-i
# Counted inside awk: busybox awk writes each line to a pipe on its own,
# 20,000 writes that take seconds in the emulated guest.
eq "$(awk '$3 != "." && $3 != ".." { n++ } END { print n + 0 }' /tmp/biglist-i)" 20000 \
  "entries in big/ without attributes"
eq "$(awk '$3 ~ /^f[0-9][0-9][0-9][0-9][0-9]$/ && !seen[$3]++ { n++ } END { print n + 0 }' /tmp/biglist-i)" 20000 \
  "distinct names in big/ without attributes"
for f in f00000 f12345 f19999; do
  eq "$(awk -v f="$f" '$3 == f { print $1 }' /tmp/biglist-i)" "$(stat -c %i "$M/big/$f")" \
    "file id of big/$f as listed and as stat'ed"
done
# The type of each entry (8: regular file) where the client asks for it:
# Linux 6.12's NFSv4 READDIR does, 6.1's does not without readdirplus,
# and NFSv3's READDIR has no types, so the client says "unknown" (0).
types=$(awk '$3 ~ /^f/ { t[$2] = 1 } END { for (k in t) print k }' /tmp/biglist-i | sort -n | tr '\n' ' ')
case "$VERS/$(uname -r)" in
  3/* | 4*/6.1.*) want_types="0 " ;;
  *) want_types="8 " ;;
esac
eq "$types" "$want_types" "types listed in big/ without attributes"
umount /mnt-nrp

step "list a directory right after the host changed a listed file"
# The server keeps the attributes its listings stat'ed (here for an hour:
# the test's --listing-cache-ms); the host's change must still show in
# the next listing.
mkdir "$M/lc"
for i in $(seq 1 20); do echo listed > "$M/lc/f$i"; done
ls -l "$M/lc" > /dev/null
drop_caches
ls -l "$M/lc" > /dev/null
ctl change "${CTL_PREFIX}lc/f7"
drop_caches
eq "$(ls -l "$M/lc" | awk '$NF == "f7" { print $1, $5 }')" "-rw------- 5" "mode and size of lc/f7 as listed after the host changed it"
eq "$(ls -l "$M/lc" | awk '$NF == "f8" { print $1, $5 }')" "-rw-r--r-- 7" "mode and size of lc/f8, not changed"

step "rename files and a directory across directories"
mkdir -p "$M/ren/a/sub" "$M/ren/b"
echo one > "$M/ren/a/file1"
echo two > "$M/ren/a/sub/inner"
echo victim > "$M/ren/b/victim"
echo replacement > "$M/ren/a/repl"
mv "$M/ren/a/file1" "$M/ren/b/file1-moved"
mv "$M/ren/a/sub" "$M/ren/b/sub-moved"
mv "$M/ren/a/repl" "$M/ren/b/victim"
drop_caches
for gone in a/file1 a/sub a/repl; do
  [ ! -e "$M/ren/$gone" ] || fail "ren/$gone still exists after rename"
done
eq "$(ls -A "$M/ren/a" | wc -l)" 0 "entries left in ren/a"
eq "$(cat "$M/ren/b/file1-moved")" one "renamed file"
eq "$(cat "$M/ren/b/sub-moved/inner")" two "file inside the renamed directory"
eq "$(cat "$M/ren/b/victim")" replacement "file renamed over an existing one"
eq "$(ls "$M/ren/b" | tr '\n' ' ')" "file1-moved sub-moved victim " "ren/b listing"

step "hard link and symlink"
mkdir "$M/links"
echo content > "$M/links/orig"
ln "$M/links/orig" "$M/links/hard"
eq "$(stat -c %h "$M/links/orig")" 2 "link count of orig"
eq "$(stat -c %h "$M/links/hard")" 2 "link count of hard"
eq "$(ls -i "$M/links/hard" | awk '{print $1}')" "$(ls -i "$M/links/orig" | awk '{print $1}')" "inode of hard vs orig"
echo more >> "$M/links/hard"
drop_caches
eq "$(cat "$M/links/orig" | tr '\n' ' ')" "content more " "orig after appending through hard"
ln -s orig "$M/links/sym"
eq "$(readlink "$M/links/sym")" orig "readlink sym"
eq "$(stat -c %F "$M/links/sym")" "symbolic link" "type of sym"
eq "$(head -n 1 "$M/links/sym")" content "reading through sym"
ln -s "../data/does-not-exist" "$M/links/dangling"
eq "$(readlink "$M/links/dangling")" "../data/does-not-exist" "readlink dangling"

step "chmod, chown, touch -d"
mkdir "$M/attrs" "$M/attrs/d"
echo x > "$M/attrs/f"
chmod 0640 "$M/attrs/f"
chmod 0751 "$M/attrs/d"
chown 1234:5678 "$M/attrs/f"
chown 4321:8765 "$M/attrs/d"
touch -d '2001-02-03 04:05:06' "$M/attrs/f"
eq "$(stat -c '%a %u %g %Y' "$M/attrs/f")" "640 1234 5678 981173106" "attrs/f before remount"
remount
eq "$(stat -c '%a %u %g %Y' "$M/attrs/f")" "640 1234 5678 981173106" "attrs/f after remount"
eq "$(stat -c '%a %u %g' "$M/attrs/d")" "751 4321 8765" "attrs/d after remount"
eq "$(cat "$M/attrs/f")" x "attrs/f content"

step "rm -r of a tree, and removing an open file"
mkdir -p "$M/rmtree/x/y/z"
for d in "$M/rmtree" "$M/rmtree/x" "$M/rmtree/x/y" "$M/rmtree/x/y/z"; do
  for i in $(seq 1 25); do echo "$i" > "$d/file$i"; done
  ln -s file1 "$d/link"
done
rm -r "$M/rmtree"
[ ! -e "$M/rmtree" ] || fail "rmtree still exists after rm -r"
drop_caches
ls "$M" > /tmp/rootlist
if grep -qx rmtree /tmp/rootlist; then fail "rmtree still listed after rm -r"; fi
mkdir "$M/silly"
echo still-readable > "$M/silly/f"
exec 4< "$M/silly/f"
rm "$M/silly/f"
[ ! -e "$M/silly/f" ] || fail "silly/f visible after rm"
eq "$(cat <&4)" still-readable "reading an open file after rm"
exec 4<&-
# The client removes its .nfsXXXX placeholder once the file is closed.
n=0
while [ -n "$(ls -A "$M/silly")" ]; do
  n=$((n + 1))
  [ "$n" -le 300 ] || fail "silly/ still holds $(ls -A "$M/silly") 30 s after close"
  sleep 0.1
done

step "exclusive create"
mkdir "$M/excl"
expect_rc 0 excl_create "$M/excl/new"
eq "$(stat -c '%s %a' "$M/excl/new")" "0 644" "size and mode of an O_EXCL-created file"
now=$(date +%s)
mt=$(stat -c %Y "$M/excl/new")
[ "$mt" -ge $((now - 3600)) ] && [ "$mt" -le $((now + 3600)) ] ||
  fail "mtime of an O_EXCL-created file is $mt, guest time is $now (create verifier leaked?)"
expect_rc 17 excl_create "$M/excl/new"
(set -C; echo first > "$M/excl/noclobber") || fail "set -C: creating a new file failed"
if (set -C; echo second > "$M/excl/noclobber") 2> /dev/null; then
  fail "set -C: writing over an existing file succeeded"
fi
eq "$(cat "$M/excl/noclobber")" first "content after the refused overwrite"
# The client has just seen that excl/hostmade does not exist; the host then
# creates it behind the client's back, so the O_EXCL open has to be refused
# by the server.
[ ! -e "$M/excl/hostmade" ] || fail "excl/hostmade exists before the host made it"
ctl mkfile "${CTL_PREFIX}excl/hostmade"
expect_rc 17 excl_create "$M/excl/hostmade"
eq "$(cat "$M/excl/hostmade")" host "excl/hostmade after the refused O_EXCL open"

step "extended attributes (NFS $VERS)"
: > "$M/xa"
if [ "$VERS" = 4.2 ]; then
  setfattr -n user.color -v blue "$M/xa" || fail "setfattr user.color"
  eq "$(getfattr --only-values -n user.color "$M/xa")" blue "getfattr user.color"
  ctl xattr xa color blue
  # The host gave the file user.host: the client sees it once its cached
  # attributes are revalidated.
  sync
  echo 3 > /proc/sys/vm/drop_caches
  eq "$(getfattr --only-values -n user.host "$M/xa")" "from the host" "getfattr of an attribute set on the server"
  eq "$(getfattr -d --absolute-names "$M/xa" | grep -c '^user\.')" 2 "attributes listed by getfattr -d"
  setfattr -n user.color -v green "$M/xa" || fail "setfattr user.color again"
  eq "$(getfattr --only-values -n user.color "$M/xa")" green "getfattr user.color after the change"
  setfattr -x user.color "$M/xa" || fail "setfattr -x user.color"
  if getfattr -n user.color "$M/xa" > /dev/null 2>&1; then
    fail "user.color is still there after setfattr -x"
  fi
  ctl no-xattr xa color
  mkdir "$M/xadir"
  setfattr -n user.d -v dir "$M/xadir" || fail "setfattr on a directory"
  eq "$(getfattr --only-values -n user.d "$M/xadir")" dir "getfattr on a directory"
  big=$(awk 'BEGIN { while (n++ < 3000) printf "v" }')
  setfattr -n user.big -v "$big" "$M/xa" || fail "setfattr of a 3000-byte value"
  eq "$(getfattr --only-values -n user.big "$M/xa")" "$big" "a 3000-byte value"
else
  # Extended attributes are NFSv4.2: a 4.1 mount has none.
  if setfattr -n user.color -v blue "$M/xa" 2> /tmp/xa.err; then
    fail "setfattr worked on an NFS $VERS mount"
  fi
  grep -q "Operation not supported" /tmp/xa.err || fail "setfattr on NFS $VERS: $(cat /tmp/xa.err)"
fi

step "flock between two processes"
mkdir "$M/locks"
echo data > "$M/locks/f"
(flock -w 60 "$M/locks/f" sh -c 'echo held > /tmp/ready; read x < /tmp/release' ||
  echo "error: flock exited $?" > /tmp/ready) &
holder=$!
read -r r < /tmp/ready
eq "$r" held "background flock"
expect_rc 1 flock -n "$M/locks/f" true
echo go > /tmp/release
wait "$holder"
expect_rc 0 flock -n "$M/locks/f" true
expect_rc 0 flock -n -s "$M/locks/f" true

step "fcntl byte-range locks between two processes"
head -c 4096 /dev/zero > "$M/locks/g"
hold_lock "$M/locks/g" 1 0 100 /tmp/ready /tmp/release &
holder=$!
read -r r < /tmp/ready
eq "$r" held "background write lock on bytes 0-99"
expect_rc 3 try_lock "$M/locks/g" 1 50 100      # overlaps the held range
expect_rc 3 try_lock "$M/locks/g" 0 0 0         # read lock on the whole file
expect_rc 0 try_lock "$M/locks/g" 1 100 100     # bytes 100-199: free
if [ "${LOCK:-0}" = 1 ]; then
  ctl nlm-held "${CTL_PREFIX}locks/g" 0 100    # the server has the lock
fi
echo go > /tmp/release
wait "$holder"
expect_rc 0 try_lock "$M/locks/g" 1 0 0
hold_lock "$M/locks/g" 0 0 0 /tmp/ready /tmp/release &
holder=$!
read -r r < /tmp/ready
eq "$r" held "background read lock on the whole file"
expect_rc 0 try_lock "$M/locks/g" 0 0 0         # shared with the reader
expect_rc 3 try_lock "$M/locks/g" 1 4000 10     # a writer must wait
echo go > /tmp/release
wait "$holder"
expect_rc 0 try_lock "$M/locks/g" 1 0 0

step "server restart while mounted"
mkdir "$M/rs"
new_random "$M/rs/before" 3000000
sync
exec 5> "$M/rs/open-across"
printf 'before\n' >&5
sync
ctl restart
echo "server restarted; checking files"
# The files of at most 64 MiB, this step's among them, read through the
# restarted server; the 256 MiB one was read whole after the remount
# above, and reading it again takes half a minute in the emulated guest.
verify_all "after the server restart" 67108864
printf 'after\n' >&5
exec 5>&-
drop_caches
eq "$(cat "$M/rs/open-across" | tr '\n' ' ')" "before after " "file held open across the restart"
echo "$(printf 'before\nafter\n' | md5sum | cut -d' ' -f1)  $M/rs/open-across" >> "$SUMS"
new_random "$M/rs/after" 2000000
mkdir "$M/rs/newdir"
echo fresh > "$M/rs/newdir/fresh"
mv "$M/rs/newdir/fresh" "$M/rs/fresh"
remount
grep "  $M/rs/" "$SUMS" > /tmp/rs-sums
md5sum -c /tmp/rs-sums > /tmp/md5check 2>&1 || {
  grep -v ': OK$' /tmp/md5check
  fail "after the restart and a remount: file contents differ from what was written"
}
eq "$(cat "$M/rs/fresh")" fresh "file created after the restart"
eq "$(stat -c '%a %u %g %Y' "$M/attrs/f")" "640 1234 5678 981173106" "attrs/f after the restart"
eq "$(ls "$M/big" | wc -l)" 20000 "entries in big/ after the restart"

if [ "${RECLAIM:-0}" = 1 ]; then
  # The server is killed (SIGKILL) and started again under a process that
  # holds recl/f open, wrote and fsynced it, and holds a write lock on
  # bytes LSTART..LSTART+LLEN-1 (RFC 8881 section 8.4.2). The host checks
  # the server's side inside each control request, before it answers.
  LSTART=1000
  LLEN=100
  step "crash recovery: the open file and the lock are reclaimed; another client gets GRACE, then DENIED"
  mkdir "$M/recl"
  awk 'BEGIN { for (i = 1; i <= 4000; i++) printf "%06d written before the crash\n", i }' > /tmp/recl-expect
  lock_holder "$M/recl/f" $LSTART $LLEN /tmp/recl-expect &
  holder=$!
  read -r hr < /tmp/hreply
  eq "$hr" held "the lock holder (recl/f written, fsynced and locked)"
  expect_rc 3 try_lock "$M/recl/f" 1 $((LSTART + 10)) 10
  # The host opens recl/f as a second client, restarts the server, reclaims
  # its own open, and its LOCK and LOCKT get GRACE: we have not reclaimed.
  ctl reclaim-restart recl/f $LSTART $LLEN
  holder_do "write after the first restart"
  eq "$hr" ok "writing (and fsync) through the descriptor held across the restart"
  echo "after the first restart" >> /tmp/recl-expect
  # Grace is over now that we reclaimed, and the host's LOCK gets DENIED.
  ctl reclaimed-denied recl/f $LSTART $LLEN
  expect_rc 3 try_lock "$M/recl/f" 1 $LSTART $LLEN          # another process: still locked
  expect_rc 3 try_lock "$M/recl/f" 0 $((LSTART + LLEN - 1)) 1
  expect_rc 0 try_lock "$M/recl/f" 1 $((LSTART + LLEN)) 100  # just past the range: free
  drop_caches
  holder_do check
  eq "$hr" ok "reading recl/f back through the held descriptor"
  eq "$(md5 "$M/recl/f")" "$(md5 /tmp/recl-expect)" "recl/f read by another process"

  step "crash recovery after two restarts in a row"
  ctl restart-twice
  holder_do "write after two restarts"
  eq "$hr" ok "writing (and fsync) through the descriptor held across two restarts"
  echo "after two restarts" >> /tmp/recl-expect
  ctl denied recl/f $LSTART $LLEN
  expect_rc 3 try_lock "$M/recl/f" 1 $LSTART 1
  drop_caches
  holder_do check
  eq "$hr" ok "reading recl/f back through the descriptor held across two restarts"
  eq "$(md5 "$M/recl/f")" "$(md5 /tmp/recl-expect)" "recl/f after two restarts"

  step "back after the grace period: the reclaim is refused and the lock is lost"
  # The host restarts the server with a 2 s grace period and waits for it
  # to run out before answering: our reclaim comes too late (NO_GRACE).
  ctl restart-past-grace 2
  holder_do "write after grace ended"
  echo "the lock holder's write after grace ended: $hr"
  case "$hr" in
    "error "*"Input/output error") ;;
    *) fail "a write through the descriptor whose lock was lost: expected EIO, got '$hr'" ;;
  esac
  # The host sees the NO_GRACE it answered, and takes the lock itself.
  ctl refused-free recl/f $LSTART $LLEN
  holder_do quit
  echo "the lock holder's close: $hr"
  wait "$holder" || fail "the lock holder exited $?"
  drop_caches
  eq "$(md5 "$M/recl/f")" "$(md5 /tmp/recl-expect)" \
    "recl/f after the refused reclaim (what was written before is intact, the failed write is not there)"
  echo "$(md5 /tmp/recl-expect)  $M/recl/f" >> "$SUMS"
  expect_rc 0 try_lock "$M/recl/f" 1 $LSTART $LLEN
fi

step "unmount"
cd /
while read -r sum path; do
  echo "MANIFEST $CTL_PREFIX${path#$M/} $sum $(fsize "$path")"
done < "$SUMS"
umount "$M" || fail "final umount"
echo "ALL STEPS PASSED (NFS $VERS, kernel $(uname -r))"
if [ "${THEN_V3:-0}" = 1 ]; then
  trap - EXIT
  VERS=3 M=/mnt3 MNTPATH=/v3 CTL_PREFIX=v3/ SIZES="$V3_SIZES" THEN_V3=0 RECLAIM=0 LOCK="${V3_LOCK:-0}" \
    /bin/sh "$0"
fi
