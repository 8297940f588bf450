/* librefang-spare: the cold-hook spawner's prepared spare, as a small static program instead of a fork of the
 * python spawner (engine/process/native_spare.py starts it with posix_spawn and speaks to it; the python spare it
 * replaces is engine/process/sandbox_spare.py `pre_enter` + engine/process/zygote_child.py `prepared_spare`/`exec_hook`,
 * and the keeper/init of engine/process/sandbox_tree.py). Same namespaces, same view, same limits, same messages and
 * exit statuses; the process tree is keeper (this process) -> init (pid 1 of a new PID namespace) -> hook (pid 2).
 *
 * Why C: a python fork of the spawner costs its page tables and copy-on-write faults, three times per call (keeper,
 * init, the hook before its exec); this program is a few pages (docs/architecture.md, "The sandbox").
 *
 * It decides nothing of the policy: what it makes is what it is given (engine/process/sandbox_plan.py, encoded by
 * engine/process/native_spare.py `spawn`), as engine/process/sandbox_mounts.py, sandbox_enter.py `enter_last` and
 * sandbox_tree.py carry it out in python.
 * argv: WIRE parent_pid socket_fd user_ns uid gid namespaces(CLONE_* flags) absent seccomp(hex BPF or "")
 *       n_items steps... [cgroup directory ...]
 * user_ns: 0 (none), 1 (a new one mapping uid and gid to themselves) or @fd (the spawner's kept user namespace, its
 * subordinate ids mapped: engine/process/sandbox_userns.py; joined, then the other namespaces made in it).
 * absent: a path that must not exist when the call comes (a home the view did not cover), or "".
 * steps: the view's, ahead of the call (prepare_view below); the call's directories are bound on it (bind_kept).
 * The call arrives on socket_fd: one message whose data is the encoded call's length (4 bytes, big-endian) and whose
 * SCM_RIGHTS carry stdin, stdout, stderr, the exec error pipe and, optionally, a network namespace; then the encoded
 * call: NUL-terminated strings, a tag then its fields (engine/process/native_spare.py `encode_call`).
 * The hook's process says READY on the socket once the sandbox is prepared, before it waits for the call.
 * Before that, any failure makes the spare exit 0 (the spawner then forks on demand); after it, a failure is the
 * hook's: "sandbox setup failed in the child: ..." on its stderr and exit status 126, or for exec the errno on the
 * exec error pipe and 127.
 *
 * With argv[1] INIT_WIRE ("lfinit/1") it is only an init: a warm hook's (engine/process/sandbox_tree.py
 * split_beside), started by the zygote's spare right after it unshared the PID namespace, beside the hook the spare
 * forks from python (init_main below).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <grp.h>

/* The kernel's own definitions this program needs, here rather than from the linux/ headers: it builds with musl too
 * (whose static start-up does not ask the CPU for its caches, as a static glibc's does on every spawn). */
#define CAP_VERSION_3 0x20080522 /* linux/capability.h */
struct cap_header { uint32_t version; int pid; };
struct cap_data { uint32_t effective, permitted, inheritable; };
struct bpf_insn8 { uint16_t code; uint8_t jt, jf; uint32_t k; }; /* linux/filter.h sock_filter, sock_fprog */
struct bpf_prog { unsigned short len; struct bpf_insn8 *filter; };
#ifndef SECCOMP_MODE_FILTER
#define SECCOMP_MODE_FILTER 2
#endif
#ifndef PR_SET_SECCOMP
#define PR_SET_SECCOMP 22
#endif
#if !defined(SYS_mount_setattr) && (defined(__x86_64__) || defined(__aarch64__))
#define SYS_mount_setattr 442 /* (a libc older than the call) */
#endif
#if !defined(SYS_close_range) && (defined(__x86_64__) || defined(__aarch64__))
#define SYS_close_range 436
#endif

#define WIRE "lfspare/4"
#define READY "R" /* never the first byte of a wait status (low byte: 0, or a signal below 65) */
#define SETUP_FAILED 126
#define MAX_FDS 8
#define MAX_CALL (1 << 20)
#define MAX_ITEMS 4096
#define MAX_COVERS 64
#define MAX_MOUNTS 1024

static const char *absent = ""; /* must not exist when the call comes (a home the view did not cover) */

/* ---- small utilities ---------------------------------------------------------------------------------------- */

static int under(const char *path, const char *top) {
    size_t n = strlen(top);
    while (n > 1 && top[n - 1] == '/') n--;
    if (strncmp(path, top, n) != 0) return 0;
    return path[n] == '\0' || path[n] == '/' || (n == 1 && top[0] == '/');
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static void close_all_but(unsigned int low, int a, int b) { /* every fd >= low except a and b (-1: none) */
    int keep[2] = {a < b ? a : b, a < b ? b : a};
    for (int i = 0; i < 2; i++) {
        if (keep[i] < (int)low) continue;
        if ((unsigned int)keep[i] > low && syscall(SYS_close_range, low, keep[i] - 1, 0) != 0)
            for (int fd = low; fd < keep[i]; fd++) close(fd);
        low = keep[i] + 1;
    }
    if (syscall(SYS_close_range, low, ~0U, 0) != 0)
        for (int fd = low; fd < 65536; fd++) close(fd);
}

static pid_t wait_for(pid_t pid) {
    int status;
    for (;;) {
        if (waitpid(pid, &status, 0) >= 0) return status;
        if (errno != EINTR) return 0;
    }
}

static void exit_like(int status) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none); /* mirror a SIGSEGV without dumping the keeper's core */
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        kill(getpid(), sig);
        _exit(128 + sig);
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

/* ---- failures after the call arrived: the hook's, reported on its stderr ------------------------------------- */

static int call_stderr = -1;

static void fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (call_stderr >= 0) {
        char line[1200];
        int n = snprintf(line, sizeof line, "sandbox setup failed in the child: %s\n", msg);
        if (n > (int)sizeof line - 1) n = sizeof line - 1;
        if (write(call_stderr, line, n) < 0) { /* nothing more to say */ }
    }
    _exit(SETUP_FAILED);
}

static void check(int rc, const char *what) {
    if (rc != 0) fail("%s: %s", what, strerror(errno));
}

/* ---- the view: every mount read-only ---------------------------------------------------------------------- */

/* mount_setattr(2) (Linux >= 5.12; linux/mount.h is not included: it clashes with sys/mount.h on older libcs).
 * Only the attributes named change, so no flag a user namespace locks needs restating. */
#define ATTR_RDONLY 0x1
#define ATTR_NOSUID 0x2
#define ATTR_NODEV 0x4
#define RECURSIVE 0x8000 /* AT_RECURSIVE */
struct attrs { uint64_t set, clr, propagation, userns_fd; };

static int set_attrs(const char *path, uint64_t set, uint64_t clr, int recursive) {
#if defined(SYS_mount_setattr) && !defined(LIBREFANG_NO_MOUNT_SETATTR) /* (tests build it without) */
    struct attrs a = {set, clr, 0, 0};
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, path, recursive ? RECURSIVE : 0, &a, sizeof a);
#else
    (void)path; (void)set; (void)clr; (void)recursive;
    errno = ENOSYS;
    return -1;
#endif
}

static int fast_view; /* mount_setattr works here: the view made read-only in one call, binds' flags set by it */

static void unescape(char *s) { /* mountinfo's octal escapes (\040 for a space), in place */
    char *out = s;
    for (char *p = s; *p;) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '7' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' && p[3] <= '7') {
            *out++ = (char)(((p[1] - '0') << 6) | ((p[2] - '0') << 3) | (p[3] - '0'));
            p += 4;
        } else {
            *out++ = *p++;
        }
    }
    *out = '\0';
}

static int has_option(const char *options, const char *name) {
    size_t n = strlen(name);
    for (const char *p = options; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static char *read_all(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 16384, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len + 1 >= cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) { free(buf); buf = NULL; break; }
            buf = bigger;
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += n;
    }
    close(fd);
    if (buf) buf[len] = '\0';
    return buf;
}

/* The mounts of this namespace with the flags a user namespace locks on them (a bind of one must keep them). */
static struct { char *point; unsigned long locked; } mounts[MAX_MOUNTS];
static int n_mounts;

static unsigned long locked_at(const char *path) {
    size_t best = 0;
    unsigned long flags = 0;
    for (int i = 0; i < n_mounts; i++)
        if (under(path, mounts[i].point) && strlen(mounts[i].point) >= best) {
            best = strlen(mounts[i].point);
            flags = mounts[i].locked;
        }
    return flags;
}

/* Every mount made read-only, one remount each (where mount_setattr is missing), its locked flags kept and
 * recorded. Returns 0, or -1 with errno and *what set when "/" or /sys could not be made read-only (others: best
 * effort). */
static int read_only_mounts(const char **what) {
    char *info = read_all("/proc/self/mountinfo");
    if (!info) { *what = "/proc/self/mountinfo"; return -1; }
    static const struct { const char *name; unsigned long flag; } locked[] = {
        {"nosuid", MS_NOSUID}, {"nodev", MS_NODEV}, {"noexec", MS_NOEXEC}, {"noatime", MS_NOATIME},
        {"nodiratime", MS_NODIRATIME}, {"relatime", MS_RELATIME}, {"strictatime", MS_STRICTATIME}};
    int rc = 0;
    for (char *line = info; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *fields[6];
        int nf = 0;
        for (char *save = NULL, *f = strtok_r(line, " ", &save); f && nf < 6; f = strtok_r(NULL, " ", &save))
            fields[nf++] = f;
        line = next;
        if (nf < 6) continue;
        char *point = fields[4], *options = fields[5];
        unescape(point);
        unsigned long flags = 0;
        for (size_t i = 0; i < sizeof locked / sizeof locked[0]; i++)
            if (has_option(options, locked[i].name)) flags |= locked[i].flag;
        if (n_mounts < MAX_MOUNTS) {
            mounts[n_mounts].point = strdup(point);
            mounts[n_mounts++].locked = flags;
        }
        if (has_option(options, "ro")) continue;
        if (mount(NULL, point, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | flags, NULL) != 0 &&
            (strcmp(point, "/") == 0 || strcmp(point, "/sys") == 0)) {
            *what = strcmp(point, "/") == 0 ? "read-only /" : "read-only /sys";
            rc = -1;
            break;
        }
    }
    free(info);
    return rc;
}

/* ---- the view, ahead of the call: the plan's steps ---------------------------------------------------------- */

/* The steps are engine/process/sandbox_plan.py's, decided there (what is covered, masked, made private, in which
 * order) and encoded by engine/process/native_spare.py `encode_plan`; this program only carries them out, as
 * engine/process/sandbox_mounts.py `prepare_view` does:
 *   C dir            an empty tmpfs over dir (sealed read-only by R), dir reachable below it through a descriptor
 *   M file dir       an unreadable empty file made in dir (a tmpfs of the view, still writable) bound over file
 *   R                every mount read-only, the covers and masks made so far sealed
 *   T dir size_mb    a private tmpfs the hook may write
 *   S path           a mask made after R made read-only
 * A step it does not know fails the spare (the call then goes to a python child). */
#define COVER_FLAGS (MS_NOSUID | MS_NODEV | MS_NOEXEC)
#define MASK ".librefang-mask"

/* covers: what was covered (C, sealed) or made private (T), with a descriptor on it as it is below */
static struct { const char *path; int fd; int sealed; } covers[MAX_COVERS + 2];
static int n_covers;
static const char *unsealed[MAX_COVERS * 2]; /* covers and masks made since the last R (sealed there, the old way) */
static int n_unsealed;

static int is_dir(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int seal(const char *path, int read_only) {
    return mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | COVER_FLAGS | (read_only ? MS_RDONLY : 0), NULL);
}

static int add_cover(const char *path, int sealed) {
    if (n_covers >= MAX_COVERS + 2) return -1;
    covers[n_covers].path = path;
    covers[n_covers].sealed = sealed;
    return (covers[n_covers++].fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 ? -1 : 0;
}

static int note_unsealed(const char *path) {
    if (n_unsealed >= (int)(sizeof unsealed / sizeof unsealed[0])) return -1;
    unsealed[n_unsealed++] = path;
    return 0;
}

static char mask_path[4096]; /* the mask file while masks are bound (unlinked after the last) */

static void drop_mask(void) {
    if (mask_path[0]) unlink(mask_path);
    mask_path[0] = '\0';
}

static int mask_file(const char *file, const char *dir) {
    char want[4096];
    if (snprintf(want, sizeof want, "%s/%s", strcmp(dir, "/") ? dir : "", MASK) >= (int)sizeof want) return -1;
    if (strcmp(want, mask_path) != 0) {
        drop_mask();
        int fd = open(want, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
        if (fd < 0) return -1;
        close(fd);
        snprintf(mask_path, sizeof mask_path, "%s", want);
    }
    if (mount(mask_path, file, NULL, MS_BIND, NULL) != 0) return -1;
    return note_unsealed(file);
}

static int read_only_step(void) {
    if (fast_view) return set_attrs("/", ATTR_RDONLY, 0, 1);
    for (int i = 0; i < n_unsealed; i++) /* (the host's mounts were remounted read-only first: prepare_view) */
        if (seal(unsealed[i], 1) != 0) return -1;
    n_unsealed = 0;
    return 0;
}

/* sandbox_mounts.py prepare_view: `steps` (n items) carried out in order. Returns 0, or -1 (the spare then exits:
 * the call goes to a python child). */
static int prepare_view(char **steps, int n) {
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return -1; /* nothing here reaches the service */
    /* Without mount_setattr the read-only pass is split: the host's mounts are remounted read-only now, before
     * anything is stacked on them (their flags noted, for the binds), the covers and masks sealed at R. */
    fast_view = set_attrs("/", 0, 0, 0) == 0;
    const char *what = NULL;
    if (!fast_view && read_only_mounts(&what) != 0) return -1;
    int rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        const char *tag = steps[i++];
        int need = !strcmp(tag, "M") || !strcmp(tag, "T") ? 2 : !strcmp(tag, "R") ? 0 : 1;
        if (i + need > n) return -1;
        if (tag[0] != 'M') drop_mask();
        if (!strcmp(tag, "C")) {
            rc = add_cover(steps[i], 1);
            if (rc == 0) rc = mount("tmpfs", steps[i], "tmpfs", COVER_FLAGS, "mode=0755,size=64k");
            if (rc == 0) rc = note_unsealed(steps[i]);
        } else if (!strcmp(tag, "M")) {
            rc = mask_file(steps[i], steps[i + 1]);
        } else if (!strcmp(tag, "R")) {
            rc = read_only_step();
        } else if (!strcmp(tag, "T")) {
            char data[64];
            snprintf(data, sizeof data, "mode=1777,size=%ldm", atol(steps[i + 1]));
            rc = add_cover(steps[i], 0);
            if (rc == 0) rc = mount("tmpfs", steps[i], "tmpfs", MS_NOSUID | MS_NODEV, data);
        } else if (!strcmp(tag, "S")) {
            rc = seal(steps[i], 1);
        } else {
            rc = -1;
        }
        i += need;
    }
    drop_mask();
    return rc;
}

static int deepest_cover(const char *path, int want_fd) {
    int best = -1;
    for (int i = 0; i < n_covers; i++)
        if ((!want_fd || covers[i].fd >= 0) && under(path, covers[i].path) &&
            (best < 0 || strlen(covers[i].path) > strlen(covers[best].path)))
            best = i;
    return best;
}

/* ---- keeper and init ---------------------------------------------------------------------------------------- */

static void keeper(pid_t init_pid, int status_r, int report_fd) {
    close_all_but(0, status_r, report_fd); /* the spawner's stdio too: the keeper holds nothing of anyone's */
    int status = wait_for(init_pid);
    int32_t reported;
    fcntl(status_r, F_SETFL, O_NONBLOCK);
    if (read(status_r, &reported, 4) == 4) status = reported; /* the hook's own wait status, reported by init */
    int32_t out = status; /* init is gone, and with it every process of the namespace: the call is over */
    if (write(report_fd, &out, 4) < 0) { /* the spawner gave up on the call */ }
    exit_like(status);
}

static void empty_namespace(void) { /* kill(-1) reaches no process outside the namespace; reap until none is left */
    for (;;) {
        kill(-1, SIGKILL);
        if (waitpid(-1, NULL, 0) < 0) {
            if (errno == EINTR) continue;
            return;
        }
    }
}

static void init_loop(pid_t hook_pid, int status_w, int report_fd) {
    close_all_but(0, status_w, report_fd);
    int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) signal(ignored[i], SIG_IGN);
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            _exit(0);
        }
        if (pid == hook_pid) {
            int32_t report = status;
            empty_namespace(); /* then tell the spawner at once, a wake-up sooner than the keeper can */
            if (write(report_fd, &report, 4) < 0) { /* gone */ }
            if (write(status_w, &report, 4) < 0) { /* gone */ }
            _exit(0);
        }
    }
}

static void become_init(int status_w) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    struct pollfd p = {status_w, POLLOUT, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP))) _exit(137); /* the keeper died before PDEATHSIG */
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
        /* a kernel may refuse a new proc inside a user namespace: then no /proc rather than the service's */
        if (mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k") != 0)
            _exit(SETUP_FAILED);
    } else {
        if (mount("/proc/sys", "/proc/sys", NULL, MS_BIND | MS_REC, NULL) != 0) _exit(SETUP_FAILED);
        mount(NULL, "/proc/sys", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    }
}

/* ---- init alone, for a warm hook forked beside it (engine/process/sandbox_tree.py split_beside) --------------- */

#define INIT_WIRE "lfinit/1"

/* Whether this namespace's /proc lists no process but init and the hook (pid 2). */
static int only_init_and_hook(void) {
    DIR *dir = opendir("/proc");
    if (!dir) return 0;
    int only = 1, init_seen = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        if (!strcmp(e->d_name, "1")) init_seen = 1;
        else if (strcmp(e->d_name, "2")) only = 0;
    }
    closedir(dir);
    return only && init_seen;
}

/* argv: INIT_WIRE report_fd status_fd. pid 1 of a PID namespace its keeper (a warm zygote's spare)
 * has just unshared; the keeper forks the python hook (pid 2) beside it once init says "R" on status_fd (its /proc
 * mounted). init reaps what is left to it, and takes the hook's word that it is done (SIGCONT from pid 2,
 * warmstart_zygote.py `_finalize`): "D" to the keeper (which then waits for init rather than killing it), every
 * process of the namespace killed, exit 0 reported to the zygote (report_fd) and to the keeper (status_fd). Any
 * other end of the hook the keeper sees itself, and kills init. */
static int init_main(int argc, char **argv) {
    if (argc == 2) return 0; /* "do you have an init mode?" (sandbox_tree.py use_native_init); older builds say 2 */
    if (argc != 4) return 2;
    int report_fd = atoi(argv[2]), status_fd = atoi(argv[3]);
    sigset_t waited;
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    sigaddset(&waited, SIGCONT);
    sigprocmask(SIG_SETMASK, &waited, NULL); /* queued for sigwaitinfo, never lost */
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) signal(ignored[i], SIG_IGN);
    close_all_but(0, report_fd, status_fd);
    become_init(status_fd); /* tied to the keeper (outside the namespace: getppid() says 0), a fresh /proc */
    if (write(status_fd, READY, 1) != 1) _exit(137);
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) { /* orphans */ }
        siginfo_t info;
        if (sigwaitinfo(&waited, &info) < 0) continue;
        if (info.si_signo != SIGCONT || info.si_pid != 2) continue;
        if (write(status_fd, "D", 1) < 0) { /* the keeper is gone */ } /* first: the keeper lets init finish */
        kill(-1, SIGKILL); /* the hook too: it was about to _exit, now it cannot do anything else */
        if (!only_init_and_hook()) empty_namespace(); /* someone else was left: killed and reaped first */
        int32_t done = 0;
        if (write(report_fd, &done, 4) < 0) { /* the zygote gave up on the call */ }
        if (write(status_fd, &done, 4) < 0) { /* the keeper is gone */ }
        _exit(0);
    }
}

/* ---- the call ------------------------------------------------------------------------------------------------ */

struct call {
    char *kept_path[64], *kept_real[64];
    int kept_writable[64], n_kept;
    int new_net, netns_index, seccomp;
    long long hook_uid, hook_gid;
    int rl_resource[32];
    long long rl_soft[32], rl_hard[32];
    int n_rlimits;
    char *cwd;
    char *argv[MAX_ITEMS], *env[MAX_ITEMS];
    int argc, envc;
};

static int read_exact(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += r;
    }
    return 0;
}

/* The call's descriptors and its encoded body; exits quietly (0) when the spawner drops the spare first. */
static char *await_call(int sock, int *fds, int *n_fds, uint32_t *length) {
    unsigned char header[4];
    char control[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct iovec iov = {header, sizeof header};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0) _exit(0);
    *n_fds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (int i = 0; i < count && *n_fds < MAX_FDS; i++) memcpy(&fds[(*n_fds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
    if (n != 4 || (msg.msg_flags & MSG_CTRUNC)) _exit(0);
    *length = ((uint32_t)header[0] << 24) | ((uint32_t)header[1] << 16) | ((uint32_t)header[2] << 8) | header[3];
    if (*length == 0 || *length > MAX_CALL) _exit(0);
    char *body = malloc(*length + 1);
    if (!body || read_exact(sock, body, *length) != 0) _exit(0);
    body[*length] = '\0';
    close(sock);
    return body;
}

static int parse_call(char *body, uint32_t length, struct call *c) {
    char *items[MAX_ITEMS * 2 + 512];
    int n = 0;
    for (char *p = body; p < body + length && n < (int)(sizeof items / sizeof items[0]); p += strlen(p) + 1)
        items[n++] = p;
    memset(c, 0, sizeof *c);
    c->netns_index = -1;
    c->hook_uid = c->hook_gid = -1;
    for (int i = 0; i < n;) {
        const char *tag = items[i++];
        int need = !strcmp(tag, "K") || !strcmp(tag, "L") ? 3 : !strcmp(tag, "U") ? 2 : !strcmp(tag, "S") ? 0 : 1;
        if (i + need > n) return -1;
        if (!strcmp(tag, "K") && c->n_kept < 64) {
            c->kept_path[c->n_kept] = items[i];
            c->kept_real[c->n_kept] = items[i + 1];
            c->kept_writable[c->n_kept++] = items[i + 2][0] == '1';
        } else if (!strcmp(tag, "N")) {
            c->new_net = 1;
            c->netns_index = atoi(items[i]);
        } else if (!strcmp(tag, "U")) {
            c->hook_uid = strtoll(items[i], NULL, 10);
            c->hook_gid = strtoll(items[i + 1], NULL, 10);
        } else if (!strcmp(tag, "S")) {
            c->seccomp = 1;
        } else if (!strcmp(tag, "L") && c->n_rlimits < 32) {
            c->rl_resource[c->n_rlimits] = atoi(items[i]);
            c->rl_soft[c->n_rlimits] = strtoll(items[i + 1], NULL, 10);
            c->rl_hard[c->n_rlimits++] = strtoll(items[i + 2], NULL, 10);
        } else if (!strcmp(tag, "C")) {
            c->cwd = items[i];
        } else if (!strcmp(tag, "A") && c->argc < MAX_ITEMS - 1) {
            c->argv[c->argc++] = items[i];
        } else if (!strcmp(tag, "E") && c->envc < MAX_ITEMS - 1) {
            c->env[c->envc++] = items[i];
        } else {
            return -1;
        }
        i += need;
    }
    return c->argc > 0 && c->cwd ? 0 : -1;
}

static void make_dirs(const char *path) { /* os.makedirs(path, 0o755, exist_ok=True) in a cover, whatever the umask */
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return;
    mode_t mask = umask(0);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
    umask(mask);
}

static void make_mount_point(const char *path, int directory) {
    if (directory) {
        make_dirs(path);
        return;
    }
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        make_dirs(parent);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
}

/* sandbox_mounts.py bind_kept: the call's directories bound back at their paths through the covers, the writable
 * ones read-write, the others read-only; covers opened for a mount point are sealed again. */
static void bind_kept(struct call *c) {
    int opened[MAX_COVERS + 2] = {0};
    for (int i = 0; i < c->n_kept; i++) {
        const char *real = c->kept_real[i], *path = c->kept_path[i];
        int src = deepest_cover(real, 1), fd;
        if (src < 0) {
            fd = open(real, O_PATH | O_CLOEXEC);
        } else {
            const char *rel = real + strlen(covers[src].path);
            while (*rel == '/') rel++;
            fd = *rel ? openat(covers[src].fd, rel, O_PATH | O_CLOEXEC) : dup(covers[src].fd);
        }
        if (fd < 0) fail("[Errno %d] %s: '%s'", errno, strerror(errno), real);
        struct stat st;
        if (fstat(fd, &st) != 0) fail("[Errno %d] %s: '%s'", errno, strerror(errno), real);
        int cover = deepest_cover(path, 0);
        if (cover >= 0) {
            if (covers[cover].sealed && !opened[cover]) {
                if (seal(covers[cover].path, 0) != 0) fail("mount %s: %s", covers[cover].path, strerror(errno));
                opened[cover] = 1;
            }
            make_mount_point(path, S_ISDIR(st.st_mode));
        }
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", fd);
        if (mount(source, path, NULL, MS_BIND | MS_REC, NULL) != 0) fail("mount %s: %s", path, strerror(errno));
        close(fd);
        if (fast_view) { /* nosuid, nodev, read-only unless writable; its other flags as its source's */
            uint64_t ro = c->kept_writable[i] ? 0 : ATTR_RDONLY;
            if (set_attrs(path, ATTR_NOSUID | ATTR_NODEV | ro, ATTR_RDONLY & ~ro, 0) != 0)
                fail("mount %s: %s", path, strerror(errno));
        } else {
            unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | locked_at(real);
            if (mount(NULL, path, NULL, c->kept_writable[i] ? flags : flags | MS_RDONLY, NULL) != 0)
                fail("mount %s: %s", path, strerror(errno));
        }
    }
    for (int i = 0; i < n_covers; i++) {
        if (opened[i] && seal(covers[i].path, 1) != 0) fail("mount %s: %s", covers[i].path, strerror(errno));
        if (covers[i].fd >= 0) close(covers[i].fd);
        covers[i].fd = -1;
    }
}

/* sandbox_enter.py become: the hook's own host identity for good, no supplementary groups. */
static void become(long long uid, long long gid) {
    if (setgroups(0, NULL) != 0) fail("setgroups: %s", strerror(errno));
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) fail("setresgid: %s", strerror(errno));
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) fail("setresuid: %s", strerror(errno));
    uid_t r, e, sv;
    if (getresuid(&r, &e, &sv) != 0 || r != (uid_t)uid || e != (uid_t)uid || sv != (uid_t)uid)
        fail("could not drop to uid %lld", uid);
}

/* The seccomp filter (sandbox_seccomp.py compiles it in the spawner, which hands it over in argv as hex). */
static unsigned char *filter;
static size_t filter_len;

static int parse_filter(const char *hex) {
    size_t n = strlen(hex);
    if (n == 0) return 0;
    if (n % 16 != 0 || !(filter = malloc(n / 2))) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return -1;
        filter[i] = (unsigned char)byte;
    }
    filter_len = n / 2;
    return 0;
}

static void load_filter(void) {
    if (!filter_len) fail("no seccomp filter: the spawner passed none");
    struct bpf_prog prog = {(unsigned short)(filter_len / sizeof(struct bpf_insn8)), (struct bpf_insn8 *)filter};
    check(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0), "seccomp");
}

/* Whether this process has capabilities; if so its bounding set emptied (what an exec may gain: the capabilities it
 * has stay until run_call drops them). Done ahead of the call. */
static int capable;

static void empty_bounding_set(void) {
    char *status = read_all("/proc/self/status");
    char *capeff = status ? strstr(status, "\nCapEff:") : NULL;
    capable = capeff ? strtoull(capeff + 8, NULL, 16) != 0 : geteuid() == 0;
    free(status);
    if (capable)
        for (int cap = 0; cap < 64; cap++)
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno == EINVAL) break;
}

/* The call's part of the view (its directories bound back, network), then the hook's own limits, identity,
 * capabilities, seccomp filter, stdio and exec. */
static void run_call(struct call *c, int *fds, int n_fds) {
    if (n_fds < 4) _exit(0);
    call_stderr = fds[2];
    int exec_error;
    if (absent[0] && is_dir(absent)) fail("%s appeared after this sandbox was prepared: not covered", absent);
    bind_kept(c);
    if (c->new_net) {
        if (c->netns_index >= 0) { /* the plugin's own empty network namespace, kept by the spawner */
            if (c->netns_index >= n_fds) fail("setns(CLONE_NEWNET): no namespace passed");
            check(setns(fds[c->netns_index], CLONE_NEWNET), "setns(CLONE_NEWNET)");
            close(fds[c->netns_index]);
        } else {
            check(unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)");
        }
    }
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    /* stdio: every descriptor moved out of the way first, then the call's pipes as 0-2, the exec error pipe kept
     * (closed by the exec), nothing else */
    int moved[4];
    for (int i = 0; i < 4; i++)
        if ((moved[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 10)) < 0) fail("stdio: %s", strerror(errno));
    for (int i = 0; i < 3; i++)
        if (dup2(moved[i], i) < 0) fail("stdio: %s", strerror(errno));
    exec_error = moved[3];
    call_stderr = 2;
    close_all_but(3, exec_error, -1);
    /* the hook's own limits and identity, no capabilities now or after exec, no setuid gains, the seccomp filter,
     * then its directory */
    for (int i = 0; i < c->n_rlimits; i++) {
        struct rlimit rl = {(rlim_t)c->rl_soft[i], (rlim_t)c->rl_hard[i]};
        check(setrlimit(c->rl_resource[i], &rl), "setrlimit");
    }
    if (c->hook_uid >= 0) become(c->hook_uid, c->hook_gid);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (capable) { /* (the bounding set was emptied before the call: empty_bounding_set) */
        struct cap_header header = {CAP_VERSION_3, 0};
        struct cap_data data[2];
        memset(data, 0, sizeof data);
        check((int)syscall(SYS_capset, &header, data), "capset");
    }
    if (c->seccomp) load_filter();
    if (chdir(c->cwd) != 0) fail("[Errno %d] %s: '%s'", errno, strerror(errno), c->cwd);
    c->argv[c->argc] = NULL;
    c->env[c->envc] = NULL;
    execve(c->argv[0], c->argv, c->env);
    char code[16];
    int n = snprintf(code, sizeof code, "%d", errno);
    if (write(exec_error, code, n) < 0) { /* the worker is gone */ }
    _exit(127);
}

/* ---- ahead of the call: the spare ---------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], INIT_WIRE)) return init_main(argc, argv);
    if (argc < 11 || strcmp(argv[1], WIRE) != 0) return 2;
    pid_t parent = (pid_t)atoi(argv[2]);
    int sock = atoi(argv[3]), user_ns = argv[4][0] == '1';
    int kept_userns = argv[4][0] == '@' ? atoi(argv[4] + 1) : -1;
    int namespaces = atoi(argv[7]);
    absent = argv[8];
    int n_items = atoi(argv[10]);
    if (n_items < 0 || 11 + n_items > argc || parse_filter(argv[9]) != 0) return 2;
    char **steps = argv + 11;
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL); /* the spawner's ignored signals are inherited */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    close_all_but(3, sock, kept_userns);
    for (int i = 11 + n_items; i < argc; i++) { /* first: everything this process starts is counted */
        char path[4096];
        snprintf(path, sizeof path, "%s/cgroup.procs", argv[i]);
        if (write_file(path, "0") != 0) _exit(0);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != parent) _exit(137);
    if (kept_userns >= 0) { /* as its root: the hook drops to its plugin's identity from the mapped range */
        if (setns(kept_userns, CLONE_NEWUSER) != 0) _exit(0);
        close(kept_userns);
    }
    if (unshare(namespaces | (user_ns ? CLONE_NEWUSER : 0)) != 0) _exit(0);
    if (user_ns) {
        char map[64];
        if (write_file("/proc/self/setgroups", "deny") != 0) _exit(0);
        snprintf(map, sizeof map, "%s %s 1", argv[5], argv[5]);
        if (write_file("/proc/self/uid_map", map) != 0) _exit(0);
        snprintf(map, sizeof map, "%s %s 1", argv[6], argv[6]);
        if (write_file("/proc/self/gid_map", map) != 0) _exit(0);
    }
    if (prepare_view(steps, n_items) != 0) _exit(0);
    int status_pipe[2];
    if (pipe2(status_pipe, O_CLOEXEC) != 0) _exit(0);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    pid_t init_pid = fork();
    if (init_pid < 0) _exit(0);
    if (init_pid) {
        close(status_pipe[1]);
        keeper(init_pid, status_pipe[0], sock);
    }
    close(status_pipe[0]);
    become_init(status_pipe[1]);
    pid_t hook_pid = fork();
    if (hook_pid < 0) _exit(SETUP_FAILED);
    if (hook_pid) init_loop(hook_pid, status_pipe[1], sock);
    close(status_pipe[1]);
    empty_bounding_set();
    /* ready: the spawner sends the call only now (a spare that failed before this is replaced by a python child) */
    if (write(sock, READY, 1) != 1) _exit(0);
    int fds[MAX_FDS], n_fds;
    uint32_t length;
    char *body = await_call(sock, fds, &n_fds, &length);
    struct call *c = calloc(1, sizeof *c);
    if (!c) _exit(0);
    if (parse_call(body, length, c) != 0) {
        call_stderr = n_fds > 2 ? fds[2] : -1;
        fail("the call could not be read");
    }
    run_call(c, fds, n_fds);
    return 0;
}
