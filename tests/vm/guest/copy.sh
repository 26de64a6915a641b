#!/bin/sh
# Guest side of tests/interop/test_linux_copy.py: CLONE and COPY with the
# Linux kernel NFS client (NFS 4.2) against a server exporting /x (xfs,
# with shared extents) and /e (ext4, without), on $SERVER:$PORT. Needs the
# coreutils cp at /usr/bin/cp (--bin), for --reflink, and perl (--bin),
# for a copy_file_range of a whole file.
#
# The host made x/src (64 MiB of random bytes), e/src (1 MiB), e/big
# (256 MiB) and e/sparse (30 MiB: three 1 MiB pieces of data, holes
# between). Then:
#   cp --reflink=always x/src x/dst  must work, with CLONE calls and no
#                                    READ or WRITE of the data; "shared
#                                    x/dst" asks the host to check the
#                                    server's file shares its extents
#                                    and has the source's bytes
#   cp --reflink=always e/src e/dst  must fail with "Operation not
#                                    supported" (the server answers
#                                    NFS4ERR_NOTSUPP)
#   cp e/big e/big.copy              COPY calls and no READ or WRITE of
#                                    the data; "same e/big.copy e/big"
#                                    asks the host to compare the bytes
#   copy_file_range e/sparse into e/sparse.copy (one call for the whole
#   file), and cp e/sparse e/sparse.cp: "holes e/sparse.copy e/sparse"
#                                    asks the host to check that the copy
#                                    has the source's bytes and its data
#                                    and holes (SEEK_DATA/SEEK_HOLE)
# Every check that fails stops the script with a non-zero status.

set -eu
set -o pipefail

: "${SERVER:?}" "${PORT:?}" "${CTL_PORT:?}"
M=/mnt
OPTS="vers=4.2,port=$PORT,addr=$SERVER,proto=tcp,sec=sys"
STEP=setup
. /etc/sluice-vm/lib/common.sh

# "NAME COUNT" for each op of the mount on $1 (mountstats; each export is
# a mount of its own, below the pseudo root on $M).
opcounts() {
  awk -v m="$1" '
    $1 == "device" { mine = ($5 == m && $8 ~ /^nfs/); ops = 0; next }
    mine && /per-op statistics/ { ops = 1; next }
    mine && ops && $1 ~ /:$/ && NF >= 2 { sub(/:$/, "", $1); print $1, $2 }
  ' /proc/self/mountstats
}
delta() { # OP BEFORE AFTER: how many OP calls between the two counts
  b=$(awk -v op="$1" '$1 == op { print $2 }' "$2")
  a=$(awk -v op="$1" '$1 == op { print $2 }' "$3")
  echo $(( ${a:-0} - ${b:-0} ))
}

[ -x /usr/bin/cp ] || fail "/usr/bin/cp (coreutils) is missing in the guest (--bin /usr/bin/cp)"
command -v perl > /dev/null || fail "perl is missing in the guest (--bin /usr/bin/perl)"

step "mount (NFS 4.2, kernel $(uname -r))"
mount -t nfs4 -o "$OPTS" "$SERVER:/" "$M" || fail "mount -t nfs4 -o $OPTS $SERVER:/ $M"
[ -f "$M/x/src" ] && [ -f "$M/e/src" ] || fail "x/src or e/src (made by the host) is missing"

step "cp --reflink=always on the xfs export"
ls "$M/x" > /dev/null  # the export's own mount, for its counts
opcounts "$M/x" > /tmp/before
/usr/bin/cp --reflink=always "$M/x/src" "$M/x/dst" || fail "cp --reflink=always x/src x/dst"
opcounts "$M/x" > /tmp/after
[ -s /tmp/after ] || fail "no mountstats for $M/x"
clones=$(delta CLONE /tmp/before /tmp/after)
reads=$(delta READ /tmp/before /tmp/after)
writes=$(delta WRITE /tmp/before /tmp/after)
echo "CLONE_CALLS clone=$clones read=$reads write=$writes"
[ "$clones" -ge 1 ] || fail "cp --reflink=always sent no CLONE"
eq "$reads $writes" "0 0" "READ and WRITE calls of cp --reflink=always"
ctl shared x/dst
eq "$(stat -c %s "$M/x/dst")" "$(stat -c %s "$M/x/src")" "size of the clone"
cmp "$M/x/src" "$M/x/dst" || fail "the clone's bytes differ from the source's"

step "cp --reflink=always on the ext4 export"
if /usr/bin/cp --reflink=always "$M/e/src" "$M/e/dst" 2> /tmp/cp.err; then
  fail "cp --reflink=always worked on ext4"
fi
cat /tmp/cp.err
grep -q "Operation not supported" /tmp/cp.err || fail "cp --reflink=always on ext4: $(cat /tmp/cp.err)"

step "cp of 256 MiB on the ext4 export: server-side COPY"
opcounts "$M/e" > /tmp/before
/usr/bin/cp "$M/e/big" "$M/e/big.copy" || fail "cp e/big e/big.copy"
opcounts "$M/e" > /tmp/after
copies=$(delta COPY /tmp/before /tmp/after)
reads=$(delta READ /tmp/before /tmp/after)
writes=$(delta WRITE /tmp/before /tmp/after)
echo "COPY_CALLS copy=$copies read=$reads write=$writes"
[ "$copies" -ge 1 ] || fail "cp sent no COPY"
eq "$reads $writes" "0 0" "READ and WRITE calls of cp"
eq "$(stat -c %s "$M/e/big.copy")" "$(stat -c %s "$M/e/big")" "size of the copy"
ctl same e/big.copy e/big

step "copy_file_range of a sparse file: holes stay holes"
# One copy_file_range call for the whole file (NULL offsets: the files'
# positions), then calls until it says 0; syscall 326 on x86_64.
perl -e 'open(I, "<", $ARGV[0]) or die "$ARGV[0]: $!\n";
         open(O, ">", $ARGV[1]) or die "$ARGV[1]: $!\n";
         while (1) {
           my $n = syscall(326, fileno(I), 0, fileno(O), 0, 1 << 30, 0);
           die "copy_file_range: $!\n" if $n < 0;
           last if $n == 0;
           print "copied $n\n";
         }' "$M/e/sparse" "$M/e/sparse.copy" || fail "copy_file_range e/sparse e/sparse.copy"
ctl holes e/sparse.copy e/sparse
/usr/bin/cp "$M/e/sparse" "$M/e/sparse.cp" || fail "cp e/sparse e/sparse.cp"
ctl holes e/sparse.cp e/sparse

step "unmount"
umount "$M" || fail "umount"
echo "ALL STEPS PASSED (kernel $(uname -r))"
