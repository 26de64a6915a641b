# Sourced by the guest scripts (busybox sh, set -eu): steps, checks, the
# control port, and fcntl locks through perl. The script sets STEP's first
# value, SERVER and CTL_PORT.

step() {
  STEP=$1
  echo "---- step: $STEP (guest uptime $(cut -d' ' -f1 /proc/uptime)s)"
}

fail() {
  echo "FAIL in step '$STEP': $*"
  exit 1
}

eq() { # actual expected what
  [ "$1" = "$2" ] || fail "$3: expected '$2', got '$1'"
}

expect_rc() { # wanted-status command...
  want=$1
  shift
  set +e
  "$@"
  got=$?
  set -e
  [ "$got" = "$want" ] || fail "'$*' exited $got, expected $want"
}

# Test data made fast. /dev/urandom and busybox's pipes and tee ran at
# 2-6 MB/s in an emulated guest (writing the test files was most of a
# boot's time), so 1 MiB + 13 random bytes are drawn once and repeated,
# by perl, from an offset chosen per file (files made so differ at the
# same offsets). The period is odd, so no two aligned blocks of 256
# bytes or more within the first 256 MiB hold the same bytes: a block
# written to or read from the wrong offset still changes the md5.
#
# With RB_HOST=1 the period comes from the host ("period" on $CTL_PORT),
# which then also answers the md5 of any count and offset of it ("md5
# COUNT OFFSET"): the guest need not make the bytes a second time and
# hash them (md5sum of a pipe runs at about 17 MB/s here, so a 256 MiB
# file cost 15 s more than its write).
RB_PERIOD=/tmp/.random-period
RB_LEN=1048589
random_offset() { # a random offset into the period
  if [ ! -s "$RB_PERIOD" ]; then
    if [ "${RB_HOST:-0}" = 1 ]; then
      # (Failures to stderr: callers capture stdout.)
      echo period | nc "$SERVER" "$CTL_PORT" > "$RB_PERIOD" || fail "control request 'period': nc failed" >&2
      eq "$(wc -c < "$RB_PERIOD")" "$RB_LEN" "size of the period from the host" >&2
    else
      head -c "$RB_LEN" /dev/urandom > "$RB_PERIOD"
    fi
  fi
  echo $(( $(od -An -tu4 -N4 /dev/urandom | tr -d ' ') % RB_LEN ))
}
random_bytes() { # count offset: the same bytes for the same arguments
  perl -e '
    ($n, $pos, $period) = @ARGV;
    open(P, "<", $period) or die "$period: $!";
    binmode P; binmode STDOUT;
    { local $/; $p = <P>; }
    $len = length($p);
    while ($n > 0) {
      $k = $len - $pos;
      $k = $n if $n < $k;
      $w = syswrite(STDOUT, $p, $k, $pos);
      defined($w) or die "random_bytes: write: $!";
      $n -= $w;
      $pos = ($pos + $w) % $len;
    }' "$1" "$2" "$RB_PERIOD"
}
random_md5() { # count offset: the md5 of random_bytes count offset
  if [ "${RB_HOST:-0}" = 1 ]; then
    rm_reply=$(echo "md5 $1 $2" | nc "$SERVER" "$CTL_PORT") || fail "control request 'md5 $1 $2': nc failed" >&2
    case $rm_reply in
      *[!0-9a-f]* | "") fail "control request 'md5 $1 $2': the host replied '$rm_reply'" >&2 ;;
    esac
    eq "${#rm_reply}" 32 "length of the md5 from the host" >&2
    echo "$rm_reply"
  else
    random_bytes "$1" "$2" | md5sum | cut -d' ' -f1
  fi
}
new_random_file() { # path count: write it, print the md5 of what was written
  # Callers run it in $(...), where set -e does not stop at each failure.
  nr_off=$(random_offset) || exit 1
  random_bytes "$2" "$nr_off" > "$1" || fail "writing $1" >&2
  random_md5 "$2" "$nr_off"
}

ctl() { # ask the host; it answers "ok"
  reply=$(echo "$*" | nc "$SERVER" "$CTL_PORT") || fail "control request '$*': nc failed"
  eq "$reply" ok "reply to control request '$*'"
}

# fcntl() byte-range locks through perl (no modules needed). struct flock on
# x86_64: short type, short whence, (pad), off_t start, off_t len, pid_t pid.
# F_SETLK=6, F_SETLKW=7; F_RDLCK=0, F_WRLCK=1.
try_lock() { # file type start len -> 0 granted, 3 conflict, 1 other error
  perl -e '
    open(F, "+<", $ARGV[0]) or exit 1;
    fcntl(F, 6, pack("s s x4 q q i x4", $ARGV[1], 0, $ARGV[2], $ARGV[3], 0)) and exit 0;
    exit(($! + 0 == 11 || $! + 0 == 13) ? 3 : 1);' "$@"
}

hold_lock() { # file type start len ready-fifo release-fifo (run in background)
  perl -e '
    open(F, "+<", $ARGV[0]) or die "open $ARGV[0]: $!";
    $ok = fcntl(F, 7, pack("s s x4 q q i x4", $ARGV[1], 0, $ARGV[2], $ARGV[3], 0));
    open(R, ">", $ARGV[4]) or die; print R ($ok ? "held\n" : "error $!\n"); close R;
    exit 1 unless $ok;
    open(W, "<", $ARGV[5]) or die; $x = <W>; exit 0;' "$@"
}

# The lock holder of the crash recovery steps: creates FILE, writes the
# content of INIT through one descriptor and fsyncs it (syscall 74), takes a
# write lock on LEN bytes at START (F_SETLK) and answers "held" on
# /tmp/hreply; then serves commands from /tmp/hcmd, one line each, answering
# each on /tmp/hreply: "write TEXT" (append TEXT and a newline through the
# same descriptor and fsync: "ok"), "check" (read the whole file back
# through it: "ok" when it is all that was written), "quit" (close:
# "closed"). Failures are answered "error ...".
lock_holder() { # file start len init
  perl -e '
    ($path, $start, $len, $init) = @ARGV;
    sub reply { open(R, ">", "/tmp/hreply") or die "/tmp/hreply: $!"; print R "@_\n"; close R; }
    $data = "";
    sub put {
      my $s = shift;
      defined(sysseek(F, length($data), 0)) or return "error seek: $!";
      my $n = syswrite(F, $s);
      defined($n) or return "error write: $!";
      $n == length($s) or return "error short write: $n of " . length($s);
      syscall(74, fileno(F)) == 0 or return "error fsync: $!";
      $data .= $s;
      return "ok";
    }
    sub check {
      defined(sysseek(F, 0, 0)) or return "error seek: $!";
      my ($got, $buf, $n) = ("", "");
      while ($n = sysread(F, $buf, 65536)) { $got .= $buf; }
      defined($n) or return "error read: $!";
      $got eq $data or return "error content: read " . length($got) . " bytes, wrote " . length($data);
      return "ok";
    }
    open(I, "<", $init) or die "$init: $!";
    { local $/; $first = <I>; }
    close I;
    sysopen(F, $path, 0102, 0644) or do { reply("error open: $!"); exit 1; };
    $r = put($first);
    if ($r eq "ok") {
      $r = fcntl(F, 6, pack("s s x4 q q i x4", 1, 0, $start, $len, 0)) ? "held" : "error lock: $!";
    }
    reply($r);
    exit 1 if $r ne "held";
    while (1) {
      open(C, "<", "/tmp/hcmd") or die "/tmp/hcmd: $!";
      $c = <C>;
      close C;
      chomp $c;
      if ($c =~ /^write (.*)$/) { reply(put("$1\n")); }
      elsif ($c eq "check") { reply(check()); }
      elsif ($c eq "quit") { reply(close(F) ? "closed" : "error close: $!"); exit 0; }
      else { reply("error: unknown command $c"); }
    }' "$@"
}

holder_do() { # command: send it to the lock holder, its answer goes to $hr
  echo "$1" > /tmp/hcmd
  read -r hr < /tmp/hreply
}
