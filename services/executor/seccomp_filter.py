"""The seccomp filter bwrap applies to a managed run's command (`--seccomp FD`).

An allowlist for x86_64, compiled to classic BPF by libseccomp (Debian's
libseccomp2, through `pyseccomp`'s ctypes bindings): the library, not this
module, writes the architecture check, the syscall-number dispatch and the
argument comparisons, which are where hand-assembled filters go wrong.

What a command may call is what ordinary programs need (sh, coreutils,
python3, a static binary, threads, sockets): Docker's default profile for an
unprivileged container, minus what an unprivileged process in a user
namespace could still use to reach kernel surface it has no business with.
Everything else fails with EPERM, and:

- no namespaces: `unshare`, `setns` and `clone` with any CLONE_NEW* flag are
  refused; `clone3` (whose flags sit in a struct the filter cannot read)
  answers ENOSYS, so glibc falls back to `clone`, which the filter can check;
- no mounts (`mount`, `umount2`, `pivot_root`, `chroot`, the new mount API),
  no `ptrace` or `process_vm_*`, no kernel keyrings (`keyctl`, `add_key`,
  `request_key`), no `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`,
  no `kexec_*`, module loading, `reboot`, `swapon`/`swapoff`, no
  `open_by_handle_at`/`name_to_handle_at`, no clock setting, `acct`,
  `quotactl`, `syslog`, `iopl`/`ioperm`;
- `personality` only with the values that do not turn off ASLR (Docker's:
  0, PER_LINUX32, UNAME26, both, and 0xffffffff to read it);
- `socket` only for AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (getaddrinfo
  asks the kernel for interface addresses over netlink); no AF_PACKET,
  AF_VSOCK, AF_ALG, AF_KEY, ...
- a syscall of another architecture (i386's `int 0x80` from an x86_64
  process; x32 numbers) kills the process: a filter written for one table of
  syscall numbers means nothing for another.

Why EPERM and not a kill for what is not allowed: runtimes probe (glibc,
Python, the JVM and Go call a syscall and fall back when it fails), and a
probe that kills the process makes ordinary programs die with SIGSYS on
kernels or libcs newer than this list. EPERM is the error an unprivileged
process already gets for most of these calls, so a program that handles its
own lack of privilege handles the filter too; the command's output then
carries a readable "Operation not permitted" and the run fails by its exit
code like any other failure.

bwrap needs several of these calls itself (clone with namespace flags,
mount, pivot_root) to build the sandbox: it applies the filter to the
sandboxed command only, just before exec'ing it.
"""

from __future__ import annotations

import errno
import platform
import tempfile

# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
# | CLONE_NEWPID | CLONE_NEWNET: a clone with any of them is refused.
CLONE_NEW_FLAGS = 0x7E020000
# personality(2) values that keep ASLR on: PER_LINUX, PER_LINUX32, UNAME26,
# UNAME26|PER_LINUX32, and 0xffffffff (read the current persona).
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
# AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
SOCKET_FAMILIES = (1, 2, 10, 16)


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Allowed unconditionally (x86_64 names). Not here, so EPERM: see the module's
# docstring; also everything added to the kernel after this list was written.
ALLOWED = _names(
    """
accept accept4 access alarm arch_prctl bind brk capget capset chdir chmod chown
clock_getres clock_gettime clock_nanosleep close close_range connect
copy_file_range creat dup dup2 dup3 epoll_create epoll_create1 epoll_ctl
epoll_pwait epoll_pwait2 epoll_wait eventfd eventfd2 execve execveat exit
exit_group faccessat faccessat2 fadvise64 fallocate fchdir fchmod fchmodat
fchown fchownat fcntl fdatasync fgetxattr flistxattr flock fork fremovexattr
fsetxattr fstat fstatfs fsync ftruncate futex futex_waitv futimesat getcpu
getcwd getdents getdents64 getegid geteuid getgid getgroups getitimer
getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid
getresuid getrlimit get_robust_list getrusage getsid getsockname getsockopt
gettid gettimeofday getuid getxattr inotify_add_watch inotify_init
inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents
io_pgetevents ioprio_get ioprio_set io_setup io_submit kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lgetxattr link linkat
listen listxattr llistxattr lremovexattr lseek lsetxattr lstat madvise
membarrier memfd_create mincore mkdir mkdirat mknod mknodat mlock mlock2
mlockall mmap modify_ldt mprotect mq_getsetattr mq_notify mq_open
mq_timedreceive mq_timedsend mq_unlink mremap msgctl msgget msgrcv msgsnd msync
munlock munlockall munmap nanosleep newfstatat open openat openat2 pause
pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll
ppoll prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pwrite64
pwritev pwritev2 read readahead readlink readlinkat readv recvfrom recvmmsg
recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall
rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo
rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_tgsigqueueinfo sched_getaffinity
sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
sched_getscheduler sched_rr_get_interval sched_setaffinity sched_setattr
sched_setparam sched_setscheduler sched_yield seccomp select semctl semget
semop semtimedop sendfile sendmmsg sendmsg sendto setfsgid setfsuid setgid
setgroups setitimer setpgid setpriority setregid setresgid setresuid setreuid
setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address
setuid setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd
signalfd4 socketpair splice stat statfs statx symlink symlinkat sync
sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
timer_getoverrun timer_gettime timer_settime timerfd_create timerfd_gettime
timerfd_settime times tkill truncate umask uname unlink unlinkat utime
utimensat utimes vfork vmsplice wait4 waitid write writev
"""
)

# Named in tests and docs: each of these must stay out of ALLOWED.
DENIED = _names(
    """
mount umount2 pivot_root chroot move_mount open_tree fsopen fsconfig fsmount
fspick mount_setattr unshare setns ptrace process_vm_readv process_vm_writev
keyctl add_key request_key bpf perf_event_open kexec_load kexec_file_load
init_module finit_module delete_module reboot swapon swapoff open_by_handle_at
name_to_handle_at userfaultfd io_uring_setup io_uring_enter io_uring_register
acct quotactl settimeofday clock_settime adjtimex clock_adjtime syslog iopl
ioperm sethostname setdomainname kcmp pidfd_getfd fanotify_init lookup_dcookie
vhangup
"""
)


class FilterUnavailable(RuntimeError):
    """The filter cannot be built here (no libseccomp, another architecture)."""


def compile_filter() -> bytes:
    """The filter as the array of `struct sock_filter` bwrap's --seccomp reads."""
    if platform.machine() != "x86_64":
        raise FilterUnavailable(
            f"the seccomp allowlist is written for x86_64, not {platform.machine()}"
        )
    try:
        import pyseccomp as sc  # ctypes: loads libseccomp.so.2 when imported
    except (ImportError, OSError, RuntimeError) as e:
        raise FilterUnavailable(
            f"libseccomp is unavailable ({e}): install Debian's libseccomp2 and pyseccomp"
        ) from e
    f = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
    # The native arch (x86_64) is the filter's only one: anything else is killed.
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in ALLOWED:
        f.add_rule(sc.ALLOW, name)
    f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEW_FLAGS, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for persona in PERSONALITIES:
        f.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.EQ, persona))
    for family in SOCKET_FAMILIES:
        f.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, family))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
