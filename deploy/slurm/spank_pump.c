/* spank_pump.c: why it exists: Slurm's SPANK plugin that gives a job step's tasks pump
 * (`srun --pump[=POLICY]`, `#SBATCH --pump`) with no change to the user's command.
 *
 * On each node of the step, the plugin starts one `pump-run --serve-env` as the job's
 * user (slurm_spank_user_init): it registers the step's pump job with the node's pumpd,
 * as `srun pump-run` would (its group is the job step), and writes the variables
 * pump-run gives a command: libpump in LD_PRELOAD, the PUMP_* settings, the job to join.
 * Each task gets those variables (slurm_spank_task_init); when the node's last task has
 * ended, the plugin closes that pump-run's stdin and it ends the job, its summary line
 * going to slurmd's log. Why not make each task exec through pump-run: SPANK forbids
 * changing a task's argv, and exec'ing from the plugin would skip Slurm's TaskProlog and
 * the user's limits, which Slurm applies after this hook.
 *
 * A pump-run that fails leaves the tasks running without pump, said on the step's stderr
 * and in slurmd's log: pump never stops a job.
 *
 * Root: the hook runs in slurmstepd with root's real and saved uid (and, as Slurm 22.05
 * calls it, the job's groups and effective ids; another caller may leave root's). The
 * plugin relies on none of it: pump-run's child takes the job's groups (asked of Slurm
 * before fork), gid and uid for good, checks that root cannot be regained, sets
 * no_new_privs and closes every inherited descriptor; pump_run (and the Python that runs
 * it) must be root's and writable by root alone, every directory above it too; its
 * environment holds only what pump-run reads, and Python starts isolated (-I), so the
 * job's PYTHONPATH or LD_PRELOAD never runs in it.
 *
 * plugstack.conf:  optional /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_pump.so [pump_run=PATH]
 * (PATH: the absolute path of pump-run; /usr/local/bin/pump-run when not given). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pump, 1);

#define SERVE_TIMEOUT_MS 30000 /* for pump-run to say its variables, and to end its job */
#define GIVEN_MAX (64 * 1024)  /* the variables' bytes (a few paths and settings) */
#define STEP_ID_MAX 0xfffffff0u /* above: Slurm's special steps (batch, extern, ...) */

static int requested;           /* --pump was given */
static char policy[16];         /* its POLICY; "" for pump-run's default */
static char pump_run[1024] = "/usr/local/bin/pump-run";
static pid_t server = -1;       /* this node's pump-run --serve-env */
static int server_stdin = -1, server_stderr = -1;
static char given[GIVEN_MAX];   /* its variables: NAME=VALUE\0 ... \0 */
static size_t given_len;
static uint32_t tasks_left;     /* tasks of the step on this node still running */

static int take_option(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (optarg == NULL)
        optarg = ""; /* srun's --pump; sbatch forwards it to the batch step as "" */
    if (*optarg != '\0' && strcmp(optarg, "off") != 0 && strcmp(optarg, "launch") != 0 &&
        strcmp(optarg, "lookahead") != 0) {
        slurm_error("pump: --pump=%s: bad policy; allowed: off, launch, lookahead", optarg);
        return -1;
    }
    requested = 1;
    snprintf(policy, sizeof policy, "%s", optarg);
    return 0;
}

static struct spank_option pump_option = {
    "pump", "[POLICY]",
    "run each task under pump, the Unified Memory prefetcher, in the node's pumpd "
    "(as pump-run does); POLICY: off, launch (the default) or lookahead",
    2, 0, take_option,
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "pump_run=", 9) == 0 && av[i][9] == '/' && strlen(av[i] + 9) < sizeof pump_run) {
            snprintf(pump_run, sizeof pump_run, "%s", av[i] + 9);
        } else {
            slurm_error("pump: plugstack.conf argument %s: allowed: pump_run=ABSOLUTE_PATH", av[i]);
            return -1;
        }
    }
    return spank_option_register(sp, &pump_option) == ESPANK_SUCCESS ? 0 : -1;
}

/* What pump-run reads of the job's environment (its settings, where the user's pumpd
 * lives, the launcher it runs under, PyTorch's allocator settings it merges into):
 * nothing else reaches it. LD_PRELOAD and PYTHONPATH, which pump-run prepends to, are
 * merged into each task's own by slurm_spank_task_init instead. */
static const char *const PASSED[] = {"PATH=", "HOME=", "USER=", "LOGNAME=", "LANG=", "TZ=", "TMPDIR=",
                                     "XDG_RUNTIME_DIR=", "XDG_CONFIG_HOME=", "LC_", "PUMP_", "SLURM_",
                                     "PYTORCH_", NULL};
static const char *const PREPENDED[] = {"LD_PRELOAD", "PYTHONPATH", NULL};

static int passed(const char *entry)
{
    if (strncmp(entry, "SLURM_JOB_ID=", 13) == 0 || strncmp(entry, "SLURM_STEP_ID=", 14) == 0)
        return 0; /* set below from Slurm's own items */
    for (const char *const *p = PASSED; *p != NULL; p++)
        if (strncmp(entry, *p, strlen(*p)) == 0)
            return 1;
    return 0;
}

/* pump-run's environment: PASSED of the job's, with the job step that names its group
 * (srun passes SLURM_STEP_ID to the tasks only); a batch script's step has none ("batch"). */
static char **server_env(spank_t sp)
{
    char **job_env = NULL;
    uint32_t job = 0, step = 0;
    if (spank_get_item(sp, S_JOB_ENV, &job_env) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_ID, &job) !=
        ESPANK_SUCCESS || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
        return NULL;
    size_t n = 0;
    while (job_env[n] != NULL)
        n++;
    char **env = calloc(n + 3, sizeof *env);
    static char job_var[32], step_var[32];
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (passed(job_env[i]))
            env[k++] = job_env[i];
    snprintf(job_var, sizeof job_var, "SLURM_JOB_ID=%u", job);
    env[k++] = job_var;
    if (step < STEP_ID_MAX) {
        snprintf(step_var, sizeof step_var, "SLURM_STEP_ID=%u", step);
        env[k++] = step_var;
    }
    return env;
}

/* "" if path and every directory above it are root's and writable by root alone (a
 * sticky directory's other entries aside: others cannot replace root's there), else why
 * not: what root execs must be nobody else's to change. */
static const char *root_only(const char *path, char *why, size_t size)
{
    char real[PATH_MAX];
    if (realpath(path, real) == NULL) {
        snprintf(why, size, "%s: %s", path, strerror(errno));
        return why;
    }
    for (char *end = real + strlen(real);; ) {
        struct stat st;
        if (stat(real, &st) != 0) {
            snprintf(why, size, "%s: %s", real, strerror(errno));
            return why;
        }
        int shared_dir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX);
        if (st.st_uid != 0 || (!shared_dir && (st.st_mode & (S_IWGRP | S_IWOTH)))) {
            snprintf(why, size, "%s is %s (uid %u, mode %04o); it must be root's and writable by root alone",
                     real, S_ISDIR(st.st_mode) ? "a directory above pump_run" : "pump_run's",
                     (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
            return why;
        }
        if (end == real + 1 || (end = strrchr(real, '/')) == NULL)
            return "";
        *(end == real ? end + 1 : end) = '\0'; /* the parent; "/" last */
        if (end == real)
            end++;
    }
}

/* The interpreter pump_run's "#!" line names, where it is a Python without arguments
 * (pip's console scripts): run it as INTERPRETER -I pump_run; "" otherwise. */
static void python_of(const char *path, char *interpreter, size_t size)
{
    char line[PATH_MAX + 3] = "";
    interpreter[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, line, sizeof line - 1);
    close(fd);
    if (n < 3 || strncmp(line, "#!/", 3) != 0)
        return;
    line[n] = '\0';
    size_t len = strcspn(line + 2, " \t\n");
    const char *base = memrchr(line + 2, '/', len);
    if (line[2 + len] != '\n' || len >= size || strncmp(base + 1, "python", 6) != 0)
        return;
    memcpy(interpreter, line + 2, len);
    interpreter[len] = '\0';
}

/* In the forked child, with its stderr on the pipe to the plugin: what went wrong, then
 * exit 126. */
static void refuse(const char *what)
{
    static const char prefix[] = "spank_pump: cannot run pump-run as the job's user alone: ";
    if (write(2, prefix, sizeof prefix - 1) < 0 || write(2, what, strlen(what)) < 0 || write(2, "\n", 1) < 0)
        _exit(126);
    _exit(126);
}

static void close_inherited(void)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3u, ~0u, 0u) == 0)
        return;
#endif
    struct rlimit limit;
    int most = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < (1u << 20) ? (int)limit.rlim_cur : 1 << 20;
    for (int fd = 3; fd < most; fd++)
        close(fd);
}

static int has(const gid_t *list, int n, gid_t g)
{
    for (int i = 0; i < n; i++)
        if (list[i] == g)
            return 1;
    return 0;
}

/* The job's user for good, whatever ids and groups the caller left (root's, or the job's
 * groups and effective ids with root's real and saved uid, as slurmstepd), each step
 * checked; then no_new_privs and no descriptor but the pipes; then pump-run.
 * Async-signal-safe calls only (slurmstepd has threads). */
static void exec_server(char **argv, char **env, uid_t uid, gid_t gid, const gid_t *groups, int ngroups,
                        const int in[2], const int out[2], const int err[2])
{
    static gid_t now[NGROUPS_MAX + 1];
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0)
        _exit(126);
    close_inherited();
    if (getuid() == 0 && geteuid() != 0 && seteuid(0) != 0)
        refuse("seteuid(0), to drop root's groups, failed");
    if (setgroups((size_t)ngroups, groups) != 0)
        refuse("setgroups(the job's groups) failed");
    if (setresgid(gid, gid, gid) != 0)
        refuse("setresgid(the job's gid) failed");
    if (setresuid(uid, uid, uid) != 0)
        refuse("setresuid(the job's uid) failed");
    if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0))
        refuse("root could be regained after setresuid");
    int n = getgroups(NGROUPS_MAX + 1, now);
    int same = n >= 0;
    for (int i = 0; same && i < n; i++)
        same = has(groups, ngroups, now[i]);
    for (int i = 0; same && i < ngroups; i++)
        same = has(now, n, groups[i]);
    if (!same)
        refuse("its groups are not the job's after setgroups");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        refuse("prctl(PR_SET_NO_NEW_PRIVS) failed");
    execve(argv[0], argv, env);
    _exit(127);
}

/* Slurm's log gets what pump-run said on stderr (its summary, or why it failed). */
static void log_server_stderr(void)
{
    char buf[4096];
    ssize_t n;
    size_t used = 0;
    while (used < sizeof buf - 1 && (n = read(server_stderr, buf + used, sizeof buf - 1 - used)) > 0)
        used += (size_t)n;
    buf[used] = '\0';
    for (char *line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n"))
        slurm_info("pump: %s", line);
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The tasks are done (or never got the variables): pump-run ends the job and exits. */
static void release_server(void)
{
    if (server < 0)
        return;
    close(server_stdin);
    long long deadline = now_ms() + SERVE_TIMEOUT_MS;
    int status;
    pid_t r;
    while ((r = waitpid(server, &status, WNOHANG)) == 0 && now_ms() < deadline)
        usleep(20000);
    if (r == 0) {
        slurm_error("pump: pump-run (pid %d) did not end the job within %d s; killed", (int)server,
                    SERVE_TIMEOUT_MS / 1000);
        kill(server, SIGKILL);
        waitpid(server, &status, 0);
    } else if (r == server && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        slurm_info("pump: %s --serve-env ended with %s %d%s", pump_run, WIFEXITED(status) ? "status" : "signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                   WIFEXITED(status) && WEXITSTATUS(status) >= 126 ? " (it could not be run as the job's user)" : "");
    }
    /* r < 0 (ECHILD): slurmstepd, which waits for any child, reaped it: it has ended. */
    fcntl(server_stderr, F_SETFL, O_NONBLOCK);
    log_server_stderr();
    close(server_stderr);
    server = -1;
}

/* pump-run's variables, up to the NUL byte that ends them; 0 on success. */
static int read_given(int fd)
{
    long long deadline = now_ms() + SERVE_TIMEOUT_MS;
    given_len = 0;
    while (now_ms() < deadline && given_len < sizeof given) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - now_ms())) <= 0)
            continue;
        ssize_t n = read(fd, given + given_len, sizeof given - given_len);
        if (n <= 0)
            return -1; /* pump-run exited without saying them */
        given_len += (size_t)n;
        if (given[given_len - 1] == '\0' && (given_len == 1 || given[given_len - 2] == '\0'))
            return 0;
    }
    return -1;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!requested || !spank_remote(sp))
        return 0;
    uid_t uid;
    gid_t gid, *groups = NULL;
    int ngroups = -1;
    char **env = server_env(sp);
    if (env == NULL || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &groups, &ngroups) != ESPANK_SUCCESS || ngroups < 0 ||
        ngroups > NGROUPS_MAX || (ngroups > 0 && groups == NULL) ||
        spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &tasks_left) != ESPANK_SUCCESS) {
        slurm_error("pump: the job's environment, ids or groups are not available; the tasks run without pump");
        free(env);
        return 0;
    }
    char why[PATH_MAX + 128], python[PATH_MAX];
    python_of(pump_run, python, sizeof python);
    if (*root_only(pump_run, why, sizeof why) || (python[0] && *root_only(python, why, sizeof why))) {
        slurm_error("pump: %s; the tasks run without pump", why);
        slurm_spank_log("pump: %s is not root's alone (see slurmd's log); the tasks run without pump", pump_run);
        free(env);
        return 0;
    }
    char policy_flag[32];
    snprintf(policy_flag, sizeof policy_flag, "--policy=%s", policy);
    char *flag = policy[0] ? policy_flag : NULL;
    char *direct[] = {pump_run, "--serve-env", flag, NULL};
    char *isolated[] = {python, "-I", pump_run, "--serve-env", flag, NULL};
    char **argv = python[0] ? isolated : direct;
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0)
        goto no_pipes;
    if (pipe2(out, O_CLOEXEC) != 0)
        goto no_out;
    if (pipe2(err, O_CLOEXEC) != 0)
        goto no_err;
    server = fork();
    if (server == 0)
        exec_server(argv, env, uid, gid, groups, ngroups, in, out, err);
    free(env);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    server_stdin = in[1];
    server_stderr = err[0];
    if (server < 0) {
        slurm_error("pump: cannot start %s: %m; the tasks run without pump", pump_run);
        close(out[0]);
        close(server_stdin);
        close(server_stderr);
        return 0;
    }
    int failed = read_given(out[0]);
    close(out[0]);
    if (failed) {
        given_len = 0;
        slurm_error("pump: %s --serve-env gave no environment; the tasks run without pump", pump_run);
        slurm_spank_log("pump: %s --serve-env failed (see slurmd's log); the tasks run without pump", pump_run);
        release_server();
    }
    return 0;
no_err:
    close(out[0]);
    close(out[1]);
no_out:
    close(in[0]);
    close(in[1]);
no_pipes:
    free(env);
    slurm_error("pump: cannot make pipes: %m; the tasks run without pump");
    return 0;
}

/* A variable of PREPENDED: pump-run's value first, then the task's own (pump-run never
 * saw it: see PASSED); 0 on success. */
static int prepend(spank_t sp, const char *name, const char *value)
{
    static char own[GIVEN_MAX], both[2 * GIVEN_MAX + 2];
    if (spank_getenv(sp, name, own, sizeof own) != ESPANK_SUCCESS || own[0] == '\0')
        return spank_setenv(sp, name, value, 1) == ESPANK_SUCCESS ? 0 : -1;
    snprintf(both, sizeof both, "%s:%s", value, own);
    return spank_setenv(sp, name, both, 1) == ESPANK_SUCCESS ? 0 : -1;
}

static int prepended(const char *name)
{
    for (const char *const *p = PREPENDED; *p != NULL; p++)
        if (strcmp(name, *p) == 0)
            return 1;
    return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    for (size_t at = 0; at + 1 < given_len; at += strlen(given + at) + 1) {
        char *entry = given + at, *eq = strchr(entry, '=');
        if (eq == NULL)
            continue;
        *eq = '\0'; /* this task's copy of the plugin's memory: slurmstepd forked it */
        int failed = prepended(entry) ? prepend(sp, entry, eq + 1)
                                      : spank_setenv(sp, entry, eq + 1, 1) != ESPANK_SUCCESS;
        if (failed)
            slurm_error("pump: cannot set %s in the task's environment", entry);
        *eq = '=';
    }
    return 0;
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (server >= 0 && tasks_left > 0 && --tasks_left == 0)
        release_server();
    return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (spank_remote(sp))
        release_server(); /* tasks that never started, or did not all report their end */
    return 0;
}
