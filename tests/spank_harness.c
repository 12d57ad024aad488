/* spank_harness.c: calls deploy/slurm's SPANK plugin as slurmstepd does, without Slurm,
 * so that tests/test_spank_privileges.py can choose what the caller leaves the hook.
 *
 *   spank_harness PLUGIN PUMP_RUN MODE UID GID GROUP,GROUP,...   (as root)
 *
 * MODE slurmstepd: the job's groups and effective ids, real and saved uid 0 (what Slurm
 * 22.05's _drop_privileges leaves before spank_user); MODE root: root's ids and groups
 * 0, 4 and 42 left in place; MODE daemon: every id of uid and gid 1 (no root to drop
 * with: each of the plugin's steps must be found failing). A descriptor without close-on-exec is left open at 57. The
 * harness is Slurm's side of the SPANK API (the plugin's undefined symbols resolve to it:
 * built with -rdynamic): the job's items, `--pump=launch` given, one task whose own
 * LD_PRELOAD is /task.so; it prints each variable the plugin sets in the task
 * ("task NAME=VALUE") and each line the plugin logs ("info: ...", "error: ..."). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

static struct spank_option *option;
static uid_t job_uid;
static gid_t job_gid, job_groups[16];
static int job_ngroups;
static char *job_env[] = {"PATH=/usr/bin:/bin", "HOME=/", "PUMP_POLICY=launch", "SLURM_JOB_ID=1",
                          "PYTHONPATH=/nonexistent-job-path", "LD_PRELOAD=/nonexistent-job.so",
                          "JOB_SECRET=not for pump-run", NULL};

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
    (void)sp;
    option = opt;
    return ESPANK_SUCCESS;
}

int spank_remote(spank_t sp)
{
    (void)sp;
    return 1;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
    (void)sp;
    va_list ap;
    spank_err_t result = ESPANK_SUCCESS;
    va_start(ap, item);
    switch (item) {
    case S_JOB_ENV:
        *va_arg(ap, char ***) = job_env;
        break;
    case S_JOB_ID:
        *va_arg(ap, uint32_t *) = 42;
        break;
    case S_JOB_STEPID:
    case S_JOB_LOCAL_TASK_COUNT:
        *va_arg(ap, uint32_t *) = item == S_JOB_STEPID ? 0 : 1;
        break;
    case S_JOB_UID:
        *va_arg(ap, uid_t *) = job_uid;
        break;
    case S_JOB_GID:
        *va_arg(ap, gid_t *) = job_gid;
        break;
    case S_JOB_SUPPLEMENTARY_GIDS:
        *va_arg(ap, gid_t **) = job_groups;
        *va_arg(ap, int *) = job_ngroups;
        break;
    default:
        result = ESPANK_BAD_ARG;
    }
    va_end(ap);
    return result;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
    (void)sp;
    if (strcmp(var, "LD_PRELOAD") != 0)
        return ESPANK_ENV_NOEXIST;
    snprintf(buf, (size_t)len, "/task.so");
    return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
    (void)sp;
    (void)overwrite;
    printf("task %s=%s\n", var, val);
    return ESPANK_SUCCESS;
}

static void say(const char *kind, const char *format, va_list ap)
{
    printf("%s: ", kind);
    vprintf(format, ap);
    printf("\n");
    fflush(stdout);
}

void slurm_info(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    say("info", format, ap);
    va_end(ap);
}

void slurm_error(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    say("error", format, ap);
    va_end(ap);
}

void slurm_spank_log(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    say("log", format, ap);
    va_end(ap);
}

static spank_f *hook(void *plugin, const char *name)
{
    spank_f *f = (spank_f *)dlsym(plugin, name);
    if (f == NULL) {
        fprintf(stderr, "spank_harness: no %s in the plugin\n", name);
        exit(2);
    }
    return f;
}

int main(int argc, char **argv)
{
    if (argc != 7 || (strcmp(argv[3], "slurmstepd") != 0 && strcmp(argv[3], "root") != 0 &&
                      strcmp(argv[3], "daemon") != 0)) {
        fprintf(stderr, "usage: spank_harness PLUGIN PUMP_RUN slurmstepd|root|daemon UID GID GROUP,...\n");
        return 2;
    }
    job_uid = (uid_t)atoi(argv[4]);
    job_gid = (gid_t)atoi(argv[5]);
    for (char *g = strtok(argv[6], ","); g != NULL && job_ngroups < 16; g = strtok(NULL, ","))
        job_groups[job_ngroups++] = (gid_t)atoi(g);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int secret = open("/etc/shadow", O_RDONLY); /* no O_CLOEXEC: what a careless caller leaves */
    if (secret < 0 || dup2(secret, 57) != 57) {
        perror("spank_harness: a descriptor to leave open");
        return 2;
    }
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (plugin == NULL) {
        fprintf(stderr, "spank_harness: %s\n", dlerror());
        return 2;
    }
    if (strcmp(argv[3], "slurmstepd") == 0) {
        if (setgroups((size_t)job_ngroups, job_groups) != 0 || setegid(job_gid) != 0 || seteuid(job_uid) != 0) {
            perror("spank_harness: taking the job's groups and effective ids");
            return 2;
        }
    } else if (strcmp(argv[3], "daemon") == 0) {
        gid_t daemon[] = {1};
        if (setgroups(1, daemon) != 0 || setresgid(1, 1, 1) != 0 || setresuid(1, 1, 1) != 0) {
            perror("spank_harness: becoming uid 1");
            return 2;
        }
    } else {
        gid_t roots[] = {0, 4, 42};
        if (setgroups(3, roots) != 0) {
            perror("spank_harness: setgroups");
            return 2;
        }
    }
    char pump_run[4200];
    snprintf(pump_run, sizeof pump_run, "pump_run=%s", argv[2]);
    char *args[] = {pump_run, NULL};
    spank_t sp = (spank_t)&job_uid; /* opaque to the plugin */
    if (hook(plugin, "slurm_spank_init")(sp, 1, args) != 0 || option == NULL || option->cb(option->val, "launch", 1) != 0)
        return 3;
    hook(plugin, "slurm_spank_user_init")(sp, 0, NULL);
    hook(plugin, "slurm_spank_task_init")(sp, 0, NULL);
    hook(plugin, "slurm_spank_task_exit")(sp, 0, NULL);
    hook(plugin, "slurm_spank_exit")(sp, 0, NULL);
    return 0;
}
